//! The ring loop each replica runs: its member Lease, the listing of the ring every
//! `retry_period`, and one elector per shard assigned to it (see the module docs of
//! [`super`] for how shards move and what is guaranteed when they do).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use super::assign::{assign, member_lease_name, shard_lease_name};
use super::config::{ShardRing, ShardingConfig};
use super::lease_ring::{LAYOUT_LABEL, RingLease, RingRole, RingStore};
use crate::cache::ShardScope;
use crate::leaderelection::{
    ConfigError, LeaderCallbacks, LeaderElectionRecord, LeaderElector, ResourceLock,
};
use crate::runtime::leadership::{Gate, Term};
use crate::runtime::queue::ControllerQueue;
use crate::runtime::shard_metrics::{ShardMetrics, ShardMetricsHandle};
use crate::runtime::terms::{LeaderTask, ShardTerms};

/// What the runtime hands the ring when it runs.
pub(crate) struct RingContext {
    pub controller: String,
    pub gate: Arc<Gate>,
    pub queue: ControllerQueue,
    pub leader_tasks: Arc<Vec<LeaderTask>>,
    pub scope: Option<ShardScope>,
}

/// The ring with its store type erased, as the builder keeps it.
pub(crate) struct Sharding {
    pub shards: u32,
    /// The scope the informers ask for ([`ShardRing::watch_held_shards`]): keys are then
    /// sharded by their namespace's hash range, and each term holds its shard in the scope.
    pub scope: Option<ShardScope>,
    pub run:
        Box<dyn FnOnce(RingContext, CancellationToken) -> BoxFuture<'static, ()> + Send + Sync>,
}

impl<R: RingStore> ShardRing<R> {
    pub(crate) fn erase(self) -> Sharding {
        Sharding {
            shards: self.config.shards,
            scope: self.scope.clone(),
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

/// What this replica last said about the layouts of the ring's members, so that each
/// disagreement is logged once, when it starts.
#[derive(Default)]
struct LayoutWatch {
    refused_by: Option<String>,
    strangers: BTreeMap<String, String>,
}

impl LayoutWatch {
    /// Whether this replica (`me`, splitting keys by `mine`) is outvoted: the ring runs with
    /// the layout most live members have ([`ring_layout`]). Logs each replica of another
    /// layout once, and the refusal when it starts.
    fn judge(
        &mut self,
        controller: &str,
        me: &str,
        mine: &str,
        layouts: &BTreeMap<String, String>,
    ) -> bool {
        let ring = ring_layout(layouts.values().map(String::as_str)).unwrap_or(mine);
        let strangers: BTreeMap<String, String> = layouts
            .iter()
            .filter(|(_, l)| l.as_str() != mine)
            .map(|(id, l)| (id.clone(), l.clone()))
            .collect();
        let refused = (ring != mine).then(|| ring.to_string());
        if refused.is_some() && refused != self.refused_by {
            let with: Vec<&str> = strangers.keys().map(String::as_str).collect();
            error!(controller, identity = me, layout = mine, ring_layout = ring, replicas = ?with, "this replica splits keys into shards otherwise than most of its ring (another --shards or --shard-bounds): it takes no shard until they agree");
        } else if refused.is_none() {
            for (id, theirs) in &strangers {
                if self.strangers.get(id) != Some(theirs) {
                    warn!(controller, replica = %id, layout = %theirs, ring_layout = mine, "a replica splits keys into shards otherwise than this ring (another --shards or --shard-bounds): it is given no shard");
                }
            }
        }
        self.refused_by = refused;
        self.strangers = strangers;
        self.refused_by.is_some()
    }
}

/// The layout a ring runs with: the one most of `layouts` (one per live member) name, ties
/// to the smallest, so every replica with the same view agrees.
fn ring_layout<'a>(layouts: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for layout in layouts {
        *counts.entry(layout).or_default() += 1;
    }
    // max_by_key keeps the last of equals: iterate from the largest so it is the smallest.
    counts
        .into_iter()
        .rev()
        .max_by_key(|(_, n)| *n)
        .map(|(layout, _)| layout)
}

/// When a record seen at `since` expires (its holder's lease duration after).
fn expiry(record: &LeaderElectionRecord, since: Instant) -> Instant {
    since + Duration::from_secs(u64::try_from(record.lease_duration_seconds).unwrap_or(0))
}

/// Runs the ring until `stop`: the member Lease, the listing, and one elector per shard this
/// replica should own. On `stop`, every shard's term ends and its Lease is released (after its
/// reconciles ended), then the member Lease.
async fn run_ring<R: RingStore>(ring: ShardRing<R>, ctx: RingContext, stop: CancellationToken) {
    let layout = ring.layout();
    let ShardRing { config, store, .. } = ring;
    let me = config.identity.clone();
    let metrics = ShardMetrics::global().for_controller(&ctx.controller);

    // The member Lease: held for the whole run.
    let member_name = member_lease_name(&config.ring, &me);
    let member_stop = CancellationToken::new();
    let member = match LeaderElector::new(
        config.election(&format!("{}/{member_name}", config.ring)),
        store.lock(&member_name, &me, {
            let mut labels = RingRole::Member.labels(&config.ring);
            labels.insert(LAYOUT_LABEL.to_string(), layout.clone());
            labels
        }),
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
    info!(controller = %ctx.controller, ring = %config.ring, shards = config.shards, layout = %layout, identity = %me, "joined the shard ring");

    let ctx = Arc::new(ctx);
    // A ring whose informers cache only the shards held lists on every shard it takes: it
    // takes none until the members it sees have not changed for a join window, so that
    // replicas started together (on a busy machine, more than a retry period apart: issue 51)
    // see each other's member Leases and split the shards before anyone lists more than its
    // share; and never later than one lease duration from now (a member that keeps flapping).
    let take_by = Instant::now() + config.lease_duration;
    let mut first_take = Instant::now()
        + ctx.scope.as_ref().map_or(Duration::ZERO, |_| {
            config.join_window.min(config.lease_duration)
        });
    let mut members_seen: Vec<String> = Vec::new();
    let mut observed = Observations::default();
    let mut running: BTreeMap<u32, Running<R::Lock>> = BTreeMap::new();
    let mut stopping: Vec<JoinHandle<()>> = Vec::new();
    let mut layouts = LayoutWatch::default();
    loop {
        let now = Instant::now();
        let mut wake = now + config.retry_period;
        match store.list(&config.ring).await {
            Err(e) => {
                warn!(controller = %ctx.controller, error = %e, "listing the shard ring failed; keeping the shards held")
            }
            Ok(leases) => {
                let now = Instant::now();
                // Every live member (this replica included) and how it splits keys.
                let mut member_layouts = BTreeMap::from([(me.clone(), layout.clone())]);
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
                                let holder = &lease.record.holder_identity;
                                if *holder != me {
                                    member_layouts.insert(
                                        holder.clone(),
                                        lease.layout.clone().unwrap_or_default(),
                                    );
                                }
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
                // Replicas that split keys otherwise are no members of this ring; a
                // replica outvoted on its layout takes nothing and gives back what it holds.
                let refused = layouts.judge(&ctx.controller, &me, &layout, &member_layouts);
                let members: Vec<String> = member_layouts
                    .iter()
                    .filter(|(_, l)| **l == layout)
                    .map(|(m, _)| m.clone())
                    .collect();
                let strangers_hold = holders
                    .iter()
                    .flatten()
                    .any(|h| member_layouts.get(h).is_some_and(|l| *l != layout));
                for holder in holders.iter_mut() {
                    if holder
                        .as_ref()
                        .is_some_and(|h| members.binary_search(h).is_err())
                    {
                        *holder = None;
                    }
                }
                let owners = if refused {
                    vec![None; config.shards as usize]
                } else {
                    assign(config.shards, &members, &holders)
                };
                // No shard is taken while a replica of another layout holds one: its keys
                // and ours may overlap across shard numbers.
                let may_take = !refused && !strangers_hold;
                if ctx.scope.is_some() && now <= first_take && members != members_seen {
                    first_take = first_take.max(now + config.join_window).min(take_by);
                    members_seen.clone_from(&members);
                }
                if now < first_take {
                    wake = wake.min(first_take);
                } else if let Some(scope) = ctx.scope.as_ref().filter(|_| may_take) {
                    // The shards this replica is to hold are listed together, in one list,
                    // while their electors acquire them (their terms open once listed).
                    let taking = owners.iter().enumerate().filter(|(shard, owner)| {
                        owner.as_deref() == Some(me.as_str())
                            && running
                                .get(&(*shard as u32))
                                .is_none_or(|r| r.task.is_finished())
                    });
                    scope.hold_all(taking.map(|(shard, _)| shard as u32));
                }
                for (shard, owner) in owners.iter().enumerate() {
                    let shard = shard as u32;
                    let mine = owner.as_deref() == Some(me.as_str());
                    let is_running = running.get(&shard).is_some_and(|r| !r.task.is_finished());
                    if mine && !is_running && now >= first_take && may_take {
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
                                warn!(controller = %ctx.controller, shard, error = %e, "cannot contend for shard");
                                if let Some(scope) = &ctx.scope {
                                    scope.release(shard);
                                }
                            }
                        }
                    } else if !mine && let Some(r) = running.remove(&shard) {
                        info!(controller = %ctx.controller, shard, to = owner.as_deref().unwrap_or(""), "handing shard over");
                        if let Some(scope) = &ctx.scope
                            && !r.elector.is_leader()
                        {
                            // No term to end, which would release it.
                            scope.release(shard);
                        }
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
    if let Some(scope) = &ctx.scope {
        // Shards assigned but never acquired have no term that released them.
        for shard in scope.held() {
            scope.release(shard);
        }
    }
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
    metrics: &ShardMetricsHandle,
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
        scope: ctx.scope.clone(),
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
