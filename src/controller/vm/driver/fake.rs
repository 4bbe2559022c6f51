//! The in-memory driver (controller101's `fake` driver), for unit tests and for running the
//! controller without an engine (`--vm-driver fake`).
//!
//! Failure injection: [`FakeDriver::fail_creates`] makes the next creates fail,
//! [`FakeDriver::set_unreachable`] makes every call fail as an unreachable engine, and
//! [`FakeDriver::vanish`] removes a server behind the controller's back.
//!
//! Invariant: all state sits in one `Inner` behind one lock, never held across an `.await`
//! (the methods do not await at all).

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Driver, DriverError, ServerSpec, ServerStatus};

/// A cloneable handle to one in-memory engine.
#[derive(Clone, Default)]
pub struct FakeDriver {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    /// Servers by name.
    servers: BTreeMap<String, FakeServer>,
    next_id: u64,
    /// Creates still to fail, with the message to fail with.
    failing_creates: u32,
    unreachable: bool,
    /// Calls made, for tests: ("create" | "delete" | "exists" | "status", server name).
    calls: Vec<(&'static str, String)>,
}

/// One server of the fake engine.
#[derive(Clone, Debug, PartialEq)]
pub struct FakeServer {
    pub id: String,
    pub spec: ServerSpec,
    pub running: bool,
    pub cpu_percent: f64,
    pub memory_percent: f64,
}

const ENGINE: &str = "fake engine";

impl FakeDriver {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `n` creates fail with an engine error.
    pub fn fail_creates(&self, n: u32) {
        self.inner.lock().failing_creates = n;
    }

    /// While true, every call fails with [`DriverError::Unreachable`].
    pub fn set_unreachable(&self, unreachable: bool) {
        self.inner.lock().unreachable = unreachable;
    }

    /// Removes a server without going through the controller; returns whether it existed.
    pub fn vanish(&self, name: &str) -> bool {
        self.inner.lock().servers.remove(name).is_some()
    }

    /// Stops a server (it stays, in state `exited`).
    pub fn stop(&self, name: &str) {
        if let Some(server) = self.inner.lock().servers.get_mut(name) {
            server.running = false;
        }
    }

    /// Adds a server as if someone (or an earlier controller) had created it.
    pub fn insert(&self, spec: ServerSpec) -> String {
        let mut inner = self.inner.lock();
        let id = inner.new_id();
        inner.servers.insert(
            spec.name.clone(),
            FakeServer {
                id: id.clone(),
                spec,
                running: true,
                cpu_percent: 0.0,
                memory_percent: 0.0,
            },
        );
        id
    }

    /// Sets the usage the next status calls report.
    pub fn set_usage(&self, name: &str, cpu_percent: f64, memory_percent: f64) {
        if let Some(server) = self.inner.lock().servers.get_mut(name) {
            server.cpu_percent = cpu_percent;
            server.memory_percent = memory_percent;
        }
    }

    /// A copy of the server named `name`.
    pub fn server(&self, name: &str) -> Option<FakeServer> {
        self.inner.lock().servers.get(name).cloned()
    }

    /// Names of all servers.
    pub fn server_names(&self) -> Vec<String> {
        self.inner.lock().servers.keys().cloned().collect()
    }

    /// How many calls of `kind` ("create", "delete", "exists", "status") were made.
    pub fn calls(&self, kind: &str) -> usize {
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
}

impl FakeServer {
    fn status(&self) -> ServerStatus {
        ServerStatus {
            id: self.id.clone(),
            state: if self.running { "running" } else { "exited" }.into(),
            running: self.running,
            cpu_percent: self.cpu_percent,
            memory_percent: self.memory_percent,
            cpu_millis: self.spec.cpu_millis,
            memory_bytes: self.spec.memory_bytes,
        }
    }
}

impl Driver for FakeDriver {
    fn engine(&self) -> &str {
        ENGINE
    }

    async fn create_server(&self, spec: &ServerSpec) -> Result<ServerStatus, DriverError> {
        let mut inner = self.begin("create", &spec.name)?;
        if inner.failing_creates > 0 {
            inner.failing_creates -= 1;
            return Err(DriverError::Engine {
                engine: ENGINE.into(),
                operation: "create",
                server: spec.name.clone(),
                message: "injected failure".into(),
            });
        }
        if let Some(existing) = inner.servers.get_mut(&spec.name) {
            existing.running = true;
            return Ok(existing.status());
        }
        let id = inner.new_id();
        let server = FakeServer {
            id,
            spec: spec.clone(),
            running: true,
            cpu_percent: 0.0,
            memory_percent: 0.0,
        };
        let status = server.status();
        inner.servers.insert(spec.name.clone(), server);
        Ok(status)
    }

    async fn delete_server(&self, name: &str) -> Result<(), DriverError> {
        let mut inner = self.begin("delete", name)?;
        inner.servers.remove(name);
        Ok(())
    }

    async fn server_exists(&self, name: &str) -> Result<bool, DriverError> {
        let inner = self.begin("exists", name)?;
        Ok(inner.servers.contains_key(name))
    }

    async fn server_status(&self, name: &str) -> Result<Option<ServerStatus>, DriverError> {
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
        assert_eq!(first.id, again.id);
        assert_eq!(driver.server_names(), vec!["a".to_string()]);
        driver.delete_server("a").await.unwrap();
        driver.delete_server("a").await.unwrap();
        assert!(!driver.server_exists("a").await.unwrap());
        assert_eq!(driver.server_status("a").await.unwrap(), None);
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
