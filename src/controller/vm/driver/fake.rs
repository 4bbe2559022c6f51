//! The in-memory driver (controller101's `fake` driver): servers that exist only in this
//! process, for running the controller without an engine (`kubeloop vm-controller --vm-driver
//! fake`, the perturbation workloads, the sharding benchmark), as client-go's fake clientset
//! stands in for an apiserver. Public: [`FakeDriver::new`], [`FakeDriver::with_status_latency`]
//! and the [`Driver`] it implements.
//!
//! The library's unit tests also steer it (compiled in tests only, so not part of the public
//! surface): `fail_creates` makes the next creates fail, `set_unreachable` makes every call fail
//! as an unreachable engine, `vanish` removes a server behind the controller's back, and
//! `hold_creates` keeps creates in flight until `release_creates`. Servers carry labels like
//! the Docker driver's (`super::labels_for`); a server with other labels (another owner's) is
//! added with `insert_with_labels`.
//!
//! Invariant: all state sits in one `Inner` behind one lock, never held across an `.await`
//! (only a held create awaits, with the lock released).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::{
    Created, DEFAULT_MANAGED_BY, DeleteOutcome, Driver, DriverError, DriverServerStatus,
    LABEL_MANAGED_BY, LABEL_NAME, LABEL_NAMESPACE, LABEL_UID, ManagedServer, ServerSpec,
    labels_for,
};

/// A cloneable handle to one in-memory engine.
#[derive(Clone)]
pub struct FakeDriver {
    inner: Arc<Mutex<Inner>>,
    /// True while creates are held in flight ([`FakeDriver::hold_creates`]).
    creates_held: Arc<watch::Sender<bool>>,
    /// How long each status call takes ([`FakeDriver::with_status_latency`]).
    status_latency: std::time::Duration,
}

impl Default for FakeDriver {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            creates_held: Arc::new(watch::Sender::new(false)),
            status_latency: std::time::Duration::ZERO,
        }
    }
}

#[derive(Default)]
struct Inner {
    /// Servers by name.
    servers: BTreeMap<String, FakeServer>,
    next_id: u64,
    /// Creates still to fail, with the message to fail with.
    failing_creates: u32,
    /// Creates still to refuse as a spec the engine cannot run.
    refused_creates: u32,
    unreachable: bool,
    /// Calls made, for tests: ("create" | "delete" | "exists" | "status" | "list", server name).
    calls: Vec<(&'static str, String)>,
}

/// One server of the fake engine.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct FakeServer {
    /// The server's id (`fake-0001`, ...).
    pub id: String,
    /// What it was created for.
    pub spec: ServerSpec,
    /// What the engine would report as the container's labels.
    pub labels: BTreeMap<String, String>,
    /// True while it runs.
    pub running: bool,
    /// The CPU% the next status call reports.
    pub cpu_percent: f64,
    /// The memory% the next status call reports.
    pub memory_percent: f64,
    /// When it last started.
    pub started_at: Option<Timestamp>,
    /// The exit code and time of its last run, once it stopped.
    pub exit: Option<(i64, Timestamp)>,
}

const ENGINE: &str = "fake engine";

impl FakeDriver {
    /// An empty engine.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every status call (one per refresh of a VM) takes `latency`, standing in for a slow
    /// engine or cloud API (`--fake-engine-latency`; the sharding benchmark's per-reconcile
    /// cost).
    pub fn with_status_latency(mut self, latency: std::time::Duration) -> Self {
        self.status_latency = latency;
        self
    }

    /// The next `n` creates fail with an engine error.
    #[cfg(test)]
    pub(crate) fn fail_creates(&self, n: u32) {
        self.inner.lock().failing_creates = n;
    }

    /// While true, every call fails with [`DriverError::Unreachable`].
    #[cfg(test)]
    pub(crate) fn set_unreachable(&self, unreachable: bool) {
        self.inner.lock().unreachable = unreachable;
    }

    /// Removes a server without going through the controller; returns whether it existed.
    #[cfg(test)]
    pub(crate) fn vanish(&self, name: &str) -> bool {
        self.inner.lock().servers.remove(name).is_some()
    }

    /// Stops a server (it stays, in state `exited`, exit code 0).
    #[cfg(test)]
    pub(crate) fn stop(&self, name: &str) {
        self.exit(name, 0);
    }

    /// The server's process exits with `code` now (it stays, in state `exited`).
    #[cfg(test)]
    pub(crate) fn exit(&self, name: &str, code: i64) {
        self.exit_at(name, code, Timestamp::now());
    }

    /// As [`Self::exit`], the engine reporting `at` as the time it stopped.
    #[cfg(test)]
    pub(crate) fn exit_at(&self, name: &str, code: i64, at: Timestamp) {
        if let Some(server) = self.inner.lock().servers.get_mut(name) {
            server.running = false;
            server.exit = Some((code, at));
        }
    }

    /// The engine reports the server as started at `at`.
    #[cfg(test)]
    pub(crate) fn set_started_at(&self, name: &str, at: Timestamp) {
        if let Some(server) = self.inner.lock().servers.get_mut(name) {
            server.started_at = Some(at);
        }
    }

    /// The next `n` creates are refused as an engine refuses a spec it cannot run
    /// ([`DriverError::Refused`]).
    #[cfg(test)]
    pub(crate) fn refuse_creates(&self, n: u32) {
        self.inner.lock().refused_creates = n;
    }

    /// Adds a server as if an earlier controller had created it for `spec`'s VM (labelled as
    /// this driver labels them).
    #[cfg(test)]
    pub(crate) fn insert(&self, spec: ServerSpec) -> String {
        let labels = labels_for(&spec, DEFAULT_MANAGED_BY);
        self.insert_with_labels(spec, labels)
    }

    /// Adds a server with exactly `labels` (another owner's server, or an unlabelled one).
    #[cfg(test)]
    pub(crate) fn insert_with_labels(
        &self,
        spec: ServerSpec,
        labels: BTreeMap<String, String>,
    ) -> String {
        let mut inner = self.inner.lock();
        let id = inner.new_id();
        inner.servers.insert(
            spec.name.clone(),
            FakeServer {
                id: id.clone(),
                spec,
                labels,
                running: true,
                cpu_percent: 0.0,
                memory_percent: 0.0,
                started_at: Some(Timestamp::now()),
                exit: None,
            },
        );
        id
    }

    /// Creates from now on stay in flight (recorded as calls, not yet done) until
    /// [`Self::release_creates`].
    #[cfg(test)]
    pub(crate) fn hold_creates(&self) {
        self.creates_held.send_replace(true);
    }

    /// Lets held creates complete.
    #[cfg(test)]
    pub(crate) fn release_creates(&self) {
        self.creates_held.send_replace(false);
    }

    /// Sets the usage the next status calls report.
    #[cfg(test)]
    pub(crate) fn set_usage(&self, name: &str, cpu_percent: f64, memory_percent: f64) {
        if let Some(server) = self.inner.lock().servers.get_mut(name) {
            server.cpu_percent = cpu_percent;
            server.memory_percent = memory_percent;
        }
    }

    /// A copy of the server named `name`.
    #[cfg(test)]
    pub(crate) fn server(&self, name: &str) -> Option<FakeServer> {
        self.inner.lock().servers.get(name).cloned()
    }

    /// Names of all servers.
    #[cfg(test)]
    pub(crate) fn server_names(&self) -> Vec<String> {
        self.inner.lock().servers.keys().cloned().collect()
    }

    /// How many calls of `kind` ("create", "delete", "exists", "status", "list") were made.
    #[cfg(test)]
    pub(crate) fn calls(&self, kind: &str) -> usize {
        self.inner
            .lock()
            .calls
            .iter()
            .filter(|(k, _)| *k == kind)
            .count()
    }

    fn begin(
        &self,
        kind: &'static str,
        name: &str,
    ) -> Result<parking_lot::MutexGuard<'_, Inner>, DriverError> {
        let mut inner = self.inner.lock();
        inner.calls.push((kind, name.to_string()));
        if inner.unreachable {
            return Err(DriverError::Unreachable {
                engine: ENGINE.into(),
                message: "injected outage".into(),
            });
        }
        Ok(inner)
    }
}

impl Inner {
    fn new_id(&mut self) -> String {
        self.next_id += 1;
        format!("fake-{:04}", self.next_id)
    }

    /// The name of the server named or with the id `name_or_id`.
    fn resolve(&self, name_or_id: &str) -> Option<String> {
        if self.servers.contains_key(name_or_id) {
            return Some(name_or_id.to_string());
        }
        self.servers
            .iter()
            .find(|(_, s)| s.id == name_or_id)
            .map(|(name, _)| name.clone())
    }
}

impl FakeServer {
    fn status(&self) -> DriverServerStatus {
        DriverServerStatus {
            id: self.id.clone(),
            state: if self.running { "running" } else { "exited" }.into(),
            running: self.running,
            cpu_percent: self.cpu_percent,
            memory_percent: self.memory_percent,
            cpu_millis: self.spec.cpu_millis,
            memory_bytes: self.spec.memory_bytes,
            vm_uid: self.labels.get(LABEL_UID).cloned(),
            started_at: self.started_at,
            finished_at: self.exit.map(|(_, at)| at),
            exit_code: self.exit.map(|(code, _)| code),
            accelerator: None,
        }
    }
}

impl Driver for FakeDriver {
    fn engine(&self) -> &str {
        ENGINE
    }

    async fn create_server(&self, spec: &ServerSpec) -> Result<Created, DriverError> {
        drop(self.begin("create", &spec.name)?);
        let mut held = self.creates_held.subscribe();
        // The sender lives in `self`, so this cannot fail while we are borrowed.
        let _ = held.wait_for(|held| !*held).await;
        let mut inner = self.inner.lock();
        if inner.failing_creates > 0 {
            inner.failing_creates -= 1;
            return Err(DriverError::Engine {
                engine: ENGINE.into(),
                operation: "create",
                server: spec.name.clone(),
                message: "injected failure".into(),
            });
        }
        if inner.refused_creates > 0 {
            inner.refused_creates -= 1;
            return Err(DriverError::Refused {
                engine: ENGINE.into(),
                operation: "create",
                server: spec.name.clone(),
                message: "injected refusal: no such image".into(),
            });
        }
        if let Some(existing) = inner.servers.get_mut(&spec.name) {
            let found_uid = existing.labels.get(LABEL_UID);
            if found_uid != Some(&spec.vm_uid) {
                return Err(DriverError::NameTaken {
                    engine: ENGINE.into(),
                    server: spec.name.clone(),
                    id: existing.id.clone(),
                    wanted_uid: spec.vm_uid.clone(),
                    found_uid: found_uid.cloned(),
                });
            }
            if !existing.running {
                existing.running = true;
                existing.started_at = Some(Timestamp::now());
                existing.exit = None;
            }
            return Ok(Created {
                status: existing.status(),
                adopted: true,
            });
        }
        let id = inner.new_id();
        let server = FakeServer {
            id,
            spec: spec.clone(),
            labels: labels_for(spec, DEFAULT_MANAGED_BY),
            running: true,
            cpu_percent: 0.0,
            memory_percent: 0.0,
            started_at: Some(Timestamp::now()),
            exit: None,
        };
        let status = server.status();
        inner.servers.insert(spec.name.clone(), server);
        Ok(Created {
            status,
            adopted: false,
        })
    }

    async fn delete_server(
        &self,
        name_or_id: &str,
        uid: &str,
    ) -> Result<DeleteOutcome, DriverError> {
        let mut inner = self.begin("delete", name_or_id)?;
        let Some(name) = inner.resolve(name_or_id) else {
            return Ok(DeleteOutcome::Absent);
        };
        let server = &inner.servers[&name];
        if server.labels.get(LABEL_UID).map(String::as_str) != Some(uid) {
            return Ok(DeleteOutcome::NotOwned {
                id: server.id.clone(),
                found_uid: server.labels.get(LABEL_UID).cloned(),
            });
        }
        let removed = inner
            .servers
            .remove(&name)
            .map(|s| s.id)
            .unwrap_or_default();
        Ok(DeleteOutcome::Deleted { id: removed })
    }

    async fn list_servers(&self) -> Result<Vec<ManagedServer>, DriverError> {
        let inner = self.begin("list", "")?;
        Ok(inner
            .servers
            .iter()
            .filter(|(_, s)| {
                s.labels.get(LABEL_MANAGED_BY).map(String::as_str) == Some(DEFAULT_MANAGED_BY)
            })
            .map(|(name, s)| ManagedServer {
                id: s.id.clone(),
                name: name.clone(),
                vm_namespace: s.labels.get(LABEL_NAMESPACE).cloned(),
                vm_name: s.labels.get(LABEL_NAME).cloned(),
                vm_uid: s.labels.get(LABEL_UID).cloned(),
            })
            .collect())
    }

    async fn server_exists(&self, name: &str) -> Result<bool, DriverError> {
        let inner = self.begin("exists", name)?;
        Ok(inner.servers.contains_key(name))
    }

    async fn server_status(&self, name: &str) -> Result<Option<DriverServerStatus>, DriverError> {
        if !self.status_latency.is_zero() {
            tokio::time::sleep(self.status_latency).await;
        }
        let inner = self.begin("status", name)?;
        Ok(inner.servers.get(name).map(FakeServer::status))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str) -> ServerSpec {
        ServerSpec {
            name: name.into(),
            vm_namespace: "ns".into(),
            vm_name: "vm".into(),
            vm_uid: "u".into(),
            cpu_millis: 1000,
            memory_bytes: 1 << 20,
        }
    }

    #[tokio::test]
    async fn create_adopts_an_existing_server_and_delete_is_idempotent() {
        let driver = FakeDriver::new();
        let first = driver.create_server(&spec("a")).await.unwrap();
        let again = driver.create_server(&spec("a")).await.unwrap();
        assert_eq!(first.status.id, again.status.id);
        assert_eq!((first.adopted, again.adopted), (false, true));
        assert_eq!(driver.server_names(), vec!["a".to_string()]);
        assert_eq!(
            driver.delete_server("a", "u").await.unwrap(),
            DeleteOutcome::Deleted {
                id: first.status.id
            }
        );
        assert_eq!(
            driver.delete_server("a", "u").await.unwrap(),
            DeleteOutcome::Absent
        );
        assert!(!driver.server_exists("a").await.unwrap());
        assert_eq!(driver.server_status("a").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_server_of_another_uid_or_none_is_neither_adopted_nor_deleted() {
        let driver = FakeDriver::new();
        let foreign = driver.insert(ServerSpec {
            vm_uid: "other".into(),
            ..spec("a")
        });
        let unlabelled = driver.insert_with_labels(spec("b"), BTreeMap::new());
        match driver.create_server(&spec("a")).await {
            Err(DriverError::NameTaken { id, found_uid, .. }) => {
                assert_eq!((id, found_uid), (foreign.clone(), Some("other".into())));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            driver.create_server(&spec("b")).await,
            Err(DriverError::NameTaken {
                found_uid: None,
                ..
            })
        ));
        assert_eq!(
            driver.delete_server(&foreign, "u").await.unwrap(),
            DeleteOutcome::NotOwned {
                id: foreign.clone(),
                found_uid: Some("other".into())
            }
        );
        assert!(matches!(
            driver.delete_server("b", "u").await.unwrap(),
            DeleteOutcome::NotOwned {
                found_uid: None,
                ..
            }
        ));
        assert_eq!(driver.server_names(), vec!["a".to_string(), "b".into()]);
        // Only the labelled one is listed as managed.
        let listed = driver.list_servers().await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].id.as_str(), listed[0].vm_uid.as_deref()),
            (foreign.as_str(), Some("other"))
        );
        assert_ne!(unlabelled, foreign);
    }

    #[tokio::test]
    async fn injected_failures_and_outages_surface_as_errors() {
        let driver = FakeDriver::new();
        driver.fail_creates(1);
        assert!(matches!(
            driver.create_server(&spec("a")).await,
            Err(DriverError::Engine { .. })
        ));
        assert!(driver.create_server(&spec("a")).await.is_ok());
        driver.set_unreachable(true);
        let err = driver.server_exists("a").await.unwrap_err();
        assert!(
            err.to_string().contains("fake engine is unreachable"),
            "{err}"
        );
        driver.set_unreachable(false);
        assert!(driver.vanish("a"));
        assert!(!driver.server_exists("a").await.unwrap());
    }
}
