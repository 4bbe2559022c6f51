//! Named informers for metrics: client-go `tools/cache/identity.go` (`InformerName`,
//! `InformerNameAndResource`), as client-go 1.36 has them.
//!
//! An [`InformerName`] is unique in the process while it is held; a factory given one
//! ([`SharedInformerFactory::with_informer_name`](super::SharedInformerFactory::with_informer_name))
//! registers each resource it makes an informer for under it, and only the first informer of
//! a name and resource publishes the `informer_*` series (a second one logs an error and
//! publishes none, so two informers never write one series). [`InformerName::release`] (or
//! dropping every clone) stops the series of all of its informers from moving and frees the
//! name.
//!
//! Invariant: a name is taken iff `REGISTRY` has a live, reserved entry for it.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use parking_lot::Mutex;

/// The names held in this process.
static REGISTRY: LazyLock<Mutex<HashMap<String, Weak<Held>>>> = LazyLock::new(Default::default);

/// Why a name could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InformerNameError {
    /// An empty name.
    #[error("informer name cannot be empty")]
    Empty,
    /// The name is held elsewhere in the process.
    #[error("informer name {0:?} is already registered")]
    Taken(String),
}

/// A process-unique informer name (client-go `InformerName`). Cloning shares it.
#[derive(Debug, Clone)]
pub struct InformerName {
    held: Arc<Held>,
}

#[derive(Debug)]
struct Held {
    name: String,
    /// False once released.
    reserved: Arc<AtomicBool>,
    /// The resources registered under the name (group, version, resource).
    resources: Mutex<HashSet<(String, String, String)>>,
}

/// One informer's identity: a name and a resource (client-go `InformerNameAndResource`).
/// Publishes metrics only while [`reserved`](Self::reserved).
#[derive(Debug, Clone, Default)]
pub struct InformerIdentity {
    name: String,
    group: String,
    version: String,
    resource: String,
    /// `None`: no name, or a second registration of the resource.
    reserved: Option<Arc<AtomicBool>>,
}

impl InformerName {
    /// Takes `name` for this process (client-go `NewInformerName`).
    ///
    /// # Errors
    /// [`InformerNameError::Empty`]; [`InformerNameError::Taken`] while another holds it.
    pub fn new(name: &str) -> Result<Self, InformerNameError> {
        if name.is_empty() {
            return Err(InformerNameError::Empty);
        }
        let mut registry = REGISTRY.lock();
        if let Some(held) = registry.get(name).and_then(Weak::upgrade)
            && held.reserved.load(Ordering::SeqCst)
        {
            return Err(InformerNameError::Taken(name.to_string()));
        }
        let held = Arc::new(Held {
            name: name.to_string(),
            reserved: Arc::new(AtomicBool::new(true)),
            resources: Mutex::default(),
        });
        registry.insert(name.to_string(), Arc::downgrade(&held));
        Ok(InformerName { held })
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.held.name
    }

    /// Registers a resource under the name (client-go `WithResource`): the identity is
    /// reserved for the first registration of a resource, not for a repeat.
    pub fn with_resource(&self, group: &str, version: &str, resource: &str) -> InformerIdentity {
        let key = (group.to_string(), version.to_string(), resource.to_string());
        let first = self.held.reserved.load(Ordering::SeqCst)
            && self.held.resources.lock().insert(key.clone());
        if !first {
            tracing::error!(
                informer_name = %self.held.name, group, version, resource,
                "duplicate informer registration: metrics will not be published"
            );
        }
        InformerIdentity {
            name: self.held.name.clone(),
            group: key.0,
            version: key.1,
            resource: key.2,
            reserved: first.then(|| self.held.reserved.clone()),
        }
    }

    /// Frees the name; the identities made from it stop publishing (client-go `Release`).
    pub fn release(&self) {
        self.held.release();
    }
}

impl Held {
    fn release(&self) {
        self.reserved.store(false, Ordering::SeqCst);
        let mut registry = REGISTRY.lock();
        if registry
            .get(&self.name)
            .is_some_and(|w| std::ptr::eq(w.as_ptr(), self))
        {
            registry.remove(&self.name);
        }
    }
}

impl Drop for Held {
    /// Only the flag: the registry's `Weak` is dead now, which frees the name (no lock here,
    /// as `new` may drop the last handle while it holds the registry's).
    fn drop(&mut self) {
        self.reserved.store(false, Ordering::SeqCst);
    }
}

impl InformerIdentity {
    /// The informer name ("" without one).
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The resource's API group ("" for the core group).
    pub fn group(&self) -> &str {
        &self.group
    }
    /// The resource's API version.
    pub fn version(&self) -> &str {
        &self.version
    }
    /// The resource (plural).
    pub fn resource(&self) -> &str {
        &self.resource
    }
    /// Whether this identity publishes metrics (client-go `Reserved`).
    pub fn reserved(&self) -> bool {
        self.reserved
            .as_ref()
            .is_some_and(|r| r.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // client-go: TestNewInformerName, TestInformerName_WithResource, TestInformerName_Release.
    #[test]
    fn a_name_is_unique_until_released_and_a_resource_reserved_once() {
        assert_eq!(InformerName::new("").unwrap_err(), InformerNameError::Empty);
        let name = InformerName::new("identity-test").unwrap();
        assert_eq!(
            InformerName::new("identity-test").unwrap_err(),
            InformerNameError::Taken("identity-test".into())
        );
        let first = name.with_resource("", "v1", "configmaps");
        let again = name.with_resource("", "v1", "configmaps");
        let other = name.with_resource("apps", "v1", "deployments");
        assert!(first.reserved() && other.reserved());
        assert!(!again.reserved(), "a second registration publishes nothing");
        assert!(
            !InformerIdentity::default().reserved(),
            "no name: no metrics"
        );
        name.release();
        assert!(!first.reserved() && !other.reserved(), "released");
        let reused = InformerName::new("identity-test").unwrap();
        assert!(reused.with_resource("", "v1", "configmaps").reserved());
        drop(reused);
        assert!(
            InformerName::new("identity-test").is_ok(),
            "dropped: free again"
        );
    }
}
