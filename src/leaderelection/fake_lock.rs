//! An in-memory lock for unit tests of the elector's state logic (client-go's tests use the fake
//! clientset with reactors for the same purpose).
//!
//! [`FakeLockStore`] plays the apiserver: one record, a version bumped on every write, and the
//! same resourceVersion precondition as the real Lease (an update based on an old version fails
//! with [`LockError::Conflict`]). Each candidate gets its own [`FakeLock`] remembering the version
//! it last saw, as `LeaseLock` remembers the object. Tests can cut one candidate off
//! (`Refuse` = fast errors, `Hang` = requests that never answer) and read the log of operations.
//!
//! Nothing that claims real apiserver behaviour is tested with this; see tests/leaderelection_*.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::resource_lock::{LeaderElectionRecord, LockError, ResourceLock};

/// How the fake apiserver answers one candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reach {
    Up,
    Refuse,
    Hang,
}

/// The shared "apiserver" side.
#[derive(Clone, Default)]
pub(crate) struct FakeLockStore {
    inner: Arc<Mutex<StoreInner>>,
}

#[derive(Default)]
struct StoreInner {
    /// The stored record and its version; `None` = no object.
    object: Option<(LeaderElectionRecord, u64)>,
    /// Last version handed out (versions are never reused).
    version: u64,
    /// `(identity, op)` in the order the store served them; refused calls are logged too.
    ops: Vec<(String, &'static str)>,
    reach: HashMap<String, Reach>,
}

/// One candidate's handle.
pub(crate) struct FakeLock {
    store: FakeLockStore,
    identity: String,
    /// Version this candidate last read or wrote (`LeaseLock` keeps the object for this).
    seen: Mutex<Option<u64>>,
}

impl FakeLockStore {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn with_record(record: LeaderElectionRecord) -> Self {
        let store = Self::new();
        store.put(record);
        store
    }

    pub(crate) fn lock_for(&self, identity: &str) -> FakeLock {
        FakeLock { store: self.clone(), identity: identity.to_string(), seen: Mutex::new(None) }
    }

    /// Writes the record directly, as another host (or a human) would; bumps the version.
    pub(crate) fn put(&self, record: LeaderElectionRecord) {
        let mut s = self.inner.lock();
        s.version += 1;
        s.object = Some((record, s.version));
    }

    pub(crate) fn record(&self) -> Option<LeaderElectionRecord> {
        self.inner.lock().object.as_ref().map(|(r, _)| r.clone())
    }

    pub(crate) fn holder(&self) -> String {
        self.record().map(|r| r.holder_identity).unwrap_or_default()
    }

    pub(crate) fn set_reach(&self, identity: &str, reach: Reach) {
        self.inner.lock().reach.insert(identity.to_string(), reach);
    }

    /// Operations served so far, as `op` names, for one identity.
    pub(crate) fn ops_of(&self, identity: &str) -> Vec<&'static str> {
        self.inner.lock().ops.iter().filter(|(id, _)| id == identity).map(|(_, op)| *op).collect()
    }
}

impl FakeLock {
    /// Logs the call and applies the reachability rule; `Ok(())` means "serve it".
    async fn enter(&self, op: &'static str) -> Result<(), LockError> {
        let reach = {
            let mut s = self.store.inner.lock();
            let reach = s.reach.get(&self.identity).copied().unwrap_or(Reach::Up);
            if reach != Reach::Up {
                s.ops.push((self.identity.clone(), "refused"));
            }
            reach
        };
        match reach {
            Reach::Up => Ok(()),
            Reach::Refuse => Err(LockError::Unavailable { lock: self.describe(), reason: format!("{op} refused") }),
            Reach::Hang => std::future::pending().await,
        }
    }

    fn log(&self, s: &mut StoreInner, op: &'static str) {
        s.ops.push((self.identity.clone(), op));
    }
}

impl ResourceLock for FakeLock {
    async fn get(&self) -> Result<Option<LeaderElectionRecord>, LockError> {
        self.enter("get").await?;
        let mut s = self.store.inner.lock();
        self.log(&mut s, "get");
        let object = s.object.clone();
        *self.seen.lock() = object.as_ref().map(|(_, v)| *v);
        Ok(object.map(|(r, _)| r))
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<(), LockError> {
        self.enter("create").await?;
        let mut s = self.store.inner.lock();
        if s.object.is_some() {
            self.log(&mut s, "create-conflict");
            return Err(LockError::AlreadyExists { lock: self.describe() });
        }
        self.log(&mut s, "create-ok");
        s.version += 1;
        s.object = Some((record.clone(), s.version));
        *self.seen.lock() = Some(s.version);
        Ok(())
    }

    async fn update(&self, record: &LeaderElectionRecord) -> Result<(), LockError> {
        self.enter("update").await?;
        let seen = *self.seen.lock();
        let mut s = self.store.inner.lock();
        let Some(seen) = seen else {
            self.log(&mut s, "update-uninitialized");
            return Err(LockError::NotInitialized { lock: self.describe() });
        };
        let current = s.object.as_ref().map(|(_, v)| *v);
        if current != Some(seen) {
            self.log(&mut s, "update-conflict");
            return Err(LockError::Conflict { lock: self.describe() });
        }
        self.log(&mut s, "update-ok");
        // Like the apiserver, a write that changes nothing keeps the version.
        if s.object.as_ref().map(|(r, _)| r) != Some(record) {
            s.version += 1;
            s.object = Some((record.clone(), s.version));
        }
        *self.seen.lock() = s.object.as_ref().map(|(_, v)| *v);
        Ok(())
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn describe(&self) -> String {
        "fake/lease".to_string()
    }
}
