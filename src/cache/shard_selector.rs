//! [`ShardSelector`]: which hash ranges of the object space a list and watch ask for, as the
//! `shardSelector` parameter of KEP-5866 (Kubernetes 1.36, alpha, feature gate
//! `ShardedListAndWatch`), and the same test made here for a server that does not filter.
//!
//! client-go has no counterpart (nor controller-runtime, nor kube-rs). The server's side,
//! read at v1.36.3:
//! - apimachinery `pkg/sharding/hash.go`: the hash of a field is FNV-1a 64 of its UTF-8 bytes
//!   (Go's `hash/fnv.New64a`), shown as 16 lowercase hex digits;
//! - apimachinery `pkg/sharding/types.go`, `selector.go`: a range is `[start, end)` over
//!   `[0, 2^64)`; several ranges are joined with ` || ` and an object matches when its hash
//!   is in any of them; all ranges name the same field; `String()` renders each as
//!   `shardRange(<field>, '<start>', '<end>')`, and that string is what a list echoes in
//!   `metadata.shardInfo.selector`;
//! - apiserver `pkg/sharding/parser.go`: the parameter is parsed as a CEL expression
//!   (`shardRange()` calls and `||` only), the field is `object.metadata.namespace` or
//!   `object.metadata.uid`, each bound a single-quoted `0x` with exactly 16 lowercase hex
//!   digits, or `'0x10000000000000000'` (2^64) as an end, and start must be below end. The
//!   short `'0x0'` of `ListOptions`'s own doc comment is refused.
//!
//! What differs on purpose: a selector here names exactly one field and at least one range
//! (the server refuses an empty selector and mixed fields; an unfiltered list simply has no
//! selector), so every selector this type can hold is one the server accepts, and
//! [`ShardSelector::to_query`] renders it the way the server's `String()` does, so the echo of
//! a filtered list is the very string sent.
//!
//! Invariants: a [`HashRange`] has `start < end <= 2^64`; a [`ShardSelector`] has one or more
//! ranges.

use std::fmt;

use kube_client::core::ObjectMeta;

/// One past the largest 64-bit hash: the end of the whole space.
const SPACE_END: u128 = 1 << 64;

/// FNV-1a 64 of `bytes`: the hash the apiserver shards by (Go's `hash/fnv.New64a`).
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET_BASIS, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

/// Which metadata field an object is hashed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShardKey {
    /// `object.metadata.namespace`: every object of a namespace lands in the same shard (a
    /// cluster-scoped object's namespace is "", which hashes like any other string).
    Namespace,
    /// `object.metadata.uid`: objects spread evenly, whatever their namespace.
    Uid,
}

impl ShardKey {
    /// The field path as the selector names it.
    pub fn field_path(self) -> &'static str {
        match self {
            ShardKey::Namespace => "object.metadata.namespace",
            ShardKey::Uid => "object.metadata.uid",
        }
    }

    /// The field's value in `meta` ("" when unset, as the apiserver's accessor reads it).
    pub fn value_of(self, meta: &ObjectMeta) -> &str {
        match self {
            ShardKey::Namespace => meta.namespace.as_deref(),
            ShardKey::Uid => meta.uid.as_deref(),
        }
        .unwrap_or_default()
    }
}

/// A range `[start, end)` of 64-bit hashes, `end` at most 2^64.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HashRange {
    start: u64,
    /// Exclusive; 2^64 for a range that runs to the end of the space.
    end: u128,
}

/// A selector or range that the apiserver would refuse, or a ring position that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShardSelectorError {
    /// The range holds no hash.
    #[error("hash range [{start:#018x}, {end:#x}) is empty: its start must be below its end")]
    EmptyRange {
        /// The inclusive start.
        start: u64,
        /// The exclusive end.
        end: u128,
    },
    /// The end is beyond 2^64.
    #[error("hash range end {end:#x} is beyond the hash space's end 0x10000000000000000")]
    EndBeyondSpace {
        /// The exclusive end asked for.
        end: u128,
    },
    /// A selector with no range (the apiserver refuses an empty `shardSelector`).
    #[error("a shard selector needs at least one hash range")]
    NoRanges,
    /// A ring of no shards, or a shard index past its end.
    #[error("shard {index} of a ring of {shards} does not exist")]
    NoSuchShard {
        /// The shard asked for.
        index: u32,
        /// The ring's size.
        shards: u32,
    },
}

impl HashRange {
    /// `[start, end)`; `end` may be 2^64 (`1 << 64`), the end of the space.
    pub fn new(start: u64, end: u128) -> Result<Self, ShardSelectorError> {
        if end > SPACE_END {
            return Err(ShardSelectorError::EndBeyondSpace { end });
        }
        if u128::from(start) >= end {
            return Err(ShardSelectorError::EmptyRange { start, end });
        }
        Ok(Self { start, end })
    }

    /// The whole space, `[0, 2^64)`.
    pub fn full() -> Self {
        Self {
            start: 0,
            end: SPACE_END,
        }
    }

    /// Shard `index`'s range of a ring of `shards` equal contiguous ranges: shard `i` holds
    /// `[i * 2^64 / shards, (i + 1) * 2^64 / shards)`, rounded down, so the ranges tile the
    /// space with no gap or overlap (4 shards: boundaries at 0x4000…, 0x8000…, 0xc000…, as in
    /// `ListOptions.shardSelector`'s doc).
    pub fn ring(shards: u32, index: u32) -> Result<Self, ShardSelectorError> {
        if index >= shards {
            return Err(ShardSelectorError::NoSuchShard { index, shards });
        }
        let bound = |i: u32| u128::from(i) * SPACE_END / u128::from(shards);
        // bound(index) < 2^64 because index < shards, and bound is strictly increasing in i
        // whenever shards <= 2^32 (always, for a u32), so the range is never empty.
        Ok(Self {
            start: bound(index) as u64,
            end: bound(index + 1),
        })
    }

    /// The index of the ring range ([`ring`](Self::ring)) of a ring of `shards` that holds
    /// `hash`. `shards` must be at least 1.
    pub fn ring_index(shards: u32, hash: u64) -> u32 {
        let shards = shards.max(1);
        // floor(hash * shards / 2^64) is the index or one below it: a range starts at its
        // bound rounded down, so a hash equal to a rounded-down bound is already in the next.
        let index = ((u128::from(hash) * u128::from(shards)) >> 64) as u32;
        let next_start = u128::from(index + 1) * SPACE_END / u128::from(shards);
        if index + 1 < shards && u128::from(hash) >= next_start {
            index + 1
        } else {
            index
        }
    }

    /// The inclusive start.
    pub fn start(&self) -> u64 {
        self.start
    }

    /// The exclusive end (2^64 for the last range of a ring).
    pub fn end(&self) -> u128 {
        self.end
    }

    /// Whether `hash` is in the range.
    pub fn contains(&self, hash: u64) -> bool {
        hash >= self.start && u128::from(hash) < self.end
    }
}

/// One or more hash ranges over one field: an object is selected when the FNV-1a 64 hash of
/// that field is in any of them (the ranges are OR-ed, as the apiserver's ` || `).
///
/// # Examples
/// ```
/// use kubeloop::cache::{HashRange, ShardSelector};
/// // Shard 0 of 4, by namespace.
/// let shard = ShardSelector::namespaces([HashRange::ring(4, 0)?])?;
/// assert_eq!(
///     shard.to_query(),
///     "shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000')",
/// );
/// // "default" hashes to 0xebada5168620c5fe: in shard 3, not 0.
/// assert!(!shard.contains("default"));
/// # Ok::<(), kubeloop::cache::ShardSelectorError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShardSelector {
    key: ShardKey,
    /// Never empty.
    ranges: Vec<HashRange>,
}

impl ShardSelector {
    /// Objects whose `key` hashes into any of `ranges` (at least one).
    pub fn new(
        key: ShardKey,
        ranges: impl IntoIterator<Item = HashRange>,
    ) -> Result<Self, ShardSelectorError> {
        let ranges: Vec<HashRange> = ranges.into_iter().collect();
        if ranges.is_empty() {
            return Err(ShardSelectorError::NoRanges);
        }
        Ok(Self { key, ranges })
    }

    /// Objects whose namespace hashes into any of `ranges`.
    pub fn namespaces(
        ranges: impl IntoIterator<Item = HashRange>,
    ) -> Result<Self, ShardSelectorError> {
        Self::new(ShardKey::Namespace, ranges)
    }

    /// Objects whose uid hashes into any of `ranges`.
    pub fn uids(ranges: impl IntoIterator<Item = HashRange>) -> Result<Self, ShardSelectorError> {
        Self::new(ShardKey::Uid, ranges)
    }

    /// The field hashed.
    pub fn key(&self) -> ShardKey {
        self.key
    }

    /// The ranges, in the order given (never empty).
    pub fn ranges(&self) -> &[HashRange] {
        &self.ranges
    }

    /// The `shardSelector` query value, exactly as the apiserver renders a selector (and so
    /// echoes it in a filtered list's `metadata.shardInfo.selector`).
    pub fn to_query(&self) -> String {
        self.to_string()
    }

    /// Whether an object whose selector field (namespace or uid) is `value` is selected.
    pub fn contains(&self, value: &str) -> bool {
        let hash = fnv1a_64(value.as_bytes());
        self.ranges.iter().any(|range| range.contains(hash))
    }

    /// Whether the object with this metadata is selected.
    pub fn matches(&self, meta: &ObjectMeta) -> bool {
        self.contains(self.key.value_of(meta))
    }
}

impl fmt::Display for ShardSelector {
    /// As apimachinery's `shardSelector.String()`: 16 hex digits per bound (the parser
    /// accepts no other length), 17 for 2^64.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, range) in self.ranges.iter().enumerate() {
            if i > 0 {
                f.write_str(" || ")?;
            }
            write!(
                f,
                "shardRange({}, '{:#018x}', '{:#018x}')",
                self.key.field_path(),
                range.start,
                range.end
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_64_matches_the_reference_vectors() {
        // The FNV reference vectors (Go's hash/fnv golden64a, the same algorithm the
        // apiserver calls).
        for (input, hash) in [
            ("", 0xcbf2_9ce4_8422_2325),
            ("a", 0xaf63_dc4c_8601_ec8c),
            ("abc", 0xe71f_a219_0541_574b),
            ("foobar", 0x8594_4171_f739_67e8),
        ] {
            assert_eq!(fnv1a_64(input.as_bytes()), hash, "{input:?}");
        }
    }

    #[test]
    fn ring_index_names_the_range_that_holds_the_hash_even_at_rounded_bounds() {
        for shards in [1, 2, 3, 4, 7, 200] {
            let mut probes = vec![0, u64::MAX, 0xcbf2_9ce4_8422_2325];
            for i in 0..shards {
                let range = HashRange::ring(shards, i).unwrap();
                probes.push(range.start());
                probes.push(range.start().wrapping_sub(1));
                probes.push((range.end() - 1) as u64);
            }
            for hash in probes {
                let index = HashRange::ring_index(shards, hash);
                assert!(
                    HashRange::ring(shards, index).unwrap().contains(hash),
                    "{hash:#x} of {shards} shards: not in range {index}"
                );
            }
        }
    }

    // Seen on kube-apiserver v1.36.3 with ShardedListAndWatch on: a LIST with shard 0 of 4
    // by namespace returned the ConfigMaps of shard-4lgxm and shard-87bkf and not those of
    // shard-k4vnp or shard-mb42v (tests/cluster/cache_shard_selector.rs checks 40 such
    // namespaces against the apiserver on every run).
    #[test]
    fn the_apiserver_put_these_namespaces_where_this_hash_does() {
        let shard = ShardSelector::namespaces([HashRange::ring(4, 0).unwrap()]).unwrap();
        assert_eq!(fnv1a_64(b"shard-4lgxm"), 0x32fd_6d8d_cdb8_bc40);
        assert_eq!(fnv1a_64(b"shard-k4vnp"), 0x494b_bb73_f305_72a7);
        for (namespace, selected) in [
            ("shard-4lgxm", true),
            ("shard-87bkf", true),
            ("shard-k4vnp", false),
            ("shard-mb42v", false),
        ] {
            assert_eq!(shard.contains(namespace), selected, "{namespace}");
        }
    }

    #[test]
    fn the_ring_tiles_the_space_as_list_options_documents_it() {
        let four: Vec<_> = (0..4).map(|i| HashRange::ring(4, i).unwrap()).collect();
        let bounds: Vec<_> = four.iter().map(|r| (r.start(), r.end())).collect();
        assert_eq!(
            bounds,
            [
                (0, 0x4000_0000_0000_0000),
                (0x4000_0000_0000_0000, 0x8000_0000_0000_0000),
                (0x8000_0000_0000_0000, 0xc000_0000_0000_0000),
                (0xc000_0000_0000_0000, 1 << 64),
            ]
        );
        // Any size: from 0 to 2^64, each range starting where the one before ends.
        for shards in [1, 3, 7, 1000, u32::MAX] {
            assert_eq!(HashRange::ring(shards, 0).unwrap().start(), 0);
            assert_eq!(HashRange::ring(shards, shards - 1).unwrap().end(), 1 << 64);
        }
        for shards in [3u32, 7, 1000] {
            for i in 0..shards - 1 {
                let here = HashRange::ring(shards, i).unwrap();
                let next = HashRange::ring(shards, i + 1).unwrap();
                assert_eq!(here.end(), u128::from(next.start()));
            }
        }
        assert_eq!(
            HashRange::ring(4, 4),
            Err(ShardSelectorError::NoSuchShard {
                index: 4,
                shards: 4
            })
        );
        assert!(HashRange::ring(0, 0).is_err());
    }

    #[test]
    fn a_range_is_start_inclusive_end_exclusive() {
        let range = HashRange::new(10, 20).unwrap();
        assert!(!range.contains(9));
        assert!(range.contains(10));
        assert!(range.contains(19));
        assert!(!range.contains(20));
        assert!(HashRange::full().contains(u64::MAX));
        assert!(HashRange::ring(4, 3).unwrap().contains(u64::MAX));
        assert_eq!(
            HashRange::new(5, 5),
            Err(ShardSelectorError::EmptyRange { start: 5, end: 5 })
        );
        assert_eq!(
            HashRange::new(0, (1 << 64) + 1),
            Err(ShardSelectorError::EndBeyondSpace { end: (1 << 64) + 1 })
        );
    }

    #[test]
    fn the_query_is_what_the_apiserver_renders_and_echoes() {
        let one = ShardSelector::namespaces([HashRange::ring(4, 0).unwrap()]).unwrap();
        assert_eq!(
            one.to_query(),
            "shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000')"
        );
        let two = ShardSelector::uids([
            HashRange::ring(2, 1).unwrap(),
            HashRange::new(0xff, 0x1_00).unwrap(),
        ])
        .unwrap();
        assert_eq!(
            two.to_query(),
            "shardRange(object.metadata.uid, '0x8000000000000000', '0x10000000000000000') \
             || shardRange(object.metadata.uid, '0x00000000000000ff', '0x0000000000000100')"
        );
        assert_eq!(
            ShardSelector::namespaces([]),
            Err(ShardSelectorError::NoRanges)
        );
    }

    #[test]
    fn an_object_is_selected_when_its_field_hashes_into_any_range() {
        // "default" hashes to 0xebada5168620c5fe, "kube-system" to 0xdf65c7bc1d82b35e.
        let default = fnv1a_64(b"default");
        assert_eq!(default, 0xebad_a516_8620_c5fe);
        let just_default =
            ShardSelector::namespaces([HashRange::new(default, u128::from(default) + 1).unwrap()])
                .unwrap();
        assert!(just_default.contains("default"));
        assert!(!just_default.contains("kube-system"));

        let last_quarter = ShardSelector::namespaces([HashRange::ring(4, 3).unwrap()]).unwrap();
        let first_quarter = ShardSelector::namespaces([HashRange::ring(4, 0).unwrap()]).unwrap();
        assert!(last_quarter.contains("default") && last_quarter.contains("kube-system"));
        assert!(!first_quarter.contains("default"));
        let either = ShardSelector::namespaces([
            HashRange::ring(4, 0).unwrap(),
            HashRange::ring(4, 3).unwrap(),
        ])
        .unwrap();
        assert!(either.contains("default"));

        let meta = ObjectMeta {
            namespace: Some("default".into()),
            uid: Some("abc".into()),
            ..ObjectMeta::default()
        };
        assert!(last_quarter.matches(&meta));
        // By uid: "abc" hashes to 0xe71fa2190541574b, in the last quarter too.
        assert!(
            ShardSelector::uids([HashRange::ring(4, 3).unwrap()])
                .unwrap()
                .matches(&meta)
        );
        // A cluster-scoped object has namespace "", hashed as the apiserver does.
        assert_eq!(
            last_quarter.matches(&ObjectMeta::default()),
            last_quarter.contains("")
        );
    }
}
