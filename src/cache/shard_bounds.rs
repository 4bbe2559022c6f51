//! [`ShardBounds`]: where each shard of a namespace-hash ring starts.
//!
//! A ring cut into equal hash ranges ([`ShardBounds::even`], [`HashRange::ring`]) holds equal
//! shares of the hash space, not of the objects: 200 namespaces of 500 objects each, cut into
//! 16 equal ranges and 4 shards a replica, gave replicas of 21,500 to 27,500 objects
//! (benches/README.md, 2026-11-30). [`ShardBounds::balanced`] instead puts each bound at a
//! quantile of the objects, counted per namespace: with 200 equal namespaces and 20 shards,
//! every shard holds 10 namespaces. Vitess configures its key ranges the same way (explicit
//! bounds, chosen from the data, the same on every tablet). The bounds are fixed for a ring's
//! life like its shard count, so they balance the namespaces that existed when they were
//! computed: a namespace made later falls in whichever shard its hash does.
//!
//! Text form ([`fmt::Display`], [`FromStr`]): the starts of shards 1.. as `0x` and 16 hex
//! digits, comma-separated (shard 0 starts at 0); "" for a ring of one shard. Every replica of
//! a ring must use the same bounds: the ring refuses a replica whose
//! [`digest`](ShardBounds::digest) differs (see `runtime::sharding`).
//!
//! Invariants: `starts` is not empty, `starts[0] == 0`, strictly increasing, and at most
//! `u32::MAX` long; shard `i` is `[starts[i], starts[i + 1])`, the last running to 2^64.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::shard_selector::{HashRange, fnv1a_64};

/// The start of every shard of a ring over the 64-bit hash space. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ShardBounds {
    starts: Arc<[u64]>,
}

/// Bounds that cannot make a ring.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardBoundsError {
    /// A ring of no shards.
    #[error("a shard ring needs at least 1 shard")]
    NoShards,
    /// A bound at or below the one before it (shard 0 starts at 0).
    #[error(
        "shard bound {index} ({bound:#018x}) is not above the one before it ({previous:#018x}): \
         bounds must increase strictly, from above 0"
    )]
    NotIncreasing {
        /// Which bound (1-based: the start of shard `index`).
        index: usize,
        /// Its value.
        bound: u64,
        /// The start of the shard before it.
        previous: u64,
    },
    /// A bound that is not `0x` and 16 hex digits.
    #[error(
        "shard bound {index} is {text:?}: expected 0x and 16 hex digits, as 0x4000000000000000"
    )]
    BadBound {
        /// Which bound (1-based).
        index: usize,
        /// What was given.
        text: String,
    },
    /// Fewer distinct namespace hashes than shards: some shard would hold none.
    #[error(
        "{namespaces} namespaces cannot fill {shards} shards: balanced bounds need at least one namespace a shard"
    )]
    TooFewNamespaces {
        /// Distinct namespace hashes counted.
        namespaces: usize,
        /// Shards asked for.
        shards: u32,
    },
}

impl ShardBounds {
    /// `shards` equal ranges: the starts of [`HashRange::ring`].
    pub fn even(shards: u32) -> Result<Self, ShardBoundsError> {
        if shards == 0 {
            return Err(ShardBoundsError::NoShards);
        }
        let starts = (0..shards).map(|i| HashRange::ring(shards, i).expect("i < shards").start());
        Ok(Self {
            starts: starts.collect(),
        })
    }

    /// Shards starting at 0 and at each of `starts` (the starts of shards 1..), which must
    /// increase strictly from above 0.
    pub fn from_starts(starts: impl IntoIterator<Item = u64>) -> Result<Self, ShardBoundsError> {
        let starts: Vec<u64> = std::iter::once(0).chain(starts).collect();
        if starts.len() > u32::MAX as usize {
            return Err(ShardBoundsError::NoShards);
        }
        for (index, pair) in starts.windows(2).enumerate() {
            if pair[1] <= pair[0] {
                return Err(ShardBoundsError::NotIncreasing {
                    index: index + 1,
                    bound: pair[1],
                    previous: pair[0],
                });
            }
        }
        Ok(Self {
            starts: starts.into(),
        })
    }

    /// `shards` shards over `weights` (a hash and how many objects have it, in any order,
    /// repeats added up), each bound at a quantile of the weight: shard `k` starts where
    /// the objects before it come closest to `k / shards` of all, halfway between the two
    /// hashes it falls between. Every shard holds at least one hash.
    pub fn balanced(
        weights: impl IntoIterator<Item = (u64, u64)>,
        shards: u32,
    ) -> Result<Self, ShardBoundsError> {
        if shards == 0 {
            return Err(ShardBoundsError::NoShards);
        }
        let mut sorted: Vec<(u64, u64)> = weights.into_iter().collect();
        sorted.sort_unstable();
        sorted.dedup_by(|next, kept| {
            let same = next.0 == kept.0;
            if same {
                kept.1 += next.1;
            }
            same
        });
        let n = sorted.len();
        if n < shards as usize {
            return Err(ShardBoundsError::TooFewNamespaces {
                namespaces: n,
                shards,
            });
        }
        // before[i]: the weight of the hashes below sorted[i].
        let before: Vec<u128> = std::iter::once(0)
            .chain(sorted.iter().scan(0u128, |sum, (_, w)| {
                *sum += u128::from(*w);
                Some(*sum)
            }))
            .collect();
        let total = before[n];
        let mut starts = Vec::with_capacity(shards as usize - 1);
        let mut cut = 0; // shard k - 1 starts before sorted[cut]
        for k in 1..shards as usize {
            let target = total * k as u128 / u128::from(shards);
            // The cuts left must leave a hash to each shard after this one.
            let (low, high) = (cut + 1, n - (shards as usize - k));
            let above = before.partition_point(|b| *b < target).clamp(low, high);
            cut = if above > low && target - before[above - 1] <= before[above] - target {
                above - 1
            } else {
                above
            };
            let (below, at) = (sorted[cut - 1].0, sorted[cut].0);
            starts.push(below + (at - below).div_ceil(2));
        }
        Self::from_starts(starts)
    }

    /// Balanced bounds ([`balanced`](Self::balanced)) from objects counted per namespace.
    pub fn of_namespaces<'a>(
        counts: impl IntoIterator<Item = (&'a str, u64)>,
        shards: u32,
    ) -> Result<Self, ShardBoundsError> {
        Self::balanced(
            counts
                .into_iter()
                .map(|(ns, count)| (fnv1a_64(ns.as_bytes()), count)),
            shards,
        )
    }

    /// How many shards.
    pub fn shards(&self) -> u32 {
        self.starts.len() as u32
    }

    /// Shard `index`'s range (`None` past the last shard).
    pub fn range(&self, index: u32) -> Option<HashRange> {
        let i = index as usize;
        let start = *self.starts.get(i)?;
        let end = self
            .starts
            .get(i + 1)
            .map_or(1u128 << 64, |s| u128::from(*s));
        Some(HashRange::new(start, end).expect("starts increase strictly"))
    }

    /// The shard whose range holds `hash`.
    pub fn index_of(&self, hash: u64) -> u32 {
        (self.starts.partition_point(|s| *s <= hash) - 1) as u32
    }

    /// 16 hex digits naming these bounds (FNV-1a 64 of the shard count and the text form):
    /// what replicas compare to agree they split keys alike.
    pub fn digest(&self) -> String {
        format!(
            "{:016x}",
            fnv1a_64(format!("{}/{self}", self.shards()).as_bytes())
        )
    }
}

impl fmt::Display for ShardBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, start) in self.starts.iter().skip(1).enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{start:#018x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for ShardBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ShardBounds({} shards: [0x0,{self}])", self.shards())
    }
}

impl FromStr for ShardBounds {
    type Err = ShardBoundsError;

    /// The text form: "" for one shard, else the starts of shards 1.. (see the module docs).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let text = text.trim();
        if text.is_empty() {
            return Self::from_starts([]);
        }
        let starts = text.split(',').enumerate().map(|(i, part)| {
            let part = part.trim();
            let bad = || ShardBoundsError::BadBound {
                index: i + 1,
                text: part.to_string(),
            };
            let hex = part.strip_prefix("0x").ok_or_else(bad)?;
            if hex.len() != 16 {
                return Err(bad());
            }
            u64::from_str_radix(hex, 16).map_err(|_| bad())
        });
        Self::from_starts(starts.collect::<Result<Vec<_>, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_bounds_are_the_ring_ranges_and_find_what_ring_index_finds() {
        for shards in [1, 2, 3, 4, 7, 16, 20] {
            let bounds = ShardBounds::even(shards).unwrap();
            assert_eq!(bounds.shards(), shards);
            for i in 0..shards {
                assert_eq!(bounds.range(i), Some(HashRange::ring(shards, i).unwrap()));
            }
            assert_eq!(bounds.range(shards), None);
            for hash in [0, 1, u64::MAX / 3, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
                assert_eq!(
                    bounds.index_of(hash),
                    HashRange::ring_index(shards, hash),
                    "{hash:#x} of {shards}"
                );
            }
        }
        assert_eq!(ShardBounds::even(0), Err(ShardBoundsError::NoShards));
    }

    #[test]
    fn the_text_form_round_trips_and_bad_text_names_the_bound() {
        let four = ShardBounds::even(4).unwrap();
        assert_eq!(
            four.to_string(),
            "0x4000000000000000,0x8000000000000000,0xc000000000000000"
        );
        assert_eq!(four.to_string().parse::<ShardBounds>(), Ok(four.clone()));
        assert_eq!("".parse::<ShardBounds>().unwrap().shards(), 1);
        assert_eq!(
            "0x4000000000000000,0x40".parse::<ShardBounds>(),
            Err(ShardBoundsError::BadBound {
                index: 2,
                text: "0x40".into()
            })
        );
        let err = "0x8000000000000000,0x4000000000000000"
            .parse::<ShardBounds>()
            .unwrap_err();
        assert_eq!(
            err,
            ShardBoundsError::NotIncreasing {
                index: 2,
                bound: 0x4000_0000_0000_0000,
                previous: 0x8000_0000_0000_0000
            }
        );
        assert!(err.to_string().contains("shard bound 2"), "{err}");
        assert!(
            ShardBounds::from_starts([0]).is_err(),
            "shard 1 cannot start at 0"
        );
        assert_ne!(four.digest(), ShardBounds::even(8).unwrap().digest());
        assert_eq!(
            four.digest(),
            four.to_string().parse::<ShardBounds>().unwrap().digest()
        );
    }

    #[test]
    fn balanced_bounds_put_equal_namespaces_in_equal_shards() {
        let names: Vec<String> = (0..200).map(|i| format!("ns{i}-x")).collect();
        let bounds =
            ShardBounds::of_namespaces(names.iter().map(|n| (n.as_str(), 500)), 20).unwrap();
        assert_eq!(bounds.shards(), 20);
        let mut per_shard = [0; 20];
        for name in &names {
            per_shard[bounds.index_of(fnv1a_64(name.as_bytes())) as usize] += 1;
        }
        assert_eq!(per_shard, [10; 20]);
        // Equal ranges split the same namespaces unevenly: the reason for balanced bounds.
        let even = ShardBounds::even(20).unwrap();
        let mut per_even = [0; 20];
        for name in &names {
            per_even[even.index_of(fnv1a_64(name.as_bytes())) as usize] += 1;
        }
        assert_ne!(per_even, [10; 20]);
    }

    #[test]
    fn balanced_bounds_follow_the_weights_and_leave_no_shard_empty() {
        // One heavy hash: the cut falls just before it, the two light ones before it alone.
        let bounds = ShardBounds::balanced([(10, 1), (20, 1), (30, 100), (40, 1)], 2).unwrap();
        assert_eq!(bounds.to_string(), format!("{:#018x}", 25));
        // Three shards over three hashes: one each, whatever the weights.
        let bounds = ShardBounds::balanced([(10, 1000), (20, 1), (30, 1)], 3).unwrap();
        assert_eq!(
            (0..3)
                .map(|i| bounds.index_of(10 * (i + 1)))
                .collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        // Repeats add up: (5, 1) twice weighs as much as (9, 2).
        let bounds = ShardBounds::balanced([(5, 1), (5, 1), (9, 2), (12, 0)], 2).unwrap();
        assert_eq!(bounds.index_of(5), 0);
        assert_eq!(bounds.index_of(9), 1);
        assert_eq!(
            ShardBounds::balanced([(1, 1), (1, 1)], 2),
            Err(ShardBoundsError::TooFewNamespaces {
                namespaces: 1,
                shards: 2
            })
        );
    }
}
