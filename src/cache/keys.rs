//! Object keys: client-go `tools/cache/store.go`'s key functions.
//!
//! A key is `namespace/name` for namespaced objects and `name` for cluster-scoped ones
//! (`MetaNamespaceKeyFunc`). [`split_meta_namespace_key`] accepts exactly one or two parts.
//! A leaf: the store, the queues and the compact store's list builder all key objects.

use std::sync::Arc;

use kube_client::Resource;

/// Why an object or a key could not be turned into a cache key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// The object has no `metadata.name` (kind given for the message).
    #[error("cannot compute a cache key for a {kind} without metadata.name")]
    MissingName {
        /// The object's kind.
        kind: String,
    },
    /// A key with zero or more than two `/`-separated parts.
    #[error("unexpected key format {key:?}: want \"name\" or \"namespace/name\"")]
    UnexpectedKeyFormat {
        /// The key that was given.
        key: String,
    },
}

/// Computes the cache key of an object.
pub type KeyFunc<K> = Arc<dyn Fn(&K) -> Result<String, KeyError> + Send + Sync>;

/// client-go: `MetaNamespaceKeyFunc`.
pub fn meta_namespace_key<K: Resource>(obj: &K) -> Result<String, KeyError> {
    let meta = obj.meta();
    let name = match meta.name.as_deref() {
        Some(n) if !n.is_empty() => n,
        _ => {
            return Err(KeyError::MissingName { kind: kind_of(obj) });
        }
    };
    Ok(match meta.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    })
}

/// The default [`KeyFunc`] for any Kubernetes resource.
pub fn default_key_func<K: Resource>() -> KeyFunc<K> {
    Arc::new(|obj: &K| meta_namespace_key(obj))
}

/// client-go: `SplitMetaNamespaceKey`. Returns `(namespace, name)`; the namespace is empty
/// for cluster-scoped keys.
pub fn split_meta_namespace_key(key: &str) -> Result<(&str, &str), KeyError> {
    let mut parts = key.split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, None) => Ok(("", name)),
        (Some(ns), Some(name), None) => Ok((ns, name)),
        _ => Err(KeyError::UnexpectedKeyFormat {
            key: key.to_string(),
        }),
    }
}

/// Builds a key from parts (`ObjectName.String()` in client-go).
pub fn object_key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_string()
    } else {
        format!("{namespace}/{name}")
    }
}

/// The resourceVersion of an object, "" if unset.
pub fn resource_version<K: Resource>(obj: &K) -> &str {
    obj.meta().resource_version.as_deref().unwrap_or("")
}

/// The Rust type name of an object (last path segment), for error messages.
pub(crate) fn kind_of<K: Resource>(obj: &K) -> String {
    let _ = obj;
    std::any::type_name::<K>()
        .rsplit("::")
        .next()
        .unwrap_or("object")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube_client::api::ObjectMeta;

    // kubeloop's own: MetaNamespaceKeyFunc's keys
    #[test]
    fn keys_are_namespace_slash_name_or_name() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("a".into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(meta_namespace_key(&cm).unwrap(), "ns/a");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(meta_namespace_key(&ns).unwrap(), "ns");
        let err = meta_namespace_key(&ConfigMap::default()).unwrap_err();
        assert!(err.to_string().contains("ConfigMap"), "{err}");
    }

    // kubeloop's own: SplitMetaNamespaceKey
    #[test]
    fn split_accepts_one_or_two_parts() {
        assert_eq!(split_meta_namespace_key("a/b").unwrap(), ("a", "b"));
        assert_eq!(split_meta_namespace_key("b").unwrap(), ("", "b"));
        assert!(split_meta_namespace_key("a/b/c").is_err());
        let err = split_meta_namespace_key("a/b/c").unwrap_err();
        assert!(err.to_string().contains("a/b/c"));
    }
}
