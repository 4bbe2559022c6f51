//! What an operator scrapes and probes: Prometheus metrics on `/metrics` (and the followed keys'
//! journeys on `/debug/trace`), liveness on `/healthz`, readiness on `/readyz`.
//!
//! Counterparts: controller-runtime's `pkg/metrics/server` (HTTPS, behind
//! `pkg/metrics/filters.WithAuthenticationAndAuthorization`, certificates from
//! `pkg/certwatcher`) and its manager's health probe server; component-base's
//! `metrics/legacyregistry` and k8s.io/apiserver's `pkg/server/healthz`. The flags that start
//! these servers (kubebuilder scaffold's `--metrics-bind-address` and the rest) are the
//! command line's: `kubeloop_cli::OpsArgs` in the package `kubeloop-cli` (`cli/`).
//!
//! | File | Holds | Counterpart |
//! |---|---|---|
//! | `server.rs` | [`OpsServer`]: listener, connection cap, TLS, hyper | `pkg/metrics/server` |
//! | `limits.rs` | [`ServerLimits`], accept backoff, idle tracking | `net/http.Server` fields |
//! | `routes.rs` | [`ServeConfig`], [`Check`] (leader election's included), the handlers | apiserver `healthz`, `legacyregistry` |
//! | `journey.rs` | the journey page (`journey/`), [`JourneySource`], [`LocalTrace`] | none |
//! | `filters.rs` | [`Authorizer`]: TokenReview + SubjectAccessReview | `pkg/metrics/filters` |
//! | `decision_cache.rs` | [`DecisionCache`] | apiserver's token and webhook authorizer caches |
//! | `tls.rs` | [`CertWatcher`]: self-signed or files, reloaded | `pkg/certwatcher` |

mod decision_cache;
mod filters;
mod journey;
mod limits;
mod routes;
mod server;
mod tls;

pub use decision_cache::DecisionCache;
pub use filters::{AuthConfig, Authorizer, Refusal};
pub use journey::{
    JourneyData, JourneyFuture, JourneyQuery, JourneyRefusal, JourneySource, LocalTrace, MAX_KEYS,
    MAX_QUEUE_SERIES, QueueDepth, page as journey_page,
};
pub use limits::{AcceptBackoff, ServerLimits};
pub use routes::{Check, CheckFn, ServeConfig};
pub use server::{OpsServer, OpsServerError};
pub use tls::{CertWatcher, DEFAULT_CERT_POLL_INTERVAL, TlsError};
