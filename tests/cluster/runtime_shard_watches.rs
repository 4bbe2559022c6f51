//! Server-side sharded watches on a ring (issue 51): four replicas of a controller over
//! ConfigMaps in 200 namespaces, on a 4-shard ring with `ShardRing::watch_held_shards`, each
//! replica in a tokio runtime of its own (so that shutting the runtime down kills it: its
//! Leases are neither renewed nor released, as when a process dies).
//!
//! With the `ShardedListAndWatch` gate on (the shared cluster; the shards cut at bounds
//! balanced on the test's namespaces, `ShardBounds::of_namespaces`, so each holds 50) and off
//! (an apiserver of the test's own, where the informers filter what the server sends them;
//! equal hash ranges):
//! - each replica's cache holds exactly the ConfigMaps of the namespaces whose hash range is
//!   a shard it holds, and each ConfigMap is reconciled, by the replica holding its shard
//!   (the holders read from the ring's Leases; the shard of a key from its namespace, as the
//!   apiserver hashes it);
//! - a replica killed, its shards' new owners cache those ranges too and reconcile every key
//!   of them after the kill, listing those ranges alone (not the shards they kept);
//! - a replica joining, the survivor that gives it a shard drops that shard's ConfigMaps from
//!   its cache without listing anything;
//! - no key is ever reconciled by two replicas at once.
//!
//! The ConfigMaps carry a label unique to the run, so other tests' ConfigMaps on the shared
//! cluster stay out (a label selector and a shard selector together).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use kubeloop::cache::{
    CacheMetrics, FactoryOptions, ShardBounds, SharedIndexInformer, SharedInformerFactory,
};
use kubeloop::cache::{ShardScope, fnv1a_64};
use kubeloop::runtime::{
    Action, Controller, LeaseRing, ObjectKey, ReconcileContext, ShardRing, ShardingConfig,
    default_error_policy,
};
use kubeloop::testing::eventually;
use kubeloop_testenv as testenv;
use kubeloop_testenv::informer::configmap;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const NAMESPACES: usize = 200;
const SHARDS: u32 = 4;
const REPLICAS: usize = 4;
const RING: &str = "cms";
const RUN_LABEL: &str = "kubeloop.dev/shard-watch-test";
const WAIT: Duration = Duration::from_secs(90);

/// One reconcile: which replica, which key, when it started and ended (`None`: it had not
/// ended when its replica was killed).
#[derive(Clone, Debug)]
struct Reconciled {
    replica: String,
    key: String,
    start: Instant,
    end: Option<Instant>,
}

type Log = Arc<Mutex<Vec<Reconciled>>>;

/// A replica in a runtime of its own, with its cache and scope.
struct Replica {
    name: String,
    runtime: Option<tokio::runtime::Runtime>,
    stop: CancellationToken,
    done: Option<tokio::task::JoinHandle<()>>,
    scope: ShardScope,
    cache: SharedIndexInformer<ConfigMap>,
    metrics: CacheMetrics,
}

impl Replica {
    fn start(
        cluster: &testenv::Cluster,
        lease_ns: &str,
        run: &str,
        name: &str,
        bounds: &ShardBounds,
        log: Log,
    ) -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        // The client's connection pool lives in the runtime it is made in.
        let client = {
            let _in_runtime = runtime.enter();
            Client::try_from(cluster.client_config()).unwrap()
        };
        let scope = ShardScope::with_bounds(bounds.clone());
        let metrics = CacheMetrics::new();
        let factory = SharedInformerFactory::new(
            client.clone(),
            FactoryOptions {
                label_selector: Some(format!("{RUN_LABEL}={run}")),
                shard_scope: Some(scope.clone()),
                metrics: metrics.clone(),
                ..Default::default()
            },
        );
        let cache = factory.informer::<ConfigMap>();
        let ring = ShardRing::new(
            ShardingConfig {
                lease_duration: Duration::from_secs(4),
                renew_deadline: Duration::from_secs(3),
                retry_period: Duration::from_millis(500),
                ..ShardingConfig::new(RING, SHARDS, name)
            },
            LeaseRing::new(client, lease_ns),
        )
        .unwrap()
        .watch_held_shards(scope.clone())
        .unwrap();
        let controller = Controller::new(format!("shard-watch-{name}"), cache.clone())
            .sharding(ring)
            .workers(2);
        let replica = name.to_string();
        let reconcile = move |key: ObjectKey, _ctx: ReconcileContext| {
            let (log, replica) = (log.clone(), replica.clone());
            async move {
                let at = {
                    let mut log = log.lock();
                    log.push(Reconciled {
                        replica,
                        key: key.to_string(),
                        start: Instant::now(),
                        end: None,
                    });
                    log.len() - 1
                };
                // Long enough that two replicas working on one key at once would overlap.
                tokio::time::sleep(Duration::from_millis(20)).await;
                log.lock()[at].end = Some(Instant::now());
                Ok::<_, std::convert::Infallible>(Action::Done)
            }
        };
        let stop = CancellationToken::new();
        let done = runtime.spawn({
            let stop = stop.clone();
            async move {
                controller
                    .run(reconcile, default_error_policy, stop)
                    .await
                    .unwrap();
            }
        });
        Replica {
            name: name.to_string(),
            runtime: Some(runtime),
            stop,
            done: Some(done),
            scope,
            cache,
            metrics,
        }
    }

    /// The ConfigMaps its informer's LISTs brought so far.
    fn listed(&self) -> u64 {
        self.metrics.reflector("v1/configmaps").listed_objects()
    }

    /// The keys its cache holds.
    fn cached(&self) -> BTreeSet<String> {
        self.cache
            .lister()
            .list(&Default::default())
            .iter()
            .map(|cm| key(cm))
            .collect()
    }

    /// Shuts its runtime down: no task of it runs again, nothing is released.
    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }

    /// A clean stop (its shards released).
    async fn stop(&mut self) {
        self.stop.cancel();
        if let Some(done) = self.done.take() {
            let _ = tokio::time::timeout(WAIT, done).await;
        }
        self.kill();
    }
}

impl Drop for Replica {
    /// A runtime must not be dropped where the test's runtime runs: shut it down instead.
    fn drop(&mut self) {
        self.kill();
    }
}

fn key(cm: &ConfigMap) -> String {
    format!(
        "{}/{}",
        cm.metadata.namespace.as_deref().unwrap_or_default(),
        cm.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The shard of a key, by its namespace's hash as the apiserver computes it.
fn shard_of(bounds: &ShardBounds, key: &str) -> u32 {
    let namespace = key.split_once('/').map_or("", |(ns, _)| ns);
    bounds.index_of(fnv1a_64(namespace.as_bytes()))
}

/// The holder of each shard's Lease ("" for none).
async fn holders(client: &Client, lease_ns: &str) -> Vec<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), lease_ns);
    let mut holders = Vec::new();
    for shard in 0..SHARDS {
        holders.push(
            leases
                .get_opt(&format!("{RING}-shard-{shard}"))
                .await
                .unwrap()
                .and_then(|l| l.spec)
                .and_then(|s| s.holder_identity)
                .unwrap_or_default(),
        );
    }
    holders
}

/// Every live replica holds the shards its Leases say, in Leases and in its scope, and
/// caches exactly the keys of those shards; `None` if not (yet), with what differs.
async fn settled(
    client: &Client,
    lease_ns: &str,
    replicas: &[&Replica],
    keys: &BTreeSet<String>,
    bounds: &ShardBounds,
) -> Result<Vec<String>, String> {
    let holders = holders(client, lease_ns).await;
    for replica in replicas {
        let leased: Vec<u32> = (0..SHARDS)
            .filter(|s| holders[*s as usize] == replica.name)
            .collect();
        if leased.is_empty() || replica.scope.held() != leased {
            return Err(format!(
                "{}: Leases {leased:?}, scope {:?}",
                replica.name,
                replica.scope.held()
            ));
        }
        let expected: BTreeSet<String> = keys
            .iter()
            .filter(|k| leased.contains(&shard_of(bounds, k)))
            .cloned()
            .collect();
        let cached = replica.cached();
        if cached != expected {
            return Err(format!(
                "{}: caches {} keys, its shards {leased:?} have {} ({} missing, {} extra)",
                replica.name,
                cached.len(),
                expected.len(),
                expected.difference(&cached).count(),
                cached.difference(&expected).count()
            ));
        }
    }
    if holders
        .iter()
        .any(|h| !replicas.iter().any(|r| r.name == *h))
    {
        return Err(format!(
            "a shard is not held by a live replica: {holders:?}"
        ));
    }
    Ok(holders)
}

async fn wait_settled(
    client: &Client,
    lease_ns: &str,
    replicas: &[&Replica],
    keys: &BTreeSet<String>,
    bounds: &ShardBounds,
) -> Vec<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        match settled(client, lease_ns, replicas, keys, bounds).await {
            Ok(holders) => return holders,
            Err(why) if Instant::now() > deadline => panic!("never settled: {why}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Reconciles of two replicas of one key that overlap in time (an open one ends at `killed`).
fn overlaps(log: &[Reconciled], killed: Instant) -> Vec<(Reconciled, Reconciled)> {
    let mut by_key: BTreeMap<&str, Vec<&Reconciled>> = BTreeMap::new();
    for r in log {
        by_key.entry(&r.key).or_default().push(r);
    }
    let mut found = Vec::new();
    for runs in by_key.values() {
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                let (a_end, b_end) = (a.end.unwrap_or(killed), b.end.unwrap_or(killed));
                if a.replica != b.replica && a.start < b_end && b.start < a_end {
                    found.push(((*a).clone(), (*b).clone()));
                }
            }
        }
    }
    found
}

/// `balanced`: the shards cut at bounds balanced on the namespaces made here; else equal
/// hash ranges.
async fn four_replicas_cache_and_reconcile_only_their_shards(
    cluster: &testenv::Cluster,
    balanced: bool,
) {
    let client = cluster.client().await.unwrap();
    let lease_ns = cluster.new_namespace("shard-watch").await.unwrap();
    let run = lease_ns.clone();
    let mut namespaces = Vec::new();
    for _ in 0..NAMESPACES / 20 {
        let made = futures::future::join_all((0..20).map(|_| cluster.new_namespace("sw")));
        for ns in made.await {
            namespaces.push(ns.unwrap());
        }
    }
    let bounds = if balanced {
        ShardBounds::of_namespaces(namespaces.iter().map(|ns| (ns.as_str(), 1)), SHARDS).unwrap()
    } else {
        ShardBounds::even(SHARDS).unwrap()
    };
    let per_shard = namespaces
        .iter()
        .fold([0usize; SHARDS as usize], |mut n, ns| {
            n[shard_of(&bounds, &format!("{ns}/x")) as usize] += 1;
            n
        });
    assert!(
        per_shard.iter().all(|n| *n > 0),
        "every shard has namespaces: {per_shard:?}"
    );
    if balanced {
        assert_eq!(per_shard, [NAMESPACES / SHARDS as usize; SHARDS as usize]);
    }

    let log: Log = Arc::default();
    let mut replicas: Vec<Replica> = (0..REPLICAS)
        .map(|i| {
            Replica::start(
                cluster,
                &lease_ns,
                &run,
                &format!("replica-{i}"),
                &bounds,
                log.clone(),
            )
        })
        .collect();
    // One shard each before any ConfigMap exists, so that each is seen first by its owner.
    let none = BTreeSet::new();
    wait_settled(
        &client,
        &lease_ns,
        &replicas.iter().collect::<Vec<_>>(),
        &none,
        &bounds,
    )
    .await;

    let mut keys = BTreeSet::new();
    for chunk in namespaces.chunks(20) {
        let made = futures::future::join_all(chunk.iter().map(|ns| {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
            let run = &run;
            async move {
                api.create(
                    &PostParams::default(),
                    &configmap("cm", &[(RUN_LABEL, run)], "x"),
                )
                .await
            }
        }));
        for created in made.await {
            keys.insert(key(&created.unwrap()));
        }
    }
    let all: Vec<&Replica> = replicas.iter().collect();
    let holders = wait_settled(&client, &lease_ns, &all, &keys, &bounds).await;
    eventually("every ConfigMap reconciled", WAIT, || async {
        let log = log.lock();
        keys.iter()
            .all(|k| log.iter().any(|r| r.key == *k && r.end.is_some()))
    })
    .await;
    for r in log.lock().iter() {
        assert_eq!(
            r.replica,
            holders[shard_of(&bounds, &r.key) as usize],
            "{} was reconciled by {}, not by the holder of its shard {} ({holders:?})",
            r.key,
            r.replica,
            shard_of(&bounds, &r.key)
        );
    }

    // Kill the holder of shard 0: its shards move to the others, which list those ranges and
    // reconcile every key of them.
    let victim = replicas
        .iter()
        .position(|r| r.name == holders[0])
        .expect("shard 0 is held by a replica");
    let lost: Vec<u32> = (0..SHARDS)
        .filter(|s| holders[*s as usize] == holders[0])
        .collect();
    let listed: Vec<u64> = replicas.iter().map(Replica::listed).collect();
    let killed = Instant::now();
    replicas[victim].kill();
    let survivors: Vec<&Replica> = replicas.iter().filter(|r| r.runtime.is_some()).collect();
    let after = wait_settled(&client, &lease_ns, &survivors, &keys, &bounds).await;
    let lost_keys: Vec<&String> = keys
        .iter()
        .filter(|k| lost.contains(&shard_of(&bounds, k)))
        .collect();
    assert!(!lost_keys.is_empty());
    eventually(
        "every key of the lost shards reconciled by its new owner",
        WAIT,
        || async {
            let log = log.lock();
            lost_keys.iter().all(|k| {
                log.iter().any(|r| {
                    r.key == **k
                        && r.start > killed
                        && r.end.is_some()
                        && r.replica == after[shard_of(&bounds, k) as usize]
                })
            })
        },
    )
    .await;

    // Each survivor listed what it gained alone (`ListerWatcher::prepare_selection_change`), not
    // the shards it kept: at most the gained ConfigMaps (fewer when some were created after
    // the version its store was at, which the watch from that version brings).
    for (replica, before) in replicas
        .iter()
        .zip(listed)
        .filter(|(r, _)| r.runtime.is_some())
    {
        let gained = lost_keys
            .iter()
            .filter(|k| after[shard_of(&bounds, k) as usize] == replica.name)
            .count() as u64;
        let listed = replica.listed() - before;
        assert!(
            listed <= gained,
            "{} listed {listed} ConfigMaps after the kill; it gained {gained}",
            replica.name,
        );
    }

    // A replica joins: the survivor holding two shards gives one up to it and drops that
    // shard's ConfigMaps from its cache without listing anything (`ReflectorStore::release`;
    // `wait_settled` checks each cache holds exactly its shards); only the newcomer lists.
    let listed: Vec<u64> = replicas.iter().map(Replica::listed).collect();
    replicas.push(Replica::start(
        cluster,
        &lease_ns,
        &run,
        "replica-joined",
        &bounds,
        log.clone(),
    ));
    let live: Vec<&Replica> = replicas.iter().filter(|r| r.runtime.is_some()).collect();
    let joined = wait_settled(&client, &lease_ns, &live, &keys, &bounds).await;
    assert!(
        joined.iter().any(|h| h == "replica-joined"),
        "the newcomer took a shard a survivor gave up: {after:?} -> {joined:?}"
    );
    for (replica, before) in replicas
        .iter()
        .zip(listed)
        .filter(|(r, _)| r.runtime.is_some())
    {
        assert_eq!(
            replica.listed(),
            before,
            "{} listed ConfigMaps when a replica joined; it only gave shards up",
            replica.name
        );
    }

    let found = overlaps(&log.lock(), killed);
    assert!(
        found.is_empty(),
        "reconciles of two replicas overlapped: {:?}",
        &found[..found.len().min(3)]
    );
    for replica in &mut replicas {
        replica.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_gate_on_each_replica_lists_watches_and_reconciles_only_its_shards() {
    four_replicas_cache_and_reconcile_only_their_shards(testenv::shared().await, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_gate_off_the_same_through_the_informers_own_filter() {
    let cluster = testenv::Cluster::start(
        testenv::ClusterOptions::apiserver_only()
            .with_feature_gate(testenv::SHARDED_LIST_AND_WATCH, false),
    )
    .await
    .unwrap();
    four_replicas_cache_and_reconcile_only_their_shards(&cluster, false).await;
}
