//! The fuzz targets' bodies for the LIST and watch readers, `fuzz_<target>` (`fuzz/` runs them
//! under libFuzzer; the tests below replay the inputs that once failed,
//! `protobuf/testdata-fuzz/<target>/`): a body from the network, cut into chunks where the
//! input's head says ([`Head`](crate::protobuf::fuzz::Head)), read by the decoders the cache's
//! ListWatch uses, whole and in chunks, with a summary of what came out that must not depend on
//! where the chunks were cut. Built for the unit tests and under `--cfg fuzzing` (what
//! `hack/fuzz` builds with), nowhere else.

use std::fmt::Debug;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube_client::core::{PartialObjectMeta, WatchEvent};
use serde::de::DeserializeOwned;

use super::encoding::{DecodedList, ListDecodeError, ProtobufType};
use super::{json_list, json_watch, protobuf_list, protobuf_watch};
use crate::cache::list_watch_error::ListWatchError;
use crate::protobuf::fuzz::{Head, same};

/// Target `json_list`: a JSON LIST body read as Pods or as metadata only (choice bit 2).
/// Never a panic, and the same result in chunks as whole.
pub fn fuzz_json_list(data: &[u8]) {
    let Some((head, body)) = Head::split(data) else {
        return;
    };
    fn check<K: DeserializeOwned + Debug>(head: &Head, body: &[u8]) {
        let max = max_bytes(head);
        let whole = read_json_list::<K>(body, &[], max);
        same(
            whole,
            read_json_list::<K>(body, &head.cuts, max),
            &head.cuts,
        );
    }
    match head.choice(2, 1) {
        0 => check::<Pod>(&head, body),
        _ => check::<PartialObjectMeta<Pod>>(&head, body),
    }
}

/// Target `json_watch`: a JSON watch body read as Pods or as metadata only (choice bit 2).
/// Never a panic, and the same events in chunks as whole.
pub fn fuzz_json_watch(data: &[u8]) {
    let Some((head, body)) = Head::split(data) else {
        return;
    };
    fn check<K: DeserializeOwned + Debug + Send + 'static>(head: &Head, body: &[u8]) {
        let max = max_bytes(head);
        let whole = read_json_watch::<K>(body, &[], max);
        same(
            whole,
            read_json_watch::<K>(body, &head.cuts, max),
            &head.cuts,
        );
    }
    match head.choice(2, 1) {
        0 => check::<Pod>(&head, body),
        _ => check::<PartialObjectMeta<Pod>>(&head, body),
    }
}

/// Target `protobuf_list`: a protobuf LIST body read as Pods, ConfigMaps or metadata only
/// (choice bits 2-3), keeping each item's bytes or not (bit 4). Never a panic, and the same
/// result in chunks as whole.
pub fn fuzz_protobuf_list(data: &[u8]) {
    let Some((head, body)) = Head::split(data) else {
        return;
    };
    fn check<K>(head: &Head, body: &[u8])
    where
        K: DeserializeOwned + Debug + kube_client::Resource<DynamicType = ()>,
    {
        let (max, keep) = (max_bytes(head), head.choice(4, 1) == 1);
        let whole = read_protobuf_list::<K>(body, &[], max, keep).expect("a kind read as protobuf");
        let chunked = read_protobuf_list::<K>(body, &head.cuts, max, keep);
        same(Some(whole), chunked, &head.cuts);
    }
    match head.choice(2, 2) {
        0 => check::<Pod>(&head, body),
        1 => check::<ConfigMap>(&head, body),
        _ => check::<PartialObjectMeta<Pod>>(&head, body),
    }
}

/// Target `protobuf_watch`: a protobuf watch body (the framer, each frame's `WatchEvent`, its
/// envelope and object) read as Pods, ConfigMaps or metadata only (choice bits 2-3), keeping
/// the objects' bytes or not (bit 4). Never a panic, and the same events in chunks as whole.
pub fn fuzz_protobuf_watch(data: &[u8]) {
    let Some((head, body)) = Head::split(data) else {
        return;
    };
    fn check<K: DeserializeOwned + Debug + Send + 'static>(head: &Head, body: &[u8]) {
        let (max, keep) = (max_bytes(head), head.choice(4, 1) == 1);
        let whole = read_protobuf_watch::<K>(body, &[], max, keep);
        same(
            whole,
            read_protobuf_watch::<K>(body, &head.cuts, max, keep),
            &head.cuts,
        );
    }
    match head.choice(2, 2) {
        0 => check::<Pod>(&head, body),
        1 => check::<ConfigMap>(&head, body),
        _ => check::<PartialObjectMeta<Pod>>(&head, body),
    }
}

/// A bound on one object's bytes (choice bits 0-1): the cache's own (16 MiB), or one small
/// enough for the seeds' objects to cross, so the paths that skip an object over the bound
/// are reached.
fn max_bytes(head: &Head) -> usize {
    [crate::cache::MAX_OBJECT_BYTES, 64, 700, 5000][head.choice(0, 2)]
}

/// `body` cut at each of `cuts` (offsets, taken in order, past the end ignored).
fn chunks<'a>(body: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut from = 0;
    for &cut in cuts {
        if cut > from && cut < body.len() {
            out.push(&body[from..cut]);
            from = cut;
        }
    }
    out.push(&body[from..]);
    out
}

/// What a list decoder gave: its items, the list's metadata and the skipped items (or the
/// error), as text to compare.
fn list_summary<K: Debug>(decoded: Result<DecodedList<K>, ListDecodeError>) -> String {
    match decoded {
        Ok(list) => format!(
            "items {:?}\nmetadata {:?}\nundecodable {:?}\nsent {:?}",
            list.items, list.metadata, list.undecodable, list.sent
        ),
        Err(e) => format!("error: {e}"),
    }
}

/// A JSON LIST body read as `K`, fed in the chunks `cuts` makes; the summary of the result.
fn read_json_list<K: DeserializeOwned + Debug>(
    body: &[u8],
    cuts: &[usize],
    max_item_bytes: usize,
) -> String {
    let mut decoder = json_list::ListDecoder::<K>::new().with_max_item_bytes(max_item_bytes);
    for chunk in chunks(body, cuts) {
        if let Err(e) = decoder.feed(chunk) {
            return list_summary::<K>(Err(e));
        }
    }
    list_summary(decoder.finish())
}

/// A protobuf LIST body read as `K` (a kind the table knows, or `PartialObjectMetadata` when
/// `K` is metadata only), fed in the chunks `cuts` makes; the summary of the result. `None`
/// if `K` is not read as protobuf.
fn read_protobuf_list<K>(
    body: &[u8],
    cuts: &[usize],
    max_item_bytes: usize,
    keep_sent: bool,
) -> Option<String>
where
    K: DeserializeOwned + Debug + kube_client::Resource<DynamicType = ()>,
{
    let of = ProtobufType::of::<K>(&())?;
    let mut decoder = protobuf_list::ListDecoder::<K>::new(of, None, max_item_bytes, keep_sent);
    for chunk in chunks(body, cuts) {
        if let Err(e) = decoder.feed(chunk) {
            return Some(list_summary::<K>(Err(e)));
        }
    }
    Some(list_summary(decoder.finish()))
}

/// One watch event or error as text (an object over the bound with the name read from its
/// first bytes, which must not depend on where the chunks were cut either).
fn event_summary<K: Debug>(event: Result<WatchEvent<K>, ListWatchError>) -> String {
    match event {
        // `WatchEvent`'s own Debug leaves the object out.
        Ok(WatchEvent::Added(o)) => format!("Added {o:?}"),
        Ok(WatchEvent::Modified(o)) => format!("Modified {o:?}"),
        Ok(WatchEvent::Deleted(o)) => format!("Deleted {o:?}"),
        Ok(WatchEvent::Bookmark(b)) => format!(
            "Bookmark {:?} {} {:?}",
            b.types, b.metadata.resource_version, b.metadata.annotations
        ),
        Ok(WatchEvent::Error(status)) => format!("Error {status:?}"),
        Err(e) => format!("error: {e:?}"),
    }
}

/// A JSON watch body read as `K`, arriving in the chunks `cuts` makes; each event (or error)
/// as text.
fn read_json_watch<K: DeserializeOwned + Debug + Send + 'static>(
    body: &[u8],
    cuts: &[usize],
    max_line_bytes: usize,
) -> Vec<String> {
    let body: Vec<Result<Vec<u8>, kube_client::Error>> = chunks(body, cuts)
        .into_iter()
        .map(|c| Ok(c.to_vec()))
        .collect();
    let events = json_watch::watch_events_of_chunks::<K, _, _>(
        futures::stream::iter(body),
        "/fuzz".into(),
        max_line_bytes,
    );
    futures::executor::block_on(events.map(event_summary).collect())
}

/// A protobuf watch body read as `K`, arriving in the chunks `cuts` makes; each event (or
/// error) as text, with the bytes kept for it when `keep_sent`.
fn read_protobuf_watch<K: DeserializeOwned + Debug + Send + 'static>(
    body: &[u8],
    cuts: &[usize],
    max_frame_bytes: usize,
    keep_sent: bool,
) -> Vec<String> {
    let body: Vec<Result<Vec<u8>, kube_client::Error>> = chunks(body, cuts)
        .into_iter()
        .map(|c| Ok(c.to_vec()))
        .collect();
    let events = protobuf_watch::watch_events_of_chunks::<K, _, _>(
        futures::stream::iter(body),
        "/fuzz".into(),
        max_frame_bytes,
        keep_sent,
    );
    futures::executor::block_on(
        events
            .map(|e| match e {
                Ok((event, sent)) => format!("{} sent {sent:?}", event_summary::<K>(Ok(event))),
                Err(e) => event_summary::<K>(Err(e)),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protobuf::delimited;

    const POD: &[u8] = include_bytes!("../../protobuf/testdata/pod.pb");
    const POD_JSON: &str = include_str!("../../protobuf/testdata/pod.json");
    const CONFIG_MAP_LIST: &[u8] = include_bytes!("../../protobuf/testdata/configmap-list.pb");
    const CONFIG_MAP_LIST_JSON: &[u8] =
        include_bytes!("../../protobuf/testdata/configmap-list.json");

    /// An input: a head of `choices` and cuts at `cuts`, then `body`.
    fn input(choices: u8, cuts: &[u16], body: &[u8]) -> Vec<u8> {
        let mut out = vec![choices << 3 | cuts.len() as u8];
        for cut in cuts {
            out.extend(cut.to_be_bytes());
        }
        out.extend(body);
        out
    }

    /// The Pod fixture's message (no envelope).
    fn pod_message() -> &'static [u8] {
        crate::protobuf::Envelope::parse(POD).unwrap().raw
    }

    /// What the fuzz targets found (`protobuf/testdata-fuzz/<target>/`), replayed: an item
    /// that is nothing in a JSON list (skipped at the same place until memory ran out), a
    /// field length near 2^64 in a protobuf list (an overflow), an item over the bound whose
    /// metadata does not decode whole, named when cut short but not when read whole, and a
    /// skipped scalar ending at the start of a chunk taken for a value that is nothing, list
    /// metadata over the bound refused in chunks but decoded (and refused otherwise) whole; a
    /// protobuf watch frame over the bound named from the bytes of the frames after it.
    #[test]
    fn the_reader_targets_pass_on_the_inputs_they_once_failed_on() {
        crate::protobuf::fuzz::replay("json_list", fuzz_json_list);
        crate::protobuf::fuzz::replay("protobuf_list", fuzz_protobuf_list);
        crate::protobuf::fuzz::replay("protobuf_watch", fuzz_protobuf_watch);
    }

    /// The targets on well-formed bodies, with each bound (choice bits 0-1), cut in several
    /// places: they pass, and the readers decode what the bodies hold.
    #[test]
    fn the_reader_targets_pass_on_well_formed_bodies() {
        let pod_list = [
            &b"k8s\0"[..],
            &delimited(1, &[delimited(1, b"v1"), delimited(2, b"PodList")].concat()),
            &delimited(
                2,
                &[
                    delimited(1, &delimited(2, b"42")),
                    delimited(2, pod_message()),
                    delimited(2, pod_message()),
                ]
                .concat(),
            ),
        ]
        .concat();
        let event = [delimited(1, b"ADDED"), delimited(2, &delimited(1, POD))].concat();
        let frames = [&(event.len() as u32).to_be_bytes()[..], &event]
            .concat()
            .repeat(3);
        let json_pod_list = format!(
            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{"resourceVersion":"42"}},"items":[{POD_JSON},{POD_JSON}]}}"#
        );
        // One line each: the fixture is indented.
        let pod: serde_json::Value = serde_json::from_str(POD_JSON).unwrap();
        let json_lines = format!("{{\"type\":\"ADDED\",\"object\":{pod}}}\n").repeat(3);
        for bound in 0..4u8 {
            for cuts in [&[][..], &[1, 2, 3], &[40, 700, 1500, 4000]] {
                fuzz_protobuf_list(&input(bound, cuts, &pod_list));
                fuzz_protobuf_list(&input(bound | 1 << 2 | 1 << 4, cuts, CONFIG_MAP_LIST));
                fuzz_protobuf_watch(&input(bound | 1 << 4, cuts, &frames));
                fuzz_json_list(&input(bound, cuts, json_pod_list.as_bytes()));
                fuzz_json_list(&input(bound | 1 << 2, cuts, CONFIG_MAP_LIST_JSON));
                fuzz_json_watch(&input(bound, cuts, json_lines.as_bytes()));
            }
        }
        let max = crate::cache::MAX_OBJECT_BYTES;
        let listed = read_protobuf_list::<Pod>(&pod_list, &[9], max, false).unwrap();
        assert!(listed.starts_with("items [Pod {"), "{listed}");
        assert!(listed.contains("undecodable []"), "{listed}");
        let watched = read_protobuf_watch::<Pod>(&frames, &[9], max, false);
        assert_eq!(watched.len(), 3);
        assert!(
            watched.iter().all(|e| e.starts_with("Added Pod {")),
            "{watched:?}"
        );
        let listed = read_json_list::<Pod>(json_pod_list.as_bytes(), &[9], max);
        assert!(listed.starts_with("items [Pod {"), "{listed}");
        let watched = read_json_watch::<Pod>(json_lines.as_bytes(), &[9], max);
        assert_eq!(watched.len(), 3);
        assert!(
            watched.iter().all(|e| e.starts_with("Added Pod {")),
            "{watched:?}"
        );
    }
}
