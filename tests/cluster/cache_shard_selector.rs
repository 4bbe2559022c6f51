//! KEP-5866's sharded list and watch on the real apiserver (issue 51): ConfigMaps in 40
//! namespaces, and an informer given shard 0 of a 4-shard ring by namespace caches exactly
//! those whose namespace hashes into it by our FNV-1a 64, on its list and on its watch,
//! whichever way it lists (LIST or streaming list).
//!
//! With the `ShardedListAndWatch` gate on (the shared cluster) the apiserver filters: its own
//! LIST answer holds exactly the namespaces `ShardSelector::contains` picks, and echoes the
//! selector in `metadata.shardInfo` (read from JSON and from protobuf). With the gate off (an
//! apiserver of this test's own) the apiserver sends everything and no echo, and the
//! informer's own filter gives the same cache.
//!
//! The test's ConfigMaps carry a label unique to the run, so ConfigMaps of other tests on the
//! shared cluster stay out of the comparison (the label selector is the apiserver's, with the
//! gate or without).

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_client::Client;
use kube_client::api::{Api, PostParams};
use kubeloop::cache::{
    HashRange, InformerConfig, ListOptions, ListWatch, ListerWatcher, ReflectorConfig,
    ShardSelector, SharedIndexInformer, Wire, fnv1a_64,
};
use kubeloop::testing::eventually;
use kubeloop_testenv as testenv;
use kubeloop_testenv::informer::configmap;

const NAMESPACES: usize = 40;
const RUN_LABEL: &str = "kubeloop.dev/shard-test";

/// The test's namespaces, the label value its ConfigMaps carry, and the ConfigMaps created
/// after the first informer started (keys, with their namespaces).
struct Fixture {
    namespaces: Vec<String>,
    run: String,
    late: Vec<(String, String)>,
}

impl Fixture {
    /// One ConfigMap, `cm`, in each of [`NAMESPACES`] new namespaces.
    async fn create(cluster: &testenv::Cluster, client: &Client) -> Self {
        let mut namespaces = Vec::new();
        for _ in 0..NAMESPACES {
            namespaces.push(cluster.new_namespace("shard").await.unwrap());
        }
        let run = namespaces[0].clone();
        for ns in &namespaces {
            Api::<ConfigMap>::namespaced(client.clone(), ns)
                .create(
                    &PostParams::default(),
                    &configmap("cm", &[(RUN_LABEL, &run)], "x"),
                )
                .await
                .unwrap();
        }
        Self {
            namespaces,
            run,
            late: Vec::new(),
        }
    }

    fn label_selector(&self) -> String {
        format!("{RUN_LABEL}={}", self.run)
    }

    /// The cache keys of the fixture's ConfigMaps whose namespace `shard` selects.
    fn expected(&self, shard: &ShardSelector) -> BTreeSet<String> {
        let first = self.namespaces.iter().map(|ns| (ns, format!("{ns}/cm")));
        let late = self.late.iter().map(|(ns, key)| (ns, key.clone()));
        first
            .chain(late)
            .filter(|(ns, _)| shard.contains(ns))
            .map(|(_, key)| key)
            .collect()
    }
}

fn shard_zero_of_four() -> ShardSelector {
    ShardSelector::namespaces([HashRange::ring(4, 0).unwrap()]).unwrap()
}

/// The apiserver's own answer to a JSON LIST of every ConfigMap of the run with `selector`:
/// the namespaces of its items, and its `metadata.shardInfo.selector`.
async fn server_list(
    client: &Client,
    fixture: &Fixture,
    selector: &ShardSelector,
) -> (BTreeSet<String>, Option<String>) {
    let url = ListWatch::<ConfigMap>::all(client.clone())
        .labels(&fixture.label_selector())
        .shards(selector.clone())
        .list_url(&ListOptions::default());
    let request = http::Request::get(url).body(Vec::new()).unwrap();
    let list: k8s_openapi::List<ConfigMap> = client.request(request).await.unwrap();
    let namespaces = list
        .items
        .iter()
        .map(|cm| cm.metadata.namespace.clone().unwrap())
        .collect();
    (
        namespaces,
        list.metadata.shard_info.map(|info| info.selector),
    )
}

/// An informer over every namespace with the run's label and `shard`, listing by LIST or by
/// streaming list; the keys it caches once synced.
async fn sharded_informer(
    client: &Client,
    fixture: &Fixture,
    shard: &ShardSelector,
    use_watch_list: bool,
) -> SharedIndexInformer<ConfigMap> {
    let lw = ListWatch::<ConfigMap>::all(client.clone())
        .labels(&fixture.label_selector())
        .shards(shard.clone());
    let informer = SharedIndexInformer::new(
        lw,
        InformerConfig {
            reflector: ReflectorConfig {
                use_watch_list,
                ..Default::default()
            },
            ..Default::default()
        },
    );
    informer.start();
    assert!(informer.wait_for_cache_sync().await);
    informer
}

fn cached(informer: &SharedIndexInformer<ConfigMap>) -> BTreeSet<String> {
    informer.indexer().list_keys().into_iter().collect()
}

/// The informer's cache is exactly the fixture's shard, after its list and after a ConfigMap
/// is created outside the shard and then one inside (watch events arrive in order, so once
/// the second is cached the first would have been too, had it passed).
async fn check_informer(
    cluster: &testenv::Cluster,
    client: &Client,
    fixture: &mut Fixture,
    shard: &ShardSelector,
    use_watch_list: bool,
) {
    let informer = sharded_informer(client, fixture, shard, use_watch_list).await;
    assert_eq!(
        cached(&informer),
        fixture.expected(shard),
        "use_watch_list={use_watch_list}"
    );

    let outside = loop {
        let ns = cluster.new_namespace("shard-late").await.unwrap();
        if !shard.contains(&ns) {
            break ns;
        }
    };
    let inside = loop {
        let ns = cluster.new_namespace("shard-late").await.unwrap();
        if shard.contains(&ns) {
            break ns;
        }
    };
    let name = format!("late-{use_watch_list}");
    for ns in [&outside, &inside] {
        Api::<ConfigMap>::namespaced(client.clone(), ns)
            .create(
                &PostParams::default(),
                &configmap(&name, &[(RUN_LABEL, &fixture.run)], "x"),
            )
            .await
            .unwrap();
    }
    fixture
        .late
        .push((outside.clone(), format!("{outside}/{name}")));
    fixture
        .late
        .push((inside.clone(), format!("{inside}/{name}")));
    let inside_key = format!("{inside}/{name}");
    eventually(
        "the watch to bring the ConfigMap inside the shard",
        Duration::from_secs(30),
        || async { cached(&informer).contains(&inside_key).then_some(()) },
    )
    .await;
    assert_eq!(
        cached(&informer),
        fixture.expected(shard),
        "the ConfigMap in {outside} (outside the shard) stays out; use_watch_list={use_watch_list}"
    );
    informer.shutdown().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_gate_on_the_apiserver_filters_by_shard_and_the_informer_caches_that_shard() {
    let cluster = testenv::shared().await;
    let client = cluster.client().await.unwrap();
    let mut fixture = Fixture::create(cluster, &client).await;
    let shard = shard_zero_of_four();
    let expected = fixture.expected(&shard);
    assert!(
        !expected.is_empty() && expected.len() < NAMESPACES,
        "40 random namespaces fall on both sides of a quarter ring: {expected:?}"
    );

    // The apiserver's own selection is ours, and it says it filtered.
    let (listed, echo) = server_list(&client, &fixture, &shard).await;
    let ours: BTreeSet<String> = fixture
        .namespaces
        .iter()
        .filter(|ns| shard.contains(ns))
        .cloned()
        .collect();
    assert_eq!(listed, ours);
    assert_eq!(echo.as_deref(), Some(shard.to_query().as_str()));

    // One namespace's exact hash, as a one-hash range: the apiserver hashes the same bytes.
    let one = &fixture.namespaces[0];
    let hash = fnv1a_64(one.as_bytes());
    let just_one =
        ShardSelector::namespaces([HashRange::new(hash, u128::from(hash) + 1).unwrap()]).unwrap();
    let (listed, _) = server_list(&client, &fixture, &just_one).await;
    assert_eq!(listed, BTreeSet::from([one.clone()]));

    // ListPage::shard_info reads the echo from either wire.
    for wire in [Wire::Auto, Wire::Json] {
        let lw = ListWatch::<ConfigMap>::all(client.clone())
            .wire(wire)
            .labels(&fixture.label_selector())
            .shards(shard.clone());
        let page = lw.list(&ListOptions::default()).await.unwrap();
        assert_eq!(
            page.shard_info.as_deref(),
            Some(shard.to_query().as_str()),
            "{wire:?}"
        );
        let keys: BTreeSet<String> = page
            .items
            .iter()
            .map(|cm| format!("{}/cm", cm.metadata.namespace.as_deref().unwrap()))
            .collect();
        assert_eq!(keys, expected, "{wire:?}");
    }

    for use_watch_list in [false, true] {
        check_informer(cluster, &client, &mut fixture, &shard, use_watch_list).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn with_the_gate_off_the_informer_filters_by_shard_itself() {
    let cluster = testenv::Cluster::start(
        testenv::ClusterOptions::apiserver_only()
            .with_feature_gate(testenv::SHARDED_LIST_AND_WATCH, false),
    )
    .await
    .unwrap();
    let client = cluster.client().await.unwrap();
    let mut fixture = Fixture::create(&cluster, &client).await;
    let shard = shard_zero_of_four();

    // The apiserver ignores the selector: everything, and no echo.
    let (listed, echo) = server_list(&client, &fixture, &shard).await;
    assert_eq!(listed, fixture.namespaces.iter().cloned().collect());
    assert_eq!(echo, None);
    let page = ListWatch::<ConfigMap>::all(client.clone())
        .labels(&fixture.label_selector())
        .shards(shard.clone())
        .list(&ListOptions::default())
        .await
        .unwrap();
    assert_eq!(page.shard_info, None);
    assert_eq!(page.items.len(), fixture.expected(&shard).len());

    for use_watch_list in [false, true] {
        check_informer(&cluster, &client, &mut fixture, &shard, use_watch_list).await;
    }
}
