//! Which replica should own which shard: the names of a ring's Leases and the assignment
//! every replica computes alike from the same view.

use std::collections::HashMap;

use crate::runtime::key::fnv1a;

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
/// the load; the others go to their home member if it has room (shard `i`'s home is the
/// `i mod members`-th member by identity), then, in order, to the member with the most room
/// left (ties by identity). `None` for every shard if there are no members.
///
/// Homes make the assignment the same in views that differ only by shards taken at home:
/// replicas that start together and acquire their shards one by one see each other's
/// acquisitions at different moments, and without homes each such view filled the free
/// shards differently, so replicas contended for (and listed) shards that then moved on
/// (`hack/bench-shard-watches`, 2026-11-30: two rounds of three).
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
    for (shard, owner) in owners.iter_mut().enumerate() {
        let home = members[shard % members.len()];
        if owner.is_none()
            && let Some(left) = room.get_mut(home)
            && *left > 0
        {
            *left -= 1;
            *owner = Some(home.clone());
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
