//! client-go's data consistency detectors (`util/consistencydetector`,
//! tools/cache `reflector_data_consistency_detector.go`): after the reflector has synced, a
//! LIST served by etcd at the synced resourceVersion (`resourceVersionMatch=Exact`) is compared
//! with what the reflector handed the store.
//!
//! - `KUBE_WATCHLIST_INCONSISTENCY_DETECTOR` checks each streaming list (watch-list);
//!   `KUBE_LIST_FROM_CACHE_INCONSISTENCY_DETECTOR` each paged LIST. Both are read once per
//!   process, with Go's `strconv.ParseBool` rules, as client-go reads them at init. Unset (the
//!   default), the reflector makes no extra request.
//! - The check runs inline, before the reflector watches on, so nothing moves the compared
//!   list meanwhile; a failed LIST is retried every second until the reflector is stopped
//!   (client-go: `PollUntilContextCancel`, 1 s). It is skipped at resourceVersion "" or "0"
//!   (an Exact list cannot ask for those).
//! - The LIST is paged in the reflector's page size (continue pages read the first page's
//!   snapshot, so the result is the one unpaged list client-go makes).
//! - Compared: each object's key and resourceVersion. client-go compares whole objects
//!   sorted by UID; here the store may hold objects transformed or encoded, so key and
//!   resourceVersion are what both sides share. Objects skipped as undecodable (on either
//!   side) are left out.
//! - A difference is logged at error level naming the resource, the synced resourceVersion
//!   and every differing key, then handed to the reflector's [`InconsistencyHandler`]; the
//!   default one panics ("data inconsistency detected for ..., panicking!") as client-go
//!   does, which ends the reflector's task.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};

/// Switches the streaming-list detector on (client-go's variable).
pub const WATCH_LIST_DETECTOR_ENV: &str = "KUBE_WATCHLIST_INCONSISTENCY_DETECTOR";
/// Switches the paged-list detector on (client-go's variable).
pub const LIST_FROM_CACHE_DETECTOR_ENV: &str = "KUBE_LIST_FROM_CACHE_INCONSISTENCY_DETECTOR";

/// Which detectors a reflector runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsistencyDetectors {
    /// Check after each streaming list.
    pub watch_list: bool,
    /// Check after each paged LIST.
    pub list_from_cache: bool,
}

impl ConsistencyDetectors {
    /// As the environment sets them, read once per process.
    pub fn from_env() -> Self {
        static FROM_ENV: OnceLock<ConsistencyDetectors> = OnceLock::new();
        *FROM_ENV.get_or_init(|| Self {
            watch_list: env_bool(WATCH_LIST_DETECTOR_ENV),
            list_from_cache: env_bool(LIST_FROM_CACHE_DETECTOR_ENV),
        })
    }
}

/// Go's `strconv.ParseBool` true values; anything else (or unset) is off.
fn env_bool(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| parse_bool(&v))
}

fn parse_bool(v: &str) -> bool {
    matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True")
}

/// What differs between the cache and etcd at one resourceVersion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inconsistency {
    /// The resource type (the reflector's type description).
    pub type_name: String,
    /// The synced resourceVersion both sides were read at.
    pub resource_version: String,
    /// Keys etcd holds and the cache does not.
    pub missing: Vec<String>,
    /// Keys the cache holds and etcd does not.
    pub unexpected: Vec<String>,
    /// `(key, cached resourceVersion, etcd's resourceVersion)` where they differ.
    pub stale: Vec<(String, String, String)>,
}

impl std::fmt::Display for Inconsistency {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "data inconsistency detected for {} at resourceVersion {}: missing from the cache {:?}, \
             not in etcd {:?}, stale (key, cached, etcd) {:?}",
            self.type_name, self.resource_version, self.missing, self.unexpected, self.stale
        )
    }
}

/// Told of every difference found; the default is [`panic_on_inconsistency`].
pub type InconsistencyHandler = Arc<dyn Fn(&Inconsistency) + Send + Sync>;

/// client-go's reaction: panic.
pub fn panic_on_inconsistency(found: &Inconsistency) {
    panic!(
        "data inconsistency detected for {}, panicking!",
        found.type_name
    );
}

/// Compares `(key, resourceVersion)` pairs of the cache with etcd's, leaving out `skipped`
/// keys; `None` when they agree.
pub(crate) fn compare(
    type_name: &str,
    resource_version: &str,
    cached: Vec<(String, String)>,
    etcd: Vec<(String, String)>,
    skipped: &BTreeSet<String>,
) -> Option<Inconsistency> {
    let keep = |(k, _): &(String, String)| !skipped.contains(k);
    let cached: BTreeMap<String, String> = cached.into_iter().filter(keep).collect();
    let etcd: BTreeMap<String, String> = etcd.into_iter().filter(keep).collect();
    let missing: Vec<String> = etcd
        .keys()
        .filter(|k| !cached.contains_key(*k))
        .cloned()
        .collect();
    let unexpected: Vec<String> = cached
        .keys()
        .filter(|k| !etcd.contains_key(*k))
        .cloned()
        .collect();
    let stale: Vec<(String, String, String)> = cached
        .iter()
        .filter_map(|(k, rv)| {
            let theirs = etcd.get(k)?;
            (theirs != rv).then(|| (k.clone(), rv.clone(), theirs.clone()))
        })
        .collect();
    if missing.is_empty() && unexpected.is_empty() && stale.is_empty() {
        return None;
    }
    Some(Inconsistency {
        type_name: type_name.to_string(),
        resource_version: resource_version.to_string(),
        missing,
        unexpected,
        stale,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(p: &[(&str, &str)]) -> Vec<(String, String)> {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    #[should_panic(expected = "data inconsistency detected for v1/configmaps, panicking!")]
    fn the_default_handler_panics_as_client_go() {
        let found = compare(
            "v1/configmaps",
            "9",
            pairs(&[]),
            pairs(&[("ns/a", "1")]),
            &BTreeSet::new(),
        );
        panic_on_inconsistency(&found.unwrap());
    }

    #[test]
    fn go_parse_bool_true_values_only() {
        for v in ["1", "t", "T", "true", "TRUE", "True"] {
            assert!(parse_bool(v), "{v}");
        }
        for v in ["", "0", "false", "yes", "on", "tRUE"] {
            assert!(!parse_bool(v), "{v}");
        }
    }

    #[test]
    fn names_missing_unexpected_and_stale_keys_and_ignores_skipped_ones() {
        let etcd = pairs(&[("ns/a", "5"), ("ns/b", "6"), ("ns/c", "7"), ("ns/u", "8")]);
        let cached = pairs(&[("ns/a", "5"), ("ns/b", "3"), ("ns/x", "4"), ("ns/u", "2")]);
        let skipped = BTreeSet::from(["ns/u".to_string()]);
        let found = compare("v1/configmaps", "9", cached, etcd.clone(), &skipped).unwrap();
        assert_eq!(found.missing, ["ns/c"]);
        assert_eq!(found.unexpected, ["ns/x"]);
        assert_eq!(found.stale, [("ns/b".into(), "3".into(), "6".into())]);
        assert!(found.to_string().contains("v1/configmaps"));
        assert_eq!(compare("t", "9", etcd.clone(), etcd, &skipped), None);
    }
}
