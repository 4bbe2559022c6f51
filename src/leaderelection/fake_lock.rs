//! An in-memory lease lock for unit tests of code built on the elector (client-go's tests use
//! the fake clientset with reactors for the same purpose).
//!
//! [`FakeLockStore`] plays the apiserver: one record, a version bumped on every write, and the
//! same resourceVersion precondition as the real Lease (an update based on an old version fails
//! with [`LockError::Conflict`]). Each candidate gets its own [`FakeLock`] from
//! [`FakeLockStore::lock_for`], remembering the version it last saw, as `LeaseLock` remembers
//! the object, and the version of its own last write, so that it answers
//! [`ResourceLock::last_read_is_own_write`] as `LeaseLock` does. Several locks may share one
//! identity: that is how a test shows two processes started with the same identity.
//!
//! What a test can do to the "apiserver":
//! - write the record as another host (or a human) would: [`FakeLockStore::put`];
//! - change the object without changing the record, as `kubectl annotate` would:
//!   [`FakeLockStore::touch`];
//! - cut one identity off: [`Reach::Refuse`] (fast errors) or [`Reach::Hang`] (requests that
//!   never answer), with [`FakeLockStore::set_reach`];
//! - read the record and the log of operations it served ([`FakeLockStore::ops_of`]).
//!
//! The store has no notion of time: run tests on paused tokio time and the elector's timing is
//! exact. Nothing that claims real apiserver behaviour is tested with this; see
//! tests/leaderelection_*.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use kubeloop::testing::FakeLockStore;
//! use kubeloop::leaderelection::{LeaderElectionRecord, ResourceLock};
//!
//! let store = FakeLockStore::new();
//! let lock = store.lock_for("pod-a");
//! let record = LeaderElectionRecord { holder_identity: "pod-a".into(), lease_duration_seconds: 15, ..Default::default() };
//! lock.create(&record).await.unwrap();
//! assert_eq!(store.holder(), "pod-a");
//! assert_eq!(store.ops_of("pod-a"), ["create-ok"]);
//! # }
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::resource_lock::{LeaderElectionRecord, LockError, ResourceLock};

/// How the fake apiserver answers one identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reach {
    /// Requests are served (the default).
    Up,
    /// Requests fail at once with [`LockError::Unavailable`] (logged as `refused`).
    Refuse,
    /// Requests never answer (logged as `refused`); the caller's timeouts must end them.
    Hang,
}

/// The shared "apiserver" side: one optional record and its version. Cheap to clone; clones
/// share the same object.
#[derive(Clone, Default)]
pub struct FakeLockStore {
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

/// One candidate's handle on a [`FakeLockStore`], implementing [`ResourceLock`].
pub struct FakeLock {
    store: FakeLockStore,
    identity: String,
    versions: Mutex<Versions>,
}

/// What a [`FakeLock`] remembers (`LeaseLock` keeps the object for this).
#[derive(Default)]
struct Versions {
    /// Version this lock last read or wrote.
    seen: Option<u64>,
    /// Version of this lock's own last successful create or update.
    written: Option<u64>,
}

impl FakeLockStore {
    /// A store without an object (the first candidate creates it).
    pub fn new() -> Self {
        Self::default()
    }

    /// A store whose object already holds `record`, written by nobody among the test's locks.
    pub fn with_record(record: LeaderElectionRecord) -> Self {
        let store = Self::new();
        store.put(record);
        store
    }

    /// A lock contending as `identity`. Two locks with the same identity are two processes
    /// sharing that identity: each remembers only its own reads and writes.
    pub fn lock_for(&self, identity: &str) -> FakeLock {
        FakeLock {
            store: self.clone(),
            identity: identity.to_string(),
            versions: Mutex::default(),
        }
    }

    /// Writes the record directly, as another host (or a human) would; bumps the version.
    pub fn put(&self, record: LeaderElectionRecord) {
        let mut s = self.inner.lock();
        s.version += 1;
        s.object = Some((record, s.version));
    }

    /// Bumps the version without changing the record, as a metadata-only change
    /// (`kubectl annotate lease ...`) does: every lock's next update conflicts, and the record
    /// it then reads is the same as before. No-op without an object.
    pub fn touch(&self) {
        let mut s = self.inner.lock();
        let next = s.version + 1;
        if let Some((_, v)) = s.object.as_mut() {
            *v = next;
            s.version = next;
        }
    }

    /// The stored record; `None` if there is no object.
    pub fn record(&self) -> Option<LeaderElectionRecord> {
        self.inner.lock().object.as_ref().map(|(r, _)| r.clone())
    }

    /// The object's version (its resourceVersion); `None` if there is no object.
    pub fn version(&self) -> Option<u64> {
        self.inner.lock().object.as_ref().map(|(_, v)| *v)
    }

    /// Deletes the object if its version is still `version` (a delete with a resourceVersion
    /// precondition); true if it did.
    pub fn delete_if_version(&self, version: u64) -> bool {
        let mut s = self.inner.lock();
        if s.object.as_ref().is_some_and(|(_, v)| *v == version) {
            s.object = None;
            return true;
        }
        false
    }

    /// The stored holder identity; "" if nobody holds the lease or there is no object.
    pub fn holder(&self) -> String {
        self.record().map(|r| r.holder_identity).unwrap_or_default()
    }

    /// How requests by `identity` are answered from now on (all locks with that identity).
    pub fn set_reach(&self, identity: &str, reach: Reach) {
        self.inner.lock().reach.insert(identity.to_string(), reach);
    }

    /// Operations served so far for one identity, in order: `get`, `create-ok`,
    /// `create-conflict`, `update-ok`, `update-conflict`, `update-uninitialized`, `refused`.
    pub fn ops_of(&self, identity: &str) -> Vec<&'static str> {
        self.inner
            .lock()
            .ops
            .iter()
            .filter(|(id, _)| id == identity)
            .map(|(_, op)| *op)
            .collect()
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
            Reach::Refuse => Err(LockError::Unavailable {
                lock: self.describe(),
                reason: format!("{op} refused"),
            }),
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
        self.versions.lock().seen = object.as_ref().map(|(_, v)| *v);
        Ok(object.map(|(r, _)| r))
    }

    async fn create(&self, record: &LeaderElectionRecord) -> Result<(), LockError> {
        self.enter("create").await?;
        let mut s = self.store.inner.lock();
        if s.object.is_some() {
            self.log(&mut s, "create-conflict");
            return Err(LockError::AlreadyExists {
                lock: self.describe(),
            });
        }
        self.log(&mut s, "create-ok");
        s.version += 1;
        s.object = Some((record.clone(), s.version));
        *self.versions.lock() = Versions {
            seen: Some(s.version),
            written: Some(s.version),
        };
        Ok(())
    }

    async fn update(&self, record: &LeaderElectionRecord) -> Result<(), LockError> {
        self.enter("update").await?;
        let seen = self.versions.lock().seen;
        let mut s = self.store.inner.lock();
        let Some(seen) = seen else {
            self.log(&mut s, "update-uninitialized");
            return Err(LockError::NotInitialized {
                lock: self.describe(),
            });
        };
        let current = s.object.as_ref().map(|(_, v)| *v);
        if current != Some(seen) {
            self.log(&mut s, "update-conflict");
            return Err(LockError::Conflict {
                lock: self.describe(),
            });
        }
        self.log(&mut s, "update-ok");
        // Like the apiserver, a write that changes nothing keeps the version.
        if s.object.as_ref().map(|(r, _)| r) != Some(record) {
            s.version += 1;
            s.object = Some((record.clone(), s.version));
        }
        let version = s.object.as_ref().map(|(_, v)| *v);
        *self.versions.lock() = Versions {
            seen: version,
            written: version,
        };
        Ok(())
    }

    fn last_read_is_own_write(&self) -> bool {
        let v = self.versions.lock();
        v.seen.is_some() && v.seen == v.written
    }

    fn identity(&self) -> &str {
        &self.identity
    }

    fn describe(&self) -> String {
        "fake/lease".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(holder: &str) -> LeaderElectionRecord {
        LeaderElectionRecord {
            holder_identity: holder.into(),
            lease_duration_seconds: 10,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn a_lock_knows_its_own_write_from_a_namesakes() {
        let store = FakeLockStore::new();
        let (first, second) = (store.lock_for("a"), store.lock_for("a"));
        first.create(&held_by("a")).await.unwrap();
        first.get().await.unwrap();
        assert!(first.last_read_is_own_write());
        second.get().await.unwrap();
        assert!(
            !second.last_read_is_own_write(),
            "same identity, but the other lock wrote it"
        );
        second.update(&held_by("a")).await.unwrap(); // a no-op write keeps the version...
        first.get().await.unwrap();
        assert!(
            first.last_read_is_own_write(),
            "...so the record is still first's write"
        );
        let mut changed = held_by("a");
        changed.leader_transitions = 1;
        second.update(&changed).await.unwrap();
        first.get().await.unwrap();
        assert!(!first.last_read_is_own_write());
        assert!(second.last_read_is_own_write());
    }

    #[tokio::test]
    async fn touch_moves_the_version_but_keeps_the_record() {
        let store = FakeLockStore::new();
        let lock = store.lock_for("a");
        lock.create(&held_by("a")).await.unwrap();
        store.touch();
        assert_eq!(store.record(), Some(held_by("a")));
        let err = lock.update(&held_by("a")).await.unwrap_err();
        assert!(matches!(err, LockError::Conflict { .. }), "{err}");
        assert_eq!(lock.get().await.unwrap(), Some(held_by("a")));
        assert!(!lock.last_read_is_own_write());
        assert_eq!(store.ops_of("a"), ["create-ok", "update-conflict", "get"]);
    }
}
