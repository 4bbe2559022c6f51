//! kubeloop: client-go's controller machinery rebuilt in Rust, from scratch, on raw watch streams.
//!
//! # The map
//!
//! The modules follow client-go so that a reader who knows one finds their way in the other.
//! Data flows down the table: a watch stream fills the cache, the cache's handlers fill a
//! workqueue, workers reconcile what it hands out.
//!
//! | kubeloop | client-go / Kubernetes | feature |
//! |---|---|---|
//! | [`cache`]: reflector, FIFOs, indexer, listers, shared informers | `tools/cache` | always |
//! | [`client`]: writes of whole objects (create, replace, replace_status), in protobuf for the built-in kinds | client-go `gentype` (typed clients' `PrefersProtobuf`), `rest` content negotiation | always |
//! | [`watch`]: a watch resumed after cuts (`RetryWatcher`), waiting for a condition on a cache (`until_with_sync`) | `tools/watch` | always |
//! | [`workqueue`]: dedup, delaying and rate-limiting queues | `util/workqueue` | always |
//! | [`leaderelection`]: Lease-based leader election | `tools/leaderelection` | always |
//! | [`record`]: Events | `tools/record` | always |
//! | [`backoff`]: backoff and jitter, for every wait between attempts | apimachinery `pkg/util/wait` (`Backoff`, `Jitter`) | always |
//! | [`protobuf`]: Kubernetes protobuf decoded into k8s-openapi's types | apimachinery `runtime/serializer/protobuf`, the types' `generated.pb.go` | always |
//! | [`trace`]: one object's journey, stage by stage | (none) | always |
//! | [`testing`]: in-memory sources and locks for unit tests | `tools/cache/testing`, fake clientsets | always |
//! | [`runtime`]: the controller runtime: typed keys, builder, workers, leadership terms, sharding, conflict retries | controller-runtime (`pkg/reconcile`, `pkg/internal/controller`, `pkg/builder`), kube-runtime's `Controller`, client-go `util/retry` | `runtime` |
//! | [`ops`](ops/index.html): `/metrics`, `/debug/trace` (HTTPS behind TokenReview + SubjectAccessReview), `/healthz`, `/readyz` | controller-runtime `pkg/metrics/server` + `filters`, apiserver healthz | `ops` |
//! | [`controller`](controller/index.html): the sample and VM controllers, built on [`runtime`] | sample-controller, controller101 | `sample-controller`, `vm-controller` |
//!
//! kube-client does the HTTP, kubeconfig and authentication; everything that turns a watch
//! stream into work for a controller is in this crate. The test harness (a real local control
//! plane, fault proxies, perturbation testing) is the crate `kubeloop-testenv`, a
//! dev-dependency as controller-runtime's envtest is; the command line is `kubeloop-cli`. The
//! repository's README.md is the front page (a controller on the runtime, what is inside, the
//! headline figures); `docs/README.md` lists a guided tour through these layers, one runnable
//! chapter each, and the reference chapters (running and deploying the controllers, metrics,
//! sharding, the harness, the features); `benches/README.md` has every benchmark.
//!
//! # Features
//!
//! `default = ["runtime"]`: the machinery (cache, workqueue, leader election, events, trace,
//! testing) and the controller runtime, with no HTTP server, no container-engine client
//! (bollard), no harness. `default-features = false` leaves the runtime out. Add `ops` for the
//! metrics/health server, `sample-controller` and `vm-controller` (or `controllers` for both)
//! for the two controllers. `preserve-order` turns on
//! serde_json's `preserve_order`, which cuts a typed cache's memory by about 16% (managedFields'
//! JSON maps) but changes `serde_json::Map` for the whole program, so it is off unless the
//! program asks. The library has no command line and never sets a global allocator: the
//! `kubeloop` binary (which turns `preserve-order` on) is the package `kubeloop-cli` (`cli/`).
//!
//! # Kubernetes version
//!
//! kubeloop enables no version feature of k8s-openapi, as k8s-openapi asks of libraries: the
//! program that depends on kubeloop picks the Kubernetes version it talks to, by depending on
//! k8s-openapi itself with one version feature (the `kubeloop` binary, the tests and the
//! examples pick `v1_36`):
//!
//! ```toml
//! [dependencies]
//! kubeloop = "0.1"
//! k8s-openapi = { version = "0.29", features = ["v1_36"] }
//! ```
//!
//! # One example per layer
//!
//! The cache: an informer, a handler, a lister.
//!
//! ```no_run
//! use k8s_openapi::api::core::v1::ConfigMap;
//! use kubeloop::cache::{FactoryOptions, LabelSelector, ResourceEventHandlerFuncs, SharedInformerFactory};
//!
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let factory = SharedInformerFactory::new(client, FactoryOptions::default());
//! let informer = factory.informer::<ConfigMap>();
//! informer.add_event_handler(
//!     ResourceEventHandlerFuncs::new().on_add(|cm: &std::sync::Arc<ConfigMap>, _| {
//!         println!("added {:?}", cm.metadata.name)
//!     }),
//! )?;
//! factory.start();
//! factory.wait_for_cache_sync().await;
//! let all = informer.lister().namespaced("default").list(&LabelSelector::everything());
//! println!("{} ConfigMaps in default", all.len());
//! # Ok(()) }
//! ```
//!
//! The workqueue: a key added twice before it is taken is handed out once.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! use kubeloop::workqueue::{RateLimitingQueue, default_controller_rate_limiter};
//!
//! let queue = RateLimitingQueue::new(default_controller_rate_limiter());
//! queue.add("default/web".to_string());
//! queue.add("default/web".to_string());
//! assert_eq!(queue.len(), 1);
//! let key = queue.get().await.unwrap();
//! // ...reconcile fails: back after the limiter's delay (5 ms, then 10 ms, ...)
//! queue.add_rate_limited(key.clone());
//! queue.done(&key);
//! assert_eq!(queue.num_requeues(&key), 1);
//! # }
//! ```
//!
//! Leader election: run work only while holding a Lease.
//!
//! ```no_run
//! use kubeloop::leaderelection::{LeaderCallbacks, LeaderElectionConfig, LeaderElector, LeaseLock};
//!
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let lock = LeaseLock::new(client, "default", "my-controller", "replica-a");
//! let elector = LeaderElector::new(LeaderElectionConfig::default(), lock)?;
//! let callbacks = LeaderCallbacks::new(
//!     |ctx| async move { ctx.cancelled().await },
//!     || println!("stopped leading"),
//! );
//! elector.run(callbacks, tokio_util::sync::CancellationToken::new()).await;
//! # Ok(()) }
//! ```
//!
//! A controller on the runtime (feature `controllers`): informers, a queue, workers, your
//! reconcile.
//!
//! ```no_run
//! # #[cfg(feature = "runtime")]
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::apps::v1::Deployment;
//! use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
//! use kubeloop::runtime::{Action, Controller, NotEntitled, ObjectKey, ReconcileContext, default_error_policy};
//!
//! let factory = SharedInformerFactory::new(client, FactoryOptions::default());
//! Controller::new("watcher", factory.informer::<Deployment>())
//!     .run(
//!         |key: ObjectKey, _ctx: ReconcileContext| async move {
//!             println!("reconcile {key}");
//!             Ok::<_, NotEntitled>(Action::Done)
//!         },
//!         default_error_policy,
//!         tokio_util::sync::CancellationToken::new(),
//!     )
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! The trace: follow one key through every stage it passes (here only the workqueue's).
//!
//! ```
//! use kubeloop::trace;
//! use kubeloop::workqueue::Queue;
//!
//! trace::follow(["default/web"]).unwrap();
//! let queue = Queue::new();
//! queue.add("default/web".to_string());
//! queue.add("default/web".to_string());
//! let steps = trace::timeline("default/web").unwrap();
//! assert_eq!(steps[1].stage, trace::Stage::QueueDeduplicated);
//! print!("{}", trace::render("default/web", &steps));
//! ```

#![warn(missing_docs)]
// `unsafe` only where a module allows it (protobuf's `made.rs`, the QEMU driver's libc calls,
// the workqueue's epoch-reclaimed cell in `workqueue/sync.rs`),
// each block with a `// SAFETY:` comment (`clippy::undocumented_unsafe_blocks`, denied in the
// workspace's lints). `forbid` would not let those modules allow it.
#![deny(unsafe_code)]
// docs.rs (`--cfg docsrs`, nightly rustdoc): each item behind a feature is shown with the
// features it needs. `doc_cfg` reads the `#[cfg]`s itself (it took in `doc_auto_cfg`); stable
// never sees the attribute.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod backoff;
pub mod cache;
pub mod client;
#[cfg(any(feature = "sample-controller", feature = "vm-controller"))]
pub mod controller;
pub mod leaderelection;
#[cfg(feature = "ops")]
pub mod ops;
pub mod protobuf;
pub mod record;
#[cfg(feature = "runtime")]
pub mod runtime;
pub mod testing;
pub mod trace;
pub mod watch;
pub mod workqueue;

/// The README's Rust examples, compiled and run as doc tests so they cannot rot (with the
/// features they use, as `hack/test` runs doc tests: `--all-features`). The README is the
/// package's own, so the published crate carries it (and crates.io shows it).
#[cfg(all(doctest, feature = "runtime"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The Rust examples of the reference chapters in `docs/` that came from the README, compiled
/// as doc tests for the same reason.
#[cfg(all(doctest, feature = "runtime"))]
#[doc = include_str!("../docs/runtime.md")]
pub struct DocsRuntimeDoctests;

/// `docs/harness.md`'s example: a test on the harness crate `kubeloop-testenv`.
#[cfg(all(doctest, feature = "runtime"))]
#[doc = include_str!("../docs/harness.md")]
pub struct DocsHarnessDoctests;
