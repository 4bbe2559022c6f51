//! The few calls a Foo sync makes, behind a trait so the sync can be tested with an in-memory
//! fake (sample-controller's tests use client-go's fake clientsets for the same reason).
//!
//! Reads come from the informers' listers (shared, possibly stale); writes go to the
//! apiserver: the Deployment's in protobuf, as sample-controller's typed clientset writes it
//! ([`WriteApi`]), the Foo's status as JSON (a custom resource). [`KubeSyncClient`] is the
//! real implementation.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::apps::v1::Deployment;
use kube_client::api::PostParams;
use kube_client::{Api, Client};

use super::types::Foo;
use crate::cache::Lister;
use crate::client::WriteApi;
use crate::record::{AnyEventRecorder, EventType, object_reference};

/// What `sync_handler` needs from the cluster.
pub trait SyncClient: Send + Sync + 'static {
    /// The Foo from the informer cache.
    fn foo(&self, namespace: &str, name: &str) -> Option<Arc<Foo>>;
    /// The Deployment from the informer cache.
    fn deployment(&self, namespace: &str, name: &str) -> Option<Arc<Deployment>>;
    /// Creates a Deployment (in its metadata's namespace).
    fn create_deployment(
        &self,
        deployment: &Deployment,
    ) -> impl Future<Output = Result<Deployment, kube_client::Error>> + Send;
    /// Replaces a Deployment; its resourceVersion makes this fail with 409 on a conflict.
    fn update_deployment(
        &self,
        deployment: &Deployment,
    ) -> impl Future<Output = Result<Deployment, kube_client::Error>> + Send;
    /// Writes `foo.status` through the status subresource; 409 on a resourceVersion conflict.
    fn update_foo_status(
        &self,
        foo: &Foo,
    ) -> impl Future<Output = Result<Foo, kube_client::Error>> + Send;
    /// Reads the Foo from the apiserver (not the cache), to retry after a conflict.
    fn get_foo(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Foo>, kube_client::Error>> + Send;
    /// Records an event about the Foo (with the Deployment it is about, if any); never blocks.
    fn record_event(
        &self,
        foo: &Foo,
        related: Option<&Deployment>,
        event_type: EventType,
        reason: &str,
        message: &str,
    );
}

/// The action every event of the sync names (events.k8s.io/v1's `action`; sample-controller
/// records on core/v1, which has none).
const ACTION_SYNC: &str = "Sync";

/// The real [`SyncClient`]: listers for reads, the apiserver for writes, an
/// [`AnyEventRecorder`] (events.k8s.io/v1 where served).
#[derive(Clone)]
pub struct KubeSyncClient {
    client: Client,
    foos: Lister<Foo>,
    deployments: Lister<Deployment>,
    /// One for every namespace, so a server that refuses protobuf is learnt once.
    deployment_writes: WriteApi<Deployment>,
    recorder: AnyEventRecorder,
}

impl KubeSyncClient {
    /// Wires the pieces together.
    pub fn new(
        client: Client,
        foos: Lister<Foo>,
        deployments: Lister<Deployment>,
        recorder: AnyEventRecorder,
    ) -> Self {
        KubeSyncClient {
            deployment_writes: WriteApi::new(client.clone()),
            client,
            foos,
            deployments,
            recorder,
        }
    }
}

impl SyncClient for KubeSyncClient {
    fn foo(&self, namespace: &str, name: &str) -> Option<Arc<Foo>> {
        self.foos.get(namespace, name)
    }

    fn deployment(&self, namespace: &str, name: &str) -> Option<Arc<Deployment>> {
        self.deployments.get(namespace, name)
    }

    async fn create_deployment(
        &self,
        deployment: &Deployment,
    ) -> Result<Deployment, kube_client::Error> {
        self.deployment_writes.create(deployment).await
    }

    async fn update_deployment(
        &self,
        deployment: &Deployment,
    ) -> Result<Deployment, kube_client::Error> {
        self.deployment_writes.replace(deployment).await
    }

    async fn update_foo_status(&self, foo: &Foo) -> Result<Foo, kube_client::Error> {
        let api: Api<Foo> = Api::namespaced(self.client.clone(), foo.namespace());
        let updated = api
            .replace_status(foo.name(), &PostParams::default(), foo)
            .await?;
        let key = format!("{}/{}", foo.namespace(), foo.name());
        crate::trace::status_written(&key, "Foo", &foo.metadata, &updated.metadata, || {
            let available = updated.status.as_ref().map_or(0, |s| s.available_replicas);
            format!("availableReplicas {available}")
        });
        Ok(updated)
    }

    async fn get_foo(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Foo>, kube_client::Error> {
        let api: Api<Foo> = Api::namespaced(self.client.clone(), namespace);
        api.get_opt(name).await
    }

    fn record_event(
        &self,
        foo: &Foo,
        related: Option<&Deployment>,
        event_type: EventType,
        reason: &str,
        message: &str,
    ) {
        let related = related.map(object_reference);
        self.recorder
            .event(foo, related, event_type, reason, ACTION_SYNC, message);
    }
}
