//! The QEMU driver (`--vm-driver qemu`): each VirtualMachine is one `qemu-system-x86_64`
//! process booting the Debian cloud kernel and an initramfs built from busybox-static
//! (hack/setup-qemu), the VM that controller101's author planned (a "KVM driver") and the
//! seeds left open.
//!
//! - Size: `-smp` = the spec's cpu in whole vCPUs, millicores rounded up (`500m` -> 1,
//!   `1500m` -> 2); `-m` = the spec's memory in MiB, rounded up (QEMU sizes RAM in whole
//!   MiB here; `4G` = 4,000,000,000 bytes -> 3815 MiB). The status reports the spec's values,
//!   so a VM is not resized for the rounding.
//! - Accelerator: KVM if a probe guest boots under it (opening `/dev/kvm` is not proof:
//!   under some nested hypervisors KVM guests hang), else TCG; `--qemu-accel` overrides. The
//!   choice is in each VM's `vm.json` and QMP's `query-kvm`.
//! - Lifetime: QEMU runs detached under a monitor shell and outlives the controller; the
//!   driver finds, adopts (by uid only), inspects and deletes VMs through their state
//!   directories (`state.rs`) and QMP (`qmp.rs`), never by scanning
//!   process names.
//! - Phases: a create launches QEMU and waits (up to `boot_timeout`) for the guest's
//!   readiness line on the serial console, so the reconcile's phase stays `Creating` until the
//!   guest is up, then `Active` with `server.state` from QMP `query-status`. A QEMU alive but
//!   not yet ready reports state `booting`, not running: the next pass adopts it and waits
//!   again. This fits the phase machine of `reconcile.rs`, which writes `Creating` before the
//!   create and `Active` from its result.
//! - A QEMU that ended (guest poweroff, crash, SIGKILL) is an `exited` server with its exit
//!   code and time from the monitor, as a stopped container is; the reconcile boots it again
//!   (a new QEMU in the same directory; the previous console log kept as `serial.log.1`).
//! - Delete: ACPI power button (QMP `system_powerdown`; the guest's acpid powers off), QMP
//!   `quit` after `powerdown_timeout`, SIGKILL after `quit_timeout`, then the directory goes.
//!   Deleting what is not there succeeds.
//! - Usage: see `usage.rs` (CPU% 100 = one host core, over the QEMU process's CPU time between
//!   refreshes; MEMORY% = QEMU's RSS over the guest's memory).

// libc for what std does not wrap (each call with its SAFETY comment): the effective uid,
// signals to QEMU's process group, the state lock's owner, the clock tick, setsid in the child.
#[allow(unsafe_code)]
mod driver;
#[allow(unsafe_code)]
mod launch;
mod qmp;
#[allow(unsafe_code)]
mod state;
#[allow(unsafe_code)]
mod usage;

pub use driver::{
    Accel, MAX_VCPUS, MIN_MEMORY_MIB, QemuDriver, QemuDriverConfig, default_cache_dir,
    default_state_dir,
};
