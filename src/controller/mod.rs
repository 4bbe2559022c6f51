//! The controller runtime, and the two controllers built on it: the sample-controller
//! equivalent (Foo -> Deployment) and the VirtualMachine controller (VMs as containers through
//! the Docker API).
//!
//! A controller is declared with [`Controller`] (a primary type's informer, owned and watched
//! types, workers, queue, rate limiter, leader election, leader-only tasks) and run with a
//! reconcile function and an error policy. The runtime owns the seams between the parts:
//! informers -> event handlers -> one rate-limited queue of `namespace/name` keys -> N workers ->
//! reconcile; readiness once the caches synced; leadership (standbys keep their caches warm,
//! only the workers wait); shutdown with drain. What it guarantees when leadership ends is
//! written in [`leadership`].
//!
//! | kubeloop            | client-go / controller-runtime / kube-runtime                          |
//! |---------------------|------------------------------------------------------------------------|
//! | [`builder`]         | controller-runtime `pkg/builder`; kube-runtime `Controller::new/owns/watches` |
//! | [`runtime`]         | controller-runtime `pkg/internal/controller/controller.go` (`Start`, `processNextWorkItem`) |
//! | [`leadership`]      | `leaderelection.RunOrDie` + manager's leader-only runnables, with a fence |
//! | [`sharding`]        | (none built in; kubernetes-controller-sharding adds it to controller-runtime) |
//! | [`context`]         | the `context.Context` handed to `Reconcile`                            |
//! | [`worker`]          | sample-controller's `runWorker` / `processNextWorkItem`, key helpers   |
//! | [`sample`]          | kubernetes/sample-controller (Foo -> Deployment)                       |
//! | [`vm`]              | controller101's VirtualMachine controller                              |
//!
//! # Example
//! ```no_run
//! # async fn demo(client: kube_client::Client) -> Result<(), Box<dyn std::error::Error>> {
//! use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
//! use kubeloop::cache::{FactoryOptions, SharedInformerFactory};
//! use kubeloop::controller::{Action, Controller, ReconcileContext, default_error_policy};
//! use tokio_util::sync::CancellationToken;
//!
//! let factory = SharedInformerFactory::new(client, FactoryOptions::default());
//! let deployments = factory.informer::<Deployment>().lister();
//! let shutdown = CancellationToken::new();
//! Controller::new("deployment-watcher", factory.informer::<Deployment>())
//!     .owns(factory.informer::<ReplicaSet>())
//!     .workers(2)
//!     .run(
//!         move |key: String, ctx: ReconcileContext| {
//!             let deployments = deployments.clone();
//!             async move {
//!                 let (ns, name) = key.split_once('/').unwrap_or(("", &key));
//!                 if let Some(d) = deployments.get(ns, name) {
//!                     ctx.check()?; // still entitled? (before every side effect)
//!                     println!("{key}: generation {:?}", d.metadata.generation);
//!                 }
//!                 Ok::<_, kubeloop::controller::NotEntitled>(Action::Done)
//!             }
//!         },
//!         default_error_policy,
//!         shutdown,
//!     )
//!     .await?;
//! # Ok(()) }
//! ```

pub mod builder;
pub mod context;
pub mod leadership;
pub mod runtime;
pub mod sample;
pub mod sharding;
pub mod vm;
pub mod worker;

pub use builder::{
    Controller, ControllerOptions, ErrorAction, controller_of, default_error_policy, refers_to,
};
pub use context::{NotEntitled, ReconcileContext};
pub use leadership::Term;
pub use runtime::ControllerError;
pub use sharding::{LeaseRing, ShardRing, ShardingConfig, ShardingError};
pub use worker::Action;
