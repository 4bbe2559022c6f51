//! Why a Foo could not be synced, and why the controller could not run.
//!
//! A [`SyncError`] sends the key back to the queue with the rate limiter's backoff; the cases
//! sample-controller drops without retry (bad key, Foo gone, empty deploymentName) are not
//! errors at all.

/// The message of the `ErrResourceExists` event. sample-controller: `MessageResourceExists`.
pub(crate) fn message_resource_exists(name: &str) -> String {
    format!("Resource \"{name}\" already exists and is not managed by Foo")
}

/// Why one sync of a Foo failed; the key is retried with backoff.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// A Deployment of the wanted name exists and is not controlled by this Foo. The Foo also
    /// gets a Warning event `ErrResourceExists` with the same message.
    #[error("foo {foo}: {}", message_resource_exists(deployment))]
    NotControlled {
        /// The Foo's key.
        foo: String,
        /// The Deployment's name.
        deployment: String,
    },
    /// Creating the Deployment failed.
    #[error("foo {foo}: creating deployment {deployment}: {source}")]
    CreateDeployment {
        /// The Foo's key.
        foo: String,
        /// The Deployment's name.
        deployment: String,
        /// The apiserver's or client's error.
        #[source]
        source: kube_client::Error,
    },
    /// Updating the Deployment's replicas failed (a conflict included: the retry reads the
    /// informer's newer copy).
    #[error("foo {foo}: updating deployment {deployment} to {replicas:?} replicas: {source}")]
    UpdateDeployment {
        /// The Foo's key.
        foo: String,
        /// The Deployment's name.
        deployment: String,
        /// The replicas asked for.
        replicas: Option<i32>,
        /// The apiserver's or client's error.
        #[source]
        source: kube_client::Error,
    },
    /// Writing the Foo's status failed.
    #[error("foo {foo}: updating status: {source}")]
    UpdateStatus {
        /// The Foo's key.
        foo: String,
        /// The apiserver's or client's error.
        #[source]
        source: kube_client::Error,
    },
    /// Re-reading the Foo after a status conflict failed.
    #[error("foo {foo}: reading it after a status conflict: {source}")]
    GetFoo {
        /// The Foo's key.
        foo: String,
        /// The apiserver's or client's error.
        #[source]
        source: kube_client::Error,
    },
    /// Every status write attempt hit a conflict.
    #[error("foo {foo}: status update still conflicting after {attempts} attempts")]
    StatusConflicts {
        /// The Foo's key.
        foo: String,
        /// How many writes were tried.
        attempts: u32,
    },
}

/// A status write that lost a race is retried on a fresh read ([`crate::runtime::retry_on_conflict`]).
impl crate::runtime::Conflict for SyncError {
    fn is_conflict(&self) -> bool {
        matches!(self, SyncError::UpdateStatus { source, .. } if source.is_conflict())
    }
}

/// Why [`run`](super::run) stopped early.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// Shut down before the informers' caches had synced.
    #[error("stopped before the caches synced: {not_synced:?} not synced")]
    CacheSync {
        /// Informer type names that had not synced.
        not_synced: Vec<String>,
    },
    /// A cache did not sync within the runtime's cache-sync timeout.
    #[error(transparent)]
    CacheSyncTimeout(crate::runtime::ControllerError),
    /// An event handler could not be registered (the informer was already shut down).
    #[error("registering event handlers: {0}")]
    Handler(#[from] crate::cache::InformerError),
    /// The sharding settings cannot work.
    #[error(transparent)]
    Sharding(#[from] crate::runtime::ShardingError),
}
