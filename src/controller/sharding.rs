//! Sharding: more than one active replica, each reconciling the keys of the shards it holds.
//!
//! Leader election gives a controller high availability, not scale: one replica works. Here
//! the key space is split into a fixed number of shards by a stable hash of `namespace/name`
//! ([`shard_of`]); each shard is held through a coordination.k8s.io/v1 Lease of its own, with
//! the elector, the lease arithmetic and the fence of leader election ([`super::leadership`]):
//! every shard a replica holds is a term, and a key is reconciled only inside the term of its
//! shard. client-go, controller-runtime and kube-runtime have nothing built in;
//! kubernetes-controller-sharding adds it to controller-runtime with an external sharder that
//! labels objects. This ring needs nothing but Leases and has no central sharder.
//!
//! # The Leases of a ring (`kubectl get leases -l kubeloop.dev/ring=<ring>`)
//! - `<ring>-shard-<i>` for i in 0..shards: held by the replica that owns shard i (labels
//!   `kubeloop.dev/ring=<ring>`, `kubeloop.dev/ring-role=shard`, `kubeloop.dev/shard=<i>`), so
//!   `kubectl get leases` reads as the shard map;
//! - `<ring>-member-<hash of identity>`: one per replica, renewed while it runs
//!   (`kubeloop.dev/ring-role=member`); released on a clean stop, deleted by the others once it
//!   has stayed unchanged for twice its lease duration.
//!
//! # How shards move
//! Every replica lists the ring's Leases every `retry_period` (and at the instant a Lease it
//! watches would expire) and judges each one as the elector does: expired when unchanged for
//! its `leaseDurationSeconds` by this process's clock since the replica saw it change. From
//! the live members and the live holders it computes the same assignment every other replica
//! with the same view computes ([`assign`]: each member gets its fair share, `shards / members`
//! rounded up or down; a shard stays with a live holder within its share; the rest go to the
//! members with the most room). It then runs an elector for each shard assigned to it and stops
//! the elector of each shard it holds that is assigned elsewhere.
//!
//! Safety does not rest on the assignment (views differ for a moment while a replica joins or
//! dies): a shard is reconciled only by the holder of its Lease, within its term. Handing a
//! shard over is a graceful step-down: the term ends, the workers stop taking its keys, its
//! in-flight reconciles are cancelled and waited for (dropped at the fence if they must), and
//! only then is the Lease released, so the next owner's first reconcile starts after the last
//! one of the previous owner ended. A dead or paused owner's shard is taken only after its Lease
//! expired, which is after the old owner's fence (see [`super::leadership`]).
//!
//! Liveness: a member that dies stops renewing its Leases; within `lease_duration` of its last
//! renewal (by each observer's clock) the others see its member Lease expired and reassign its
//! shards; the new owner's elector starts with the ring's observation of the shard's Lease
//! ([`LeaderElector::assume_observed`]), so it takes the shard as soon as that Lease expires,
//! within `lease_duration + retry_period` of the death, not a second lease duration later.
//!
//! Keys of shards a replica does not hold are set aside when taken from the queue and handed
//! back when it acquires the shard, with the keys it saw change meanwhile (the gate's parked
//! set): a new owner reconciles every key of a shard it takes over, as a new leader does.
//! Leader tasks (the VM controller's orphan sweep) run in the term of shard 0.
//!
//! Informers run on every replica, so taking over a shard is warm.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::coordination::v1::Lease;
use kube_client::Client;
use kube_client::api::{Api, DeleteParams, ListParams, Preconditions};
use thiserror::Error;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::builder::LeaderTask;
use super::leadership::{Gate, Term};
use super::runtime::ShardTerms;
use crate::leaderelection::{
    ConfigError, LeaderCallbacks, LeaderElectionConfig, LeaderElectionRecord, LeaderElector,
    LeaseLock, LockError, ResourceLock, lease_spec_to_record,
};
use crate::ops::ShardMetrics;
use crate::workqueue::RateLimitingQueue;

/// Label naming the ring a Lease belongs to.
pub const RING_LABEL: &str = "kubeloop.dev/ring";
/// Label saying what a ring's Lease is: `shard` or `member`.
pub const ROLE_LABEL: &str = "kubeloop.dev/ring-role";
/// Label carrying a shard Lease's shard number.
pub const SHARD_LABEL: &str = "kubeloop.dev/shard";

/// How a controller is sharded. Build with [`ShardingConfig::new`] and adjust the timings
/// (the Kubernetes component defaults, as for leader election).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardingConfig {
    /// The ring's name: prefix of its Leases' names and value of [`RING_LABEL`]. Lowercase
    /// letters, digits, `-` and `.`, as Lease names need.
    pub ring: String,
    /// How many shards the key space is split into (fixed for the ring's life; more shards
    /// than replicas lets load spread evenly, e.g. 4x the largest replica count you expect).
    pub shards: u32,
    /// This replica's identity, unique per process ([`crate::leaderelection::default_identity`]).
    pub identity: String,
    /// As [`LeaderElectionConfig::lease_duration`], for every Lease of the ring.
    pub lease_duration: Duration,
    /// As [`LeaderElectionConfig::renew_deadline`].
    pub renew_deadline: Duration,
    /// As [`LeaderElectionConfig::retry_period`]; also how often the ring is listed.
    pub retry_period: Duration,
}

/// A [`ShardingConfig`] that cannot work.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ShardingError {
    /// `shards` is zero.
    #[error("sharding ring {ring:?}: shards must be at least 1")]
    NoShards {
        /// The ring's name.
        ring: String,
    },
    /// The ring name cannot prefix a Lease name.
    #[error(
        "sharding ring {ring:?}: the ring name must be 1-200 lowercase letters, digits, '-' or \
         '.', starting and ending with a letter or digit (it prefixes Lease names)"
    )]
    BadRingName {
        /// The ring's name.
        ring: String,
    },
    /// The lease timings are invalid (the same rules as leader election's).
    #[error(transparent)]
    Timing(#[from] ConfigError),
}

/// One Lease of a ring, as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingLease {
    /// The Lease's name.
    pub name: String,
    /// What it stands for (from its labels).
    pub role: RingRole,
    /// Its holder record.
    pub record: LeaderElectionRecord,
    /// Changes with every write (the resourceVersion).
    pub version: String,
}

/// What a ring's Lease stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingRole {
    /// A replica's membership Lease (one per replica).
    Member,
    /// The Lease of shard N (0-based).
    Shard(u32),
}

impl RingRole {
    /// The labels a Lease of `ring` in this role is created with.
    pub fn labels(self, ring: &str) -> BTreeMap<String, String> {
        let mut labels = BTreeMap::from([(RING_LABEL.to_string(), ring.to_string())]);
        match self {
            RingRole::Member => {
                labels.insert(ROLE_LABEL.to_string(), "member".to_string());
            }
            RingRole::Shard(shard) => {
                labels.insert(ROLE_LABEL.to_string(), "shard".to_string());
                labels.insert(SHARD_LABEL.to_string(), shard.to_string());
            }
        }
        labels
    }

    /// The role a Lease's labels give it, if they make it a Lease of `ring`.
    pub fn of(labels: &BTreeMap<String, String>, ring: &str) -> Option<RingRole> {
        if labels.get(RING_LABEL).map(String::as_str) != Some(ring) {
            return None;
        }
        match labels.get(ROLE_LABEL).map(String::as_str) {
            Some("member") => Some(RingRole::Member),
            Some("shard") => Some(RingRole::Shard(labels.get(SHARD_LABEL)?.parse().ok()?)),
            _ => None,
        }
    }
}

/// Where a ring's Leases live: the apiserver ([`LeaseRing`]) or, in unit tests,
/// [`crate::testing::FakeRing`].
pub trait RingStore: Send + Sync + 'static {
    /// The lock type of one Lease.
    type Lock: ResourceLock;
    /// A lock on the Lease `name` for `identity`, creating it with `labels`.
    fn lock(&self, name: &str, identity: &str, labels: BTreeMap<String, String>) -> Self::Lock;
    /// Every Lease of `ring`.
    fn list(&self, ring: &str) -> impl Future<Output = Result<Vec<RingLease>, LockError>> + Send;
    /// Deletes the Lease `name` if it is still at `version`.
    fn delete(
        &self,
        name: &str,
        version: &str,
    ) -> impl Future<Output = Result<(), LockError>> + Send;
}

/// A ring on the apiserver's coordination.k8s.io/v1 Leases in one namespace.
#[derive(Clone)]
pub struct LeaseRing {
    client: Client,
    namespace: String,
}

impl LeaseRing {
    /// The ring's Leases in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        LeaseRing {
            client,
            namespace: namespace.to_string(),
        }
    }
}

impl RingStore for LeaseRing {
    type Lock = LeaseLock;

    fn lock(&self, name: &str, identity: &str, labels: BTreeMap<String, String>) -> LeaseLock {
        LeaseLock::new(self.client.clone(), &self.namespace, name, identity).with_labels(labels)
    }

    async fn list(&self, ring: &str) -> Result<Vec<RingLease>, LockError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let list = api
            .list(&ListParams::default().labels(&format!("{RING_LABEL}={ring}")))
            .await
            .map_err(|source| LockError::Get {
                lock: format!("leases -l {RING_LABEL}={ring} in {}", self.namespace),
                source,
            })?;
        Ok(list
            .items
            .into_iter()
            .filter_map(|lease| {
                let role = RingRole::of(lease.metadata.labels.as_ref()?, ring)?;
                Some(RingLease {
                    name: lease.metadata.name.clone()?,
                    role,
                    record: lease_spec_to_record(&lease.spec.clone().unwrap_or_default()),
                    version: lease.metadata.resource_version.clone()?,
                })
            })
            .collect())
    }

    async fn delete(&self, name: &str, version: &str) -> Result<(), LockError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(version.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(name, &params).await {
            Ok(_) => Ok(()),
            Err(source) => Err(LockError::Update {
                lock: format!("{}/{name}", self.namespace),
                source,
            }),
        }
    }
}

impl ShardingConfig {
    /// `shards` shards in the ring `ring`, contended for as `identity`, with the Kubernetes
    /// components' lease timings (15 s / 10 s / 2 s).
    pub fn new(ring: impl Into<String>, shards: u32, identity: impl Into<String>) -> Self {
        let defaults = LeaderElectionConfig::default();
        ShardingConfig {
            ring: ring.into(),
            shards,
            identity: identity.into(),
            lease_duration: defaults.lease_duration,
            renew_deadline: defaults.renew_deadline,
            retry_period: defaults.retry_period,
        }
    }

    /// The checks of leader election, plus a usable ring name and at least one shard.
    pub fn validate(&self) -> Result<(), ShardingError> {
        if self.shards == 0 {
            return Err(ShardingError::NoShards {
                ring: self.ring.clone(),
            });
        }
        let r = self.ring.as_bytes();
        let ok_char =
            |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.';
        let ok_end =
            |c: Option<&u8>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
        if r.is_empty()
            || r.len() > 200
            || !r.iter().all(ok_char)
            || !ok_end(r.first())
            || !ok_end(r.last())
        {
            return Err(ShardingError::BadRingName {
                ring: self.ring.clone(),
            });
        }
        self.election(&self.ring).validate()?;
        crate::leaderelection::config::validate_identity(&self.ring, &self.identity)?;
        Ok(())
    }

    /// The elector settings of one of the ring's Leases.
    fn election(&self, name: &str) -> LeaderElectionConfig {
        LeaderElectionConfig {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            release_on_cancel: true,
            recontend: true,
            name: name.to_string(),
        }
    }
}

/// A validated ring on a store, for [`super::Controller::sharding`].
pub struct ShardRing<R: RingStore> {
    config: ShardingConfig,
    store: Arc<R>,
}

impl<R: RingStore> ShardRing<R> {
    /// Checks `config` ([`ShardingConfig::validate`]).
    pub fn new(config: ShardingConfig, store: R) -> Result<Self, ShardingError> {
        config.validate()?;
        Ok(ShardRing {
            config,
            store: Arc::new(store),
        })
    }

    /// The configuration this ring runs with.
    pub fn config(&self) -> &ShardingConfig {
        &self.config
    }
}

/// The shard of `key`: FNV-1a (64 bit) of the key, modulo `shards`. Stable across processes,
/// platforms and versions (std's `DefaultHasher` promises none of that).
pub fn shard_of(key: &str, shards: u32) -> u32 {
    if shards <= 1 {
        return 0;
    }
    (fnv1a(key.as_bytes()) % u64::from(shards)) as u32
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        hash ^= u64::from(*b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Name of shard `shard`'s Lease.
pub fn shard_lease_name(ring: &str, shard: u32) -> String {
    format!("{ring}-shard-{shard}")
}

/// Name of a member's Lease (identities may hold characters a Lease name may not).
pub fn member_lease_name(ring: &str, identity: &str) -> String {
    format!("{ring}-member-{:016x}", fnv1a(identity.as_bytes()))
}

/// The owner each shard should have, given the live members and each shard's live holder
/// (`None`: nobody, or a holder that is not a live member). Every replica with the same view
/// computes the same answer. Each member gets `shards / members` shards, the first
/// `shards % members` of them (those holding most now, then by identity) one more; a shard
/// stays with its holder while the holder is within its share, so shards only move to even
/// the load; the others go, in order, to the member with the most room left (ties by
/// identity). `None` for every shard if there are no members.
pub fn assign(shards: u32, members: &[String], holders: &[Option<String>]) -> Vec<Option<String>> {
    let mut members: Vec<&String> = members.iter().collect();
    members.sort();
    members.dedup();
    if members.is_empty() {
        return vec![None; shards as usize];
    }
    let holding = |m: &String| holders.iter().filter(|h| h.as_ref() == Some(m)).count();
    let mut by_holding = members.clone();
    by_holding.sort_by(|a, b| holding(b).cmp(&holding(a)).then(a.cmp(b)));
    let (base, extra) = (
        shards as usize / members.len(),
        shards as usize % members.len(),
    );
    let mut room: HashMap<&String, usize> = by_holding
        .iter()
        .enumerate()
        .map(|(i, m)| (*m, base + usize::from(i < extra)))
        .collect();
    let mut owners: Vec<Option<String>> = vec![None; shards as usize];
    for (shard, holder) in holders.iter().enumerate().take(shards as usize) {
        if let Some(holder) = holder
            && let Some(left) = room.get_mut(holder)
            && *left > 0
        {
            *left -= 1;
            owners[shard] = Some(holder.clone());
        }
    }
    for owner in owners.iter_mut().filter(|o| o.is_none()) {
        let best = members
            .iter()
            .max_by(|a, b| room[*a].cmp(&room[*b]).then(b.cmp(a)))
            .copied()
            .expect("members is not empty");
        *room.get_mut(best).expect("every member has room") -= 1;
        *owner = Some(best.clone());
    }
    owners
}

/// What the runtime hands the ring when it runs.
pub(super) struct RingContext {
    pub controller: String,
    pub gate: Arc<Gate>,
    pub queue: RateLimitingQueue<String>,
    pub leader_tasks: Arc<Vec<LeaderTask>>,
}

/// The ring with its store type erased, as the builder keeps it.
pub(super) struct Sharding {
    pub shards: u32,
    pub run:
        Box<dyn FnOnce(RingContext, CancellationToken) -> BoxFuture<'static, ()> + Send + Sync>,
}

impl<R: RingStore> ShardRing<R> {
    pub(super) fn erase(self) -> Sharding {
        Sharding {
            shards: self.config.shards,
            run: Box::new(move |ctx, stop| Box::pin(run_ring(self, ctx, stop))),
        }
    }
}

/// One shard elector this replica runs.
struct Running<L: ResourceLock> {
    elector: LeaderElector<L>,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// When each Lease of the ring was last seen to change, by this process's clock.
#[derive(Default)]
struct Observations {
    seen: HashMap<String, (String, Instant)>,
}

impl Observations {
    /// Records `lease`'s version; returns when it was first seen at that version.
    fn observe(&mut self, lease: &RingLease, now: Instant) -> Instant {
        let entry = self
            .seen
            .entry(lease.name.clone())
            .or_insert_with(|| (lease.version.clone(), now));
        if entry.0 != lease.version {
            *entry = (lease.version.clone(), now);
        }
        entry.1
    }
}

/// When a record seen at `since` expires (its holder's lease duration after).
fn expiry(record: &LeaderElectionRecord, since: Instant) -> Instant {
    since + Duration::from_secs(u64::try_from(record.lease_duration_seconds).unwrap_or(0))
}

/// Runs the ring until `stop`: the member Lease, the listing, and one elector per shard this
/// replica should own. On `stop`, every shard's term ends and its Lease is released (after its
/// reconciles ended), then the member Lease.
async fn run_ring<R: RingStore>(ring: ShardRing<R>, ctx: RingContext, stop: CancellationToken) {
    let ShardRing { config, store } = ring;
    let me = config.identity.clone();
    let metrics = ShardMetrics::global().for_controller(&ctx.controller);

    // The member Lease: held for the whole run.
    let member_name = member_lease_name(&config.ring, &me);
    let member_stop = CancellationToken::new();
    let member = match LeaderElector::new(
        config.election(&format!("{}/{member_name}", config.ring)),
        store.lock(&member_name, &me, RingRole::Member.labels(&config.ring)),
    ) {
        Ok(elector) => elector,
        Err(e) => {
            warn!(controller = %ctx.controller, error = %e, "cannot run the ring's member Lease");
            return;
        }
    };
    let member_task = tokio::spawn({
        let stop = member_stop.clone();
        async move {
            member
                .run(LeaderCallbacks::new(|_| async {}, || {}), stop)
                .await;
        }
    });
    info!(controller = %ctx.controller, ring = %config.ring, shards = config.shards, identity = %me, "joined the shard ring");

    let ctx = Arc::new(ctx);
    let mut observed = Observations::default();
    let mut running: BTreeMap<u32, Running<R::Lock>> = BTreeMap::new();
    let mut stopping: Vec<JoinHandle<()>> = Vec::new();
    loop {
        let now = Instant::now();
        let mut wake = now + config.retry_period;
        match store.list(&config.ring).await {
            Err(e) => {
                warn!(controller = %ctx.controller, error = %e, "listing the shard ring failed; keeping the shards held")
            }
            Ok(leases) => {
                let now = Instant::now();
                let mut members = vec![me.clone()];
                let mut holders: Vec<Option<String>> = vec![None; config.shards as usize];
                let mut shard_leases: HashMap<u32, (LeaderElectionRecord, Instant)> =
                    HashMap::new();
                let mut expired_members = Vec::new();
                for lease in &leases {
                    let since = observed.observe(lease, now);
                    let expires = expiry(&lease.record, since);
                    if expires > now {
                        wake = wake.min(expires);
                    }
                    let live = !lease.record.holder_identity.is_empty() && expires > now;
                    match lease.role {
                        RingRole::Member => {
                            if live {
                                members.push(lease.record.holder_identity.clone());
                            } else if lease.record.holder_identity != me
                                && now.saturating_duration_since(since) >= 2 * config.lease_duration
                            {
                                expired_members.push(lease.clone());
                            }
                        }
                        RingRole::Shard(shard) if shard < config.shards => {
                            if live {
                                holders[shard as usize] =
                                    Some(lease.record.holder_identity.clone());
                            }
                            shard_leases.insert(shard, (lease.record.clone(), since));
                        }
                        RingRole::Shard(_) => {}
                    }
                }
                members.sort();
                members.dedup();
                for holder in holders.iter_mut() {
                    if holder
                        .as_ref()
                        .is_some_and(|h| members.binary_search(h).is_err())
                    {
                        *holder = None;
                    }
                }
                let owners = assign(config.shards, &members, &holders);
                for (shard, owner) in owners.iter().enumerate() {
                    let shard = shard as u32;
                    let mine = owner.as_deref() == Some(me.as_str());
                    let is_running = running.get(&shard).is_some_and(|r| !r.task.is_finished());
                    if mine && !is_running {
                        match start_shard(
                            &config,
                            &store,
                            &ctx,
                            shard,
                            shard_leases.get(&shard),
                            &metrics,
                        ) {
                            Ok(r) => {
                                debug!(controller = %ctx.controller, shard, "contending for shard");
                                running.insert(shard, r);
                            }
                            Err(e) => {
                                warn!(controller = %ctx.controller, shard, error = %e, "cannot contend for shard")
                            }
                        }
                    } else if !mine && let Some(r) = running.remove(&shard) {
                        info!(controller = %ctx.controller, shard, to = owner.as_deref().unwrap_or(""), "handing shard over");
                        r.stop.cancel();
                        stopping.push(r.task);
                    }
                }
                for lease in expired_members {
                    match store.delete(&lease.name, &lease.version).await {
                        Ok(()) => {
                            info!(controller = %ctx.controller, lease = %lease.name, holder = %lease.record.holder_identity, "deleted the expired member Lease of a replica that is gone")
                        }
                        Err(e) => {
                            debug!(controller = %ctx.controller, lease = %lease.name, error = %e, "could not delete an expired member Lease")
                        }
                    }
                }
                stopping.retain(|t| !t.is_finished());
                metrics.set_held(running.values().filter(|r| r.elector.is_leader()).count());
                metrics.set_members(members.len());
            }
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = sleep_until(wake.max(Instant::now() + Duration::from_millis(10))) => {}
        }
    }

    info!(controller = %ctx.controller, held = running.len(), "leaving the shard ring: ending every shard's term");
    for r in running.values() {
        r.stop.cancel();
    }
    member_stop.cancel();
    for r in running.into_values() {
        stopping.push(r.task);
    }
    for task in stopping {
        let _ = task.await;
    }
    let _ = member_task.await;
    metrics.set_held(0);
    info!(controller = %ctx.controller, "left the shard ring; Leases released");
}

/// Starts the elector of one shard.
fn start_shard<R: RingStore>(
    config: &ShardingConfig,
    store: &Arc<R>,
    ctx: &Arc<RingContext>,
    shard: u32,
    seen: Option<&(LeaderElectionRecord, Instant)>,
    metrics: &crate::ops::ShardMetricsHandle,
) -> Result<Running<R::Lock>, ConfigError> {
    let name = shard_lease_name(&config.ring, shard);
    let elector = LeaderElector::new(
        config.election(&format!("{}/{name}", config.ring)),
        store.lock(
            &name,
            &config.identity,
            RingRole::Shard(shard).labels(&config.ring),
        ),
    )?;
    if let Some((record, since)) = seen {
        elector.assume_observed(record.clone(), *since);
    }
    let terms = Arc::new(ShardTerms {
        shard,
        gate: ctx.gate.clone(),
        queue: ctx.queue.clone(),
        leader_tasks: (shard == 0).then(|| ctx.leader_tasks.clone()),
    });
    let controller = ctx.controller.clone();
    let (acquired, released) = (metrics.clone(), metrics.clone());
    let callbacks = LeaderCallbacks::new(
        move |leader| {
            let (terms, controller, metrics) =
                (terms.clone(), controller.clone(), acquired.clone());
            async move {
                info!(controller = %controller, shard, "acquired shard");
                metrics.moved(true);
                terms.serve(&controller, Term::leading(leader)).await;
            }
        },
        move || released.moved(false),
    );
    let stop = CancellationToken::new();
    let task = tokio::spawn({
        let (elector, stop) = (elector.clone(), stop.clone());
        async move {
            elector.run(callbacks, stop).await;
        }
    });
    Ok(Running {
        elector,
        stop,
        task,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn count(owners: &[Option<String>], m: &str) -> usize {
        owners.iter().filter(|o| o.as_deref() == Some(m)).count()
    }

    #[test]
    fn shard_of_is_stable_and_spreads_keys() {
        // Fixed values: the hash must never change between versions, or replicas of two
        // versions would disagree about which keys a shard holds.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(shard_of("anything", 1), 0);
        let mut per_shard = [0usize; 8];
        for i in 0..8000 {
            per_shard[shard_of(&format!("default/vm-{i}"), 8) as usize] += 1;
        }
        assert!(
            per_shard.iter().all(|n| (800..1200).contains(n)),
            "{per_shard:?}"
        );
    }

    #[test]
    fn lease_names_are_valid_lease_names() {
        assert_eq!(
            shard_lease_name("vm-controller", 3),
            "vm-controller-shard-3"
        );
        let member = member_lease_name("vm-controller", "host_5f0c-Upper_Case");
        assert!(member.starts_with("vm-controller-member-"));
        assert!(
            member
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        );
    }

    #[test]
    fn config_errors_name_the_ring_and_the_problem() {
        let mut config = ShardingConfig::new("vm", 0, "me");
        assert_eq!(
            config.validate(),
            Err(ShardingError::NoShards { ring: "vm".into() })
        );
        config.shards = 4;
        config.ring = "VM_ring".into();
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("\"VM_ring\"") && err.contains("lowercase"),
            "{err}"
        );
        config.ring = "vm".into();
        config.renew_deadline = config.lease_duration;
        assert!(matches!(config.validate(), Err(ShardingError::Timing(_))));
        config.renew_deadline = Duration::from_secs(10);
        config.identity = " ".into();
        assert!(matches!(
            config.validate(),
            Err(ShardingError::Timing(ConfigError::EmptyIdentity { .. }))
        ));
    }

    #[test]
    fn assign_gives_every_member_its_fair_share() {
        for members in 1..=5usize {
            let names: Vec<String> = (0..members).map(|i| format!("m{i}")).collect();
            let owners = assign(8, &names, &vec![None; 8]);
            for m in &names {
                let n = count(&owners, m);
                assert!(
                    n == 8 / members || n == 8 / members + 1,
                    "{members} members: {m} has {n}"
                );
            }
            assert!(owners.iter().all(Option::is_some));
        }
        assert_eq!(assign(3, &[], &[None, None, None]), vec![None::<String>; 3]);
    }

    #[test]
    fn assign_moves_only_what_evens_the_load() {
        let a_holds_all = vec![Some("a".to_string()); 6];
        // b joins: a keeps the first three it holds, b gets the rest.
        let owners = assign(6, &ids(&["a", "b"]), &a_holds_all);
        assert_eq!(count(&owners, "a"), 3);
        assert_eq!(
            &owners[..3],
            &[Some("a".into()), Some("a".into()), Some("a".into())]
        );
        // c joins a balanced ring: each of a and b gives up one.
        let owners = assign(6, &ids(&["a", "b", "c"]), &owners);
        assert_eq!(
            (
                count(&owners, "a"),
                count(&owners, "b"),
                count(&owners, "c")
            ),
            (2, 2, 2)
        );
        // b dies: only b's shards move.
        let before = owners.clone();
        let holders: Vec<Option<String>> = owners
            .iter()
            .map(|o| o.clone().filter(|h| h != "b"))
            .collect();
        let after = assign(6, &ids(&["a", "c"]), &holders);
        for (old, new) in before.iter().zip(&after) {
            if old.as_deref() != Some("b") {
                assert_eq!(old, new, "a shard of a live member moved");
            }
        }
        assert_eq!((count(&after, "a"), count(&after, "c")), (3, 3));
        // The same view gives the same answer whatever the order members are listed in.
        assert_eq!(assign(6, &ids(&["c", "a"]), &holders), after);
    }

    mod ring {
        use std::sync::atomic::{AtomicBool, Ordering};

        use k8s_openapi::api::core::v1::ConfigMap;
        use kube_client::core::ObjectMeta;
        use parking_lot::Mutex;

        use super::*;
        use crate::cache::{InformerConfig, SharedIndexInformer};
        use crate::controller::{Action, Controller, ReconcileContext, default_error_policy};
        use crate::testing::{FakeControllerSource, FakeRing, Reach, eventually, settle};

        /// (replica, key, start, end) of every reconcile.
        type Entry = (String, String, Instant, Option<Instant>);

        #[derive(Clone, Default)]
        struct Log(Arc<Mutex<Vec<Entry>>>);

        impl Log {
            /// Two reconciles of one key by different replicas whose runs overlap.
            fn overlaps(&self) -> Vec<(Entry, Entry)> {
                let log = self.0.lock();
                let now = Instant::now();
                let mut found = Vec::new();
                for (i, a) in log.iter().enumerate() {
                    for b in &log[i + 1..] {
                        let (a_end, b_end) = (a.3.unwrap_or(now), b.3.unwrap_or(now));
                        if a.1 == b.1 && a.0 != b.0 && a.2 < b_end && b.2 < a_end {
                            found.push((a.clone(), b.clone()));
                        }
                    }
                }
                found
            }
            fn replicas_of(&self, key: &str, after: Instant) -> Vec<String> {
                let mut r: Vec<String> = self
                    .0
                    .lock()
                    .iter()
                    .filter(|e| e.1 == key && e.2 >= after)
                    .map(|e| e.0.clone())
                    .collect();
                r.sort();
                r.dedup();
                r
            }
        }

        fn cm(i: usize) -> ConfigMap {
            ConfigMap {
                metadata: ObjectMeta {
                    namespace: Some("ns".into()),
                    name: Some(format!("cm-{i}")),
                    ..Default::default()
                },
                ..Default::default()
            }
        }

        /// lease 4 s, renew deadline 3 s, retry 0.5 s.
        fn config(identity: &str) -> ShardingConfig {
            ShardingConfig {
                lease_duration: Duration::from_secs(4),
                renew_deadline: Duration::from_secs(3),
                retry_period: Duration::from_millis(500),
                ..ShardingConfig::new("ring", 6, identity)
            }
        }

        struct Replica {
            shutdown: CancellationToken,
            run: JoinHandle<Result<(), crate::controller::ControllerError>>,
        }

        /// A replica whose reconcile takes 200 ms (ignoring cancellation, so only the fence
        /// stops it) and asks to be requeued after 2 s: with 4 workers every key is
        /// reconciled about every 3.2 s, and work is always in flight.
        fn replica(
            identity: &str,
            source: &FakeControllerSource<ConfigMap>,
            ring: &FakeRing,
            log: &Log,
        ) -> Replica {
            let informer = SharedIndexInformer::new(source.clone(), InformerConfig::default());
            let (me, log) = (identity.to_string(), log.clone());
            let reconcile = move |key: String, _ctx: ReconcileContext| {
                let (me, log) = (me.clone(), log.clone());
                async move {
                    let i = {
                        let mut log = log.0.lock();
                        log.push((me, key, Instant::now(), None));
                        log.len() - 1
                    };
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    log.0.lock()[i].3 = Some(Instant::now());
                    Ok::<_, String>(Action::RequeueAfter(Duration::from_secs(2)))
                }
            };
            let controller = Controller::new("sharded", informer)
                .workers(4)
                .sharding(ShardRing::new(config(identity), ring.clone()).unwrap());
            let shutdown = CancellationToken::new();
            let run =
                tokio::spawn(controller.run(reconcile, default_error_policy, shutdown.clone()));
            Replica { shutdown, run }
        }

        fn holders(ring: &FakeRing) -> Vec<String> {
            (0..6)
                .map(|s| ring.holder(&shard_lease_name("ring", s)))
                .collect()
        }

        fn count(holders: &[String], who: &str) -> usize {
            holders.iter().filter(|h| *h == who).count()
        }

        #[tokio::test(start_paused = true)]
        async fn shards_spread_over_replicas_that_join_and_move_without_overlap_when_one_dies() {
            let source = FakeControllerSource::<ConfigMap>::new();
            for i in 0..24 {
                source.add(cm(i));
            }
            let (ring, log) = (FakeRing::new(), Log::default());

            // One replica takes every shard and reconciles every key.
            let a = replica("a", &source, &ring, &log);
            assert!(
                eventually(Duration::from_secs(10), || count(&holders(&ring), "a") == 6).await,
                "{:?}",
                holders(&ring)
            );
            settle().await;
            let t0 = Instant::now();
            tokio::time::sleep(Duration::from_secs(6)).await;
            for i in 0..24 {
                assert_eq!(log.replicas_of(&format!("ns/cm-{i}"), t0), ["a"]);
            }

            // Two more join: two shards each, handed over by a after its reconciles ended.
            let b = replica("b", &source, &ring, &log);
            let c = replica("c", &source, &ring, &log);
            let balanced = || {
                let h = holders(&ring);
                count(&h, "a") == 2 && count(&h, "b") == 2 && count(&h, "c") == 2
            };
            assert!(
                eventually(Duration::from_secs(20), balanced).await,
                "{:?}",
                holders(&ring)
            );
            let t1 = Instant::now() + Duration::from_secs(2);
            tokio::time::sleep(Duration::from_secs(8)).await;
            let map = holders(&ring);
            for i in 0..24 {
                let key = format!("ns/cm-{i}");
                let owner = map[shard_of(&key, 6) as usize].clone();
                assert_eq!(
                    log.replicas_of(&key, t1),
                    [owner],
                    "{key} after the rebalance"
                );
            }
            assert!(log.overlaps().is_empty(), "{:?}", log.overlaps());

            // a's renewals hang (a paused or cut-off replica): its shards are taken over after
            // its Leases expire, never while its reconciles may still run.
            ring.set_reach("a", Reach::Hang);
            let cut = Instant::now();
            let taken = AtomicBool::new(false);
            assert!(
                eventually(Duration::from_secs(20), || {
                    let h = holders(&ring);
                    let done = count(&h, "b") == 3 && count(&h, "c") == 3;
                    taken.store(done, Ordering::SeqCst);
                    done
                })
                .await,
                "{:?}",
                holders(&ring)
            );
            let took = Instant::now() - cut;
            // Lease 4 s + retry 0.5 s, from a's last renewal (at most one retry before the cut).
            assert!(
                took <= Duration::from_millis(5000),
                "taken over after {took:?}"
            );
            let t2 = Instant::now();
            tokio::time::sleep(Duration::from_secs(6)).await;
            assert!(log.overlaps().is_empty(), "{:?}", log.overlaps());
            for i in 0..24 {
                let key = format!("ns/cm-{i}");
                let by = log.replicas_of(&key, t2);
                assert!(
                    by.len() == 1 && by[0] != "a",
                    "{key} reconciled by {by:?} after a was cut off"
                );
            }

            for r in [b, c] {
                r.shutdown.cancel();
                r.run.await.unwrap().unwrap();
            }
            a.shutdown.cancel();
            a.run.abort();
            let _ = a.run.await;
            assert!(log.overlaps().is_empty(), "{:?}", log.overlaps());
        }
    }
}
