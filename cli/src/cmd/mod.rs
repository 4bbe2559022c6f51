//! The binary's subcommands, one file each, and the flags and plumbing they share (`common`).

#[cfg(feature = "cluster")]
pub mod cluster;
pub mod common;
pub mod ops_flags;
pub mod sample_controller;
pub mod shard_bounds;
pub mod trace;
pub mod vm_controller;
