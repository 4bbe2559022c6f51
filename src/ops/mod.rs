//! What an operator scrapes and probes: Prometheus metrics on `/metrics`, liveness on
//! `/healthz`, readiness on `/readyz`.
//!
//! Counterparts: component-base's `metrics/legacyregistry` (one registry a process exposes) and
//! k8s.io/apiserver's `pkg/server/healthz` (named checks, `?verbose` lists each one).
//! controller-runtime serves the same paths on `--metrics-bind-address` / `--health-probe-bind-address`;
//! [`OpsArgs`] is those two flags for any subcommand (`#[command(flatten)]`).

#[cfg(feature = "cli")]
mod flags;
mod server;

#[cfg(feature = "cli")]
pub use flags::{OpsArgs, OpsFlagError, Serving};
pub use server::{Check, CheckFn, OpsServer, OpsServerError, ServeConfig};
