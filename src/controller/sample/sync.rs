//! Reconciling one Foo: sample-controller's `syncHandler` and `updateFooStatus`
//! (controller.go).
//!
//! For key `namespace/name`:
//! 1. a Foo no longer in the cache, or an empty `spec.deploymentName`, is logged and dropped
//!    (retrying cannot help; a malformed key cannot reach here: the runtime hands out
//!    [`ObjectKey`]s);
//! 2. no Deployment of that name -> create [`new_deployment`];
//! 3. a Deployment not controlled by this Foo -> Warning event `ErrResourceExists`
//!    (`Resource "<name>" already exists and is not managed by Foo`) and an error, no writes;
//! 4. `spec.replicas` set and different from the Deployment's -> update the Deployment's
//!    replicas;
//! 5. write `status.availableReplicas` from the Deployment through the status subresource,
//!    re-reading the Foo and retrying on conflicts;
//! 6. Normal event `Synced`, "Foo synced successfully", if steps 2, 4 or 5 wrote anything.
//!
//! Differs on purpose:
//! - a Foo that can never be synced (a name longer than the 63 characters of the label value it
//!   becomes) gets a Warning event `InvalidName` and a `Stalled` condition naming the field and
//!   the limit, once, and is not retried (sample-controller gets a 422 from the Deployment
//!   create on every retry, and its user never learns why);
//! - `Synced` is recorded only when the sync changed something (sample-controller records it on
//!   every sync, so every 30 s resync spends the per-object event budget that Warnings share);
//! - step 4 changes only `spec.replicas` of the existing Deployment (with its resourceVersion,
//!   so a concurrent change is a conflict, retried from the newer cached copy); sample-controller
//!   replaces the whole object with `newDeployment(foo)`, wiping anything else set on it;
//! - step 5 skips the write when the status already holds the value (sample-controller writes
//!   on every sync, i.e. every Foo every 30 s), and retries conflicts in place where
//!   sample-controller returns them as errors;
//! - HTTP status codes decide (409 conflict, 404 gone), not kube-core's `is_conflict` /
//!   `is_not_found`, which are false for a bare-text error body (kube-core 5 checks only the
//!   reason when the reason is a known one).

use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::api::SyncClient;
use super::deployment::{is_controlled_by, new_deployment};
use super::error::{SyncError, message_resource_exists};
use super::types::{Foo, FooStatus};
use crate::record::EventType;
use crate::runtime::{
    Action, Conflict, DEFAULT_RETRY, ObjectKey, ReconcileContext, retry_on_conflict,
};

/// Reason of the Normal event after a successful sync. sample-controller: `SuccessSynced`.
pub(crate) const SUCCESS_SYNCED: &str = "Synced";
/// Reason of the Warning event for a Deployment owned by someone else.
/// sample-controller: `ErrResourceExists`.
pub(crate) const ERR_RESOURCE_EXISTS: &str = "ErrResourceExists";
/// Message of the Normal event after a successful sync. sample-controller:
/// `MessageResourceSynced`.
pub(crate) const MESSAGE_RESOURCE_SYNCED: &str = "Foo synced successfully";
/// Reason of the Warning event and the `Stalled` condition of a Foo whose name is too long for
/// the label value it becomes.
pub(crate) const INVALID_NAME: &str = "InvalidName";
/// The condition a Foo that can never be synced carries (kstatus's `Stalled`).
pub(crate) const STALLED: &str = "Stalled";
/// The longest label value (apimachinery `validation.LabelValueMaxLength`): a Foo's name is the
/// value of its Deployment's `controller` label.
pub(crate) const LABEL_VALUE_MAX_LENGTH: usize = 63;
/// How many times a status write is tried when it keeps hitting conflicts (client-go's
/// `retry.DefaultRetry`).
pub(crate) const STATUS_ATTEMPTS: u32 = DEFAULT_RETRY.steps;

/// Brings the Deployment and status of the Foo at `key` in line with its spec.
/// sample-controller: `syncHandler`.
///
/// Reports each write to `ctx` ([`ReconcileContext::wrote`]), so that the Foo's next sync waits
/// until the caches hold the Deployment and status it wrote (read-your-writes).
pub async fn sync_handler<C: SyncClient>(
    client: &C,
    key: &ObjectKey,
    ctx: &ReconcileContext,
) -> Result<Action, SyncError> {
    let namespace = key.namespace().unwrap_or_default();
    let Some(foo) = client.foo(namespace, key.name()) else {
        tracing::info!(%key, "foo in work queue no longer exists");
        return Ok(Action::Done);
    };
    let deployment_name = foo.spec.deployment_name.as_str();
    if deployment_name.is_empty() {
        tracing::error!(%key, "foo has an empty spec.deploymentName, nothing to do");
        return Ok(Action::Done);
    }
    if foo.name().len() > LABEL_VALUE_MAX_LENGTH {
        return stall(client, key, &foo, ctx).await;
    }

    let mut changed = false;
    // The cache's copy, shared: it is cloned only to be scaled.
    let deployment = match client.deployment(namespace, deployment_name) {
        Some(existing) => existing,
        None => {
            changed = true;
            tracing::info!(%key, deployment = deployment_name, "creating deployment");
            let created = client
                .create_deployment(&new_deployment(&foo))
                .await
                .map_err(|source| SyncError::CreateDeployment {
                    foo: key.to_string(),
                    deployment: deployment_name.to_string(),
                    source,
                })?;
            ctx.wrote(&created);
            Arc::new(created)
        }
    };

    if !is_controlled_by(&deployment.metadata, &foo) {
        let message = message_resource_exists(deployment_name);
        client.record_event(
            &foo,
            Some(&*deployment),
            EventType::Warning,
            ERR_RESOURCE_EXISTS,
            &message,
        );
        return Err(SyncError::NotControlled {
            foo: key.to_string(),
            deployment: deployment_name.to_string(),
        });
    }

    let current_replicas = deployment.spec.as_ref().and_then(|s| s.replicas);
    let deployment = match foo.spec.replicas {
        Some(wanted) if Some(wanted) != current_replicas => {
            tracing::info!(%key, deployment = deployment_name, wanted, current = ?current_replicas, "updating deployment replicas");
            changed = true;
            let mut scaled = Arc::unwrap_or_clone(deployment);
            scaled.spec.get_or_insert_with(Default::default).replicas = Some(wanted);
            let updated = client.update_deployment(&scaled).await.map_err(|source| {
                SyncError::UpdateDeployment {
                    foo: key.to_string(),
                    deployment: deployment_name.to_string(),
                    replicas: Some(wanted),
                    source,
                }
            })?;
            ctx.wrote(&updated);
            Arc::new(updated)
        }
        _ => deployment,
    };

    let available = deployment
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    let wanted = FooStatus {
        available_replicas: available,
        conditions: Vec::new(),
    };
    changed |= update_foo_status(client, key, &foo, wanted, ctx).await?;
    if changed {
        client.record_event(
            &foo,
            Some(&*deployment),
            EventType::Normal,
            SUCCESS_SYNCED,
            MESSAGE_RESOURCE_SYNCED,
        );
    }
    Ok(Action::Done)
}

/// A Foo that can never be synced: `Stalled` in its status and a Warning event naming the field
/// and the limit, both once (an unchanged condition is not written again), and no retry (the
/// name cannot change; the Foo must be re-created).
async fn stall<C: SyncClient>(
    client: &C,
    key: &ObjectKey,
    foo: &Foo,
    ctx: &ReconcileContext,
) -> Result<Action, SyncError> {
    let message = format!(
        "Foo {key}: metadata.name is {} characters long, but it becomes the value of the \
         Deployment's controller label, which takes at most {LABEL_VALUE_MAX_LENGTH}: \
         re-create the Foo with a shorter name",
        foo.name().len()
    );
    tracing::warn!(%key, "{message}");
    let wanted = FooStatus {
        available_replicas: 0,
        conditions: vec![Condition {
            type_: STALLED.to_string(),
            status: "True".to_string(),
            reason: INVALID_NAME.to_string(),
            message: message.clone(),
            observed_generation: foo.metadata.generation,
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
        }],
    };
    if update_foo_status(client, key, foo, wanted, ctx).await? {
        client.record_event(foo, None, EventType::Warning, INVALID_NAME, &message);
    }
    Ok(Action::Done)
}

/// Writes `wanted` as the Foo's status unless it already holds it (a condition that is
/// already there keeps its `lastTransitionTime`), retrying conflicts on a fresh read
/// ([`retry_on_conflict`]). Returns whether it wrote. sample-controller: `updateFooStatus`.
async fn update_foo_status<C: SyncClient>(
    client: &C,
    key: &ObjectKey,
    foo: &Foo,
    wanted: FooStatus,
    ctx: &ReconcileContext,
) -> Result<bool, SyncError> {
    let written = retry_on_conflict(DEFAULT_RETRY, |attempt| {
        let mut wanted = wanted.clone();
        async move {
            // The Foo is cloned only when its status is to be written.
            let fresh;
            let current = if attempt == 0 {
                foo
            } else {
                tracing::debug!(%key, "status update conflicted, reading the foo again");
                match client.get_foo(foo.namespace(), foo.name()).await {
                    Ok(Some(read)) => {
                        fresh = read;
                        &fresh
                    }
                    // Deleted meanwhile: nothing left to report on.
                    Ok(None) => return Ok(false),
                    Err(source) => {
                        return Err(SyncError::GetFoo {
                            foo: key.to_string(),
                            source,
                        });
                    }
                }
            };
            keep_transition_times(current.status.as_ref(), &mut wanted);
            if current.status.as_ref() == Some(&wanted) {
                return Ok(false);
            }
            let mut updated = current.clone();
            updated.status = Some(wanted);
            match client.update_foo_status(&updated).await {
                Ok(written) => {
                    ctx.wrote(&written);
                    Ok(true)
                }
                Err(kube_client::Error::Api(status)) if status.code == 404 => Ok(false),
                Err(source) => Err(SyncError::UpdateStatus {
                    foo: key.to_string(),
                    source,
                }),
            }
        }
    })
    .await;
    written.map_err(|e| match e {
        e if e.is_conflict() => SyncError::StatusConflicts {
            foo: key.to_string(),
            attempts: STATUS_ATTEMPTS,
        },
        other => other,
    })
}

/// Gives each condition of `wanted` that `current` already holds with the same status the
/// `lastTransitionTime` it has there (apimachinery `meta.SetStatusCondition`).
fn keep_transition_times(current: Option<&FooStatus>, wanted: &mut FooStatus) {
    let Some(current) = current else { return };
    for condition in &mut wanted.conditions {
        if let Some(old) = current
            .conditions
            .iter()
            .find(|old| old.type_ == condition.type_ && old.status == condition.status)
        {
            condition.last_transition_time = old.last_transition_time.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    //! sample-controller's controller_test.go, ported: its fake clientsets become
    //! [`FakeClient`], which serves the listers from maps and records every write as an action.

    use std::collections::HashMap;
    use std::sync::Arc;

    use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
    use kube_client::core::Status;
    use parking_lot::Mutex;

    use super::*;
    use crate::controller::sample::types::FooSpec;

    /// A write the sync made (client-go's fake `Action`s, minus list/watch).
    #[derive(Debug, Clone, PartialEq)]
    enum Write {
        CreateDeployment(Deployment),
        UpdateDeployment(Deployment),
        UpdateFooStatus(Foo),
        GetFoo(String),
    }

    #[derive(Default)]
    struct FakeClient {
        foos: HashMap<(String, String), Arc<Foo>>,
        deployments: HashMap<(String, String), Arc<Deployment>>,
        writes: Mutex<Vec<Write>>,
        events: Mutex<Vec<(EventType, String, String)>>,
        /// Status writes answered with 409 before one succeeds.
        status_conflicts: Mutex<u32>,
        /// What a fresh read of the Foo returns (defaults to the cached Foo).
        fresh_foo: Option<Foo>,
    }

    impl FakeClient {
        fn with_foo(foo: Foo) -> Self {
            let mut f = FakeClient::default();
            f.foos
                .insert((foo.namespace().into(), foo.name().into()), Arc::new(foo));
            f
        }
        fn with_deployment(mut self, d: Deployment) -> Self {
            let key = (
                d.metadata.namespace.clone().unwrap(),
                d.metadata.name.clone().unwrap(),
            );
            self.deployments.insert(key, Arc::new(d));
            self
        }
        fn writes(&self) -> Vec<Write> {
            self.writes.lock().clone()
        }
        fn events(&self) -> Vec<(EventType, String, String)> {
            self.events.lock().clone()
        }
    }

    fn conflict() -> kube_client::Error {
        kube_client::Error::Api(
            Status::failure("the object has been modified", "Conflict")
                .with_code(409)
                .boxed(),
        )
    }

    impl SyncClient for FakeClient {
        fn foo(&self, namespace: &str, name: &str) -> Option<Arc<Foo>> {
            self.foos
                .get(&(namespace.to_string(), name.to_string()))
                .cloned()
        }
        fn deployment(&self, namespace: &str, name: &str) -> Option<Arc<Deployment>> {
            self.deployments
                .get(&(namespace.to_string(), name.to_string()))
                .cloned()
        }
        async fn create_deployment(
            &self,
            d: &Deployment,
        ) -> Result<Deployment, kube_client::Error> {
            self.writes.lock().push(Write::CreateDeployment(d.clone()));
            Ok(d.clone())
        }
        async fn update_deployment(
            &self,
            d: &Deployment,
        ) -> Result<Deployment, kube_client::Error> {
            self.writes.lock().push(Write::UpdateDeployment(d.clone()));
            Ok(d.clone())
        }
        async fn update_foo_status(&self, foo: &Foo) -> Result<Foo, kube_client::Error> {
            self.writes.lock().push(Write::UpdateFooStatus(foo.clone()));
            let mut left = self.status_conflicts.lock();
            if *left > 0 {
                *left -= 1;
                return Err(conflict());
            }
            Ok(foo.clone())
        }
        async fn get_foo(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<Foo>, kube_client::Error> {
            self.writes
                .lock()
                .push(Write::GetFoo(format!("{namespace}/{name}")));
            Ok(self
                .fresh_foo
                .clone()
                .or_else(|| self.foo(namespace, name).map(|f| f.as_ref().clone())))
        }
        fn record_event(
            &self,
            _foo: &Foo,
            _related: Option<&Deployment>,
            event_type: EventType,
            reason: &str,
            message: &str,
        ) {
            self.events
                .lock()
                .push((event_type, reason.to_string(), message.to_string()));
        }
    }

    /// sample-controller's `newFoo`.
    fn key(key: &str) -> ObjectKey {
        ObjectKey::parse(key).unwrap()
    }

    fn new_foo(name: &str, replicas: Option<i32>) -> Foo {
        let mut foo = Foo::namespaced(
            "default",
            name,
            FooSpec {
                deployment_name: format!("{name}-deployment"),
                replicas,
            },
        );
        foo.metadata.uid = Some(format!("uid-{name}"));
        foo.metadata.resource_version = Some("1".into());
        foo
    }

    fn with_available(mut d: Deployment, available: i32) -> Deployment {
        d.status = Some(DeploymentStatus {
            available_replicas: Some(available),
            ..Default::default()
        });
        d
    }

    fn status_of(write: &Write) -> Option<i32> {
        match write {
            Write::UpdateFooStatus(f) => f.status.as_ref().map(|s| s.available_replicas),
            _ => None,
        }
    }

    // sample-controller: TestCreatesDeployment
    #[tokio::test]
    async fn creates_the_deployment_then_writes_status_and_a_synced_event() {
        let foo = new_foo("test", Some(1));
        let fake = FakeClient::with_foo(foo.clone());
        let action = sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
            .await
            .unwrap();
        assert_eq!(action, Action::Done);
        let writes = fake.writes();
        assert_eq!(writes.len(), 2, "{writes:#?}");
        assert_eq!(writes[0], Write::CreateDeployment(new_deployment(&foo)));
        assert_eq!(status_of(&writes[1]), Some(0));
        assert_eq!(
            fake.events(),
            vec![(
                EventType::Normal,
                "Synced".into(),
                "Foo synced successfully".into()
            )]
        );
    }

    // sample-controller: TestDoNothing
    #[tokio::test]
    async fn does_nothing_but_update_the_status_when_the_deployment_matches() {
        let foo = new_foo("test", Some(1));
        let d = with_available(new_deployment(&foo), 1);
        let fake = FakeClient::with_foo(foo.clone()).with_deployment(d);
        sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
            .await
            .unwrap();
        let writes = fake.writes();
        assert_eq!(writes.len(), 1, "{writes:#?}");
        assert_eq!(status_of(&writes[0]), Some(1));
        assert_eq!(fake.events().len(), 1);
    }

    #[tokio::test]
    async fn writes_nothing_when_deployment_and_status_already_match() {
        let mut foo = new_foo("test", Some(1));
        foo.status = Some(FooStatus {
            available_replicas: 1,
            ..Default::default()
        });
        let d = with_available(new_deployment(&foo), 1);
        let fake = FakeClient::with_foo(foo).with_deployment(d);
        sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
            .await
            .unwrap();
        assert!(fake.writes().is_empty(), "{:#?}", fake.writes());
        assert!(
            fake.events().is_empty(),
            "an unchanged resync records no Synced event: {:?}",
            fake.events()
        );
    }

    #[tokio::test]
    async fn a_name_too_long_for_a_label_value_stalls_the_foo_once_with_a_warning_and_no_retry() {
        let name = "n".repeat(LABEL_VALUE_MAX_LENGTH + 1);
        let fake = FakeClient::with_foo(new_foo(&name, Some(1)));
        let key = key(&format!("default/{name}"));
        assert_eq!(
            sync_handler(&fake, &key, &ReconcileContext::detached())
                .await
                .unwrap(),
            Action::Done
        );
        let writes = fake.writes();
        assert_eq!(writes.len(), 1, "no Deployment is tried: {writes:#?}");
        let Write::UpdateFooStatus(stalled) = &writes[0] else {
            panic!("{writes:#?}")
        };
        let conditions = &stalled.status.as_ref().unwrap().conditions;
        assert_eq!(conditions.len(), 1);
        assert_eq!(
            (conditions[0].type_.as_str(), conditions[0].status.as_str()),
            (STALLED, "True")
        );
        assert_eq!(conditions[0].reason, INVALID_NAME);
        let events = fake.events();
        assert_eq!(events.len(), 1);
        assert_eq!(
            (events[0].0, events[0].1.as_str()),
            (EventType::Warning, INVALID_NAME)
        );
        for said in [&conditions[0].message, &events[0].2] {
            assert!(
                said.contains("metadata.name is 64 characters") && said.contains("at most 63"),
                "names the field and the limit: {said}"
            );
        }

        // The next sync finds the condition in place: no write, no second event.
        let again = FakeClient::with_foo(stalled.clone());
        assert_eq!(
            sync_handler(&again, &key, &ReconcileContext::detached())
                .await
                .unwrap(),
            Action::Done
        );
        assert!(again.writes().is_empty(), "{:#?}", again.writes());
        assert!(again.events().is_empty(), "{:?}", again.events());
    }

    // sample-controller: TestUpdateDeployment
    #[tokio::test]
    async fn updates_the_deployment_replicas_when_the_foo_asks_for_more() {
        let foo = new_foo("test", Some(2));
        let mut d = new_deployment(&foo);
        d.spec.as_mut().unwrap().replicas = Some(1);
        d.metadata.resource_version = Some("7".into());
        let fake = FakeClient::with_foo(foo.clone()).with_deployment(d.clone());
        sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
            .await
            .unwrap();
        let writes = fake.writes();
        assert_eq!(writes.len(), 2, "{writes:#?}");
        let Write::UpdateDeployment(updated) = &writes[0] else {
            panic!("want a deployment update first, got {writes:#?}")
        };
        assert_eq!(updated.spec.as_ref().unwrap().replicas, Some(2));
        assert_eq!(
            updated.metadata.resource_version.as_deref(),
            Some("7"),
            "the update is conditional on what we read"
        );
        let mut expected = d.clone();
        expected.spec.as_mut().unwrap().replicas = Some(2);
        assert_eq!(updated, &expected, "only replicas changed");
        assert!(matches!(writes[1], Write::UpdateFooStatus(_)));
    }

    // sample-controller: TestNotControlledByUs
    #[tokio::test]
    async fn a_deployment_not_controlled_by_us_is_an_error_with_a_warning_event_and_no_writes() {
        let foo = new_foo("test", Some(1));
        let mut d = new_deployment(&foo);
        d.metadata.owner_references = None;
        let fake = FakeClient::with_foo(foo).with_deployment(d);
        let err = sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
            .await
            .unwrap_err();
        assert!(matches!(err, SyncError::NotControlled { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "foo default/test: Resource \"test-deployment\" already exists and is not managed by Foo"
        );
        assert!(fake.writes().is_empty(), "{:#?}", fake.writes());
        assert_eq!(
            fake.events(),
            vec![(
                EventType::Warning,
                "ErrResourceExists".into(),
                "Resource \"test-deployment\" already exists and is not managed by Foo".into()
            )]
        );
    }

    #[tokio::test]
    async fn a_deployment_controlled_by_another_foo_of_the_same_name_is_not_ours() {
        let foo = new_foo("test", Some(1));
        let mut older = foo.clone();
        older.metadata.uid = Some("uid-of-a-deleted-foo".into());
        let fake = FakeClient::with_foo(foo).with_deployment(new_deployment(&older));
        assert!(matches!(
            sync_handler(&fake, &key("default/test"), &ReconcileContext::detached()).await,
            Err(SyncError::NotControlled { .. })
        ));
        assert!(fake.writes().is_empty());
    }

    #[tokio::test]
    async fn a_foo_deleted_while_queued_is_neither_an_error_nor_retried() {
        let fake = FakeClient::default();
        let action = sync_handler(&fake, &key("default/gone"), &ReconcileContext::detached())
            .await
            .unwrap();
        assert_eq!(action, Action::Done);
        assert!(fake.writes().is_empty());
        assert!(fake.events().is_empty());
    }

    #[tokio::test]
    async fn an_empty_deployment_name_is_logged_and_dropped() {
        let mut foo = new_foo("test", Some(1));
        foo.spec.deployment_name.clear();
        let fake = FakeClient::with_foo(foo);
        assert_eq!(
            sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
                .await
                .unwrap(),
            Action::Done
        );
        assert!(fake.writes().is_empty());
        assert!(fake.events().is_empty());
    }

    #[test]
    fn a_malformed_key_never_reaches_the_sync_handler() {
        // sample-controller's syncHandler drops a key SplitMetaNamespaceKey refuses; here the
        // runtime parses keys once, so such a key is refused before it is queued.
        assert!(ObjectKey::parse("a/b/c").is_err());
    }

    #[tokio::test]
    async fn a_foo_without_replicas_leaves_the_deployment_replicas_alone() {
        let foo = new_foo("test", None);
        let mut d = new_deployment(&foo);
        d.spec.as_mut().unwrap().replicas = Some(4);
        let fake = FakeClient::with_foo(foo).with_deployment(d);
        sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
            .await
            .unwrap();
        assert!(
            fake.writes()
                .iter()
                .all(|w| !matches!(w, Write::UpdateDeployment(_)))
        );
    }

    #[tokio::test]
    async fn a_status_conflict_is_retried_on_a_fresh_read() {
        let foo = new_foo("test", Some(1));
        let mut fresh = foo.clone();
        fresh.metadata.resource_version = Some("2".into());
        let mut fake = FakeClient::with_foo(foo.clone())
            .with_deployment(with_available(new_deployment(&foo), 1));
        fake.fresh_foo = Some(fresh);
        *fake.status_conflicts.lock() = 1;
        sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
            .await
            .unwrap();
        let writes = fake.writes();
        assert_eq!(writes.len(), 3, "{writes:#?}");
        assert_eq!(writes[1], Write::GetFoo("default/test".into()));
        let Write::UpdateFooStatus(second) = &writes[2] else {
            panic!("{writes:#?}")
        };
        assert_eq!(
            second.metadata.resource_version.as_deref(),
            Some("2"),
            "retried with the fresh resourceVersion"
        );
        assert_eq!(
            second.status,
            Some(FooStatus {
                available_replicas: 1,
                ..Default::default()
            })
        );
    }

    #[tokio::test]
    async fn endless_status_conflicts_give_up_with_an_error_after_the_attempts() {
        let foo = new_foo("test", Some(1));
        let fake = FakeClient::with_foo(foo.clone()).with_deployment(new_deployment(&foo));
        *fake.status_conflicts.lock() = 100;
        let err = sync_handler(&fake, &key("default/test"), &ReconcileContext::detached())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                SyncError::StatusConflicts {
                    attempts: STATUS_ATTEMPTS,
                    ..
                }
            ),
            "{err}"
        );
        let status_writes = fake
            .writes()
            .iter()
            .filter(|w| matches!(w, Write::UpdateFooStatus(_)))
            .count();
        assert_eq!(status_writes, STATUS_ATTEMPTS as usize);
        assert!(fake.events().is_empty(), "no Synced event on failure");
    }
}
