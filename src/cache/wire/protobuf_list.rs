//! Protobuf LIST bodies decoded item by item as their bytes arrive: [`ListReader`] cuts the
//! body into its parts, and each item is decoded into `K` (and transformed) as soon as it is
//! whole, so the list is never held whole, in bytes or untransformed objects. The JSON
//! counterpart is `json_list.rs`.
//!
//! An item that does not decode into `K`, or is over the size bound, is skipped and reported
//! in [`DecodedList::undecodable`], named from its first bytes ([`LooseNames`]), as in JSON.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::de::DeserializeOwned;

use super::encoding::{DecodedList, ListDecodeError, ProtobufType};
use crate::cache::store::{TransformFunc, apply_transform};
use crate::cache::stored::SentBytes;
use crate::cache::undecodable::{UndecodableObject, UndecodableReason};
use crate::protobuf::{ListPart, ListReader, LooseNames, ObjectType};

/// An incremental decoder of one protobuf LIST body.
pub(crate) struct ListDecoder<K> {
    reader: ListReader,
    of: ProtobufType,
    items: Vec<K>,
    undecodable: Vec<UndecodableObject>,
    metadata: ListMeta,
    /// Run on each item as it is decoded.
    transform: Option<TransformFunc<K>>,
    /// The bound on one item.
    max_item_bytes: usize,
    /// Whether each item's bytes are kept (never with a transform).
    keep_sent: bool,
    sent: Vec<SentBytes>,
}

impl<K: DeserializeOwned> ListDecoder<K> {
    /// A decoder at the start of a body listing `of`'s items; with `keep_sent` and no
    /// transform, it keeps the bytes each item was sent as.
    pub(crate) fn new(
        of: ProtobufType,
        transform: Option<TransformFunc<K>>,
        max_item_bytes: usize,
        keep_sent: bool,
    ) -> Self {
        Self {
            reader: ListReader::new(&of.list_kind, max_item_bytes),
            of,
            items: Vec::new(),
            undecodable: Vec::new(),
            metadata: ListMeta::default(),
            keep_sent: keep_sent && transform.is_none(),
            transform,
            max_item_bytes,
            sent: Vec::new(),
        }
    }

    /// Feeds the next bytes of the body; decodes every item they complete.
    pub(crate) fn feed(&mut self, bytes: &[u8]) -> Result<(), ListDecodeError> {
        let Self {
            reader,
            of,
            items,
            undecodable,
            metadata,
            transform,
            max_item_bytes,
            keep_sent,
            sent,
        } = self;
        let type_meta = of
            .item_type_meta
            .as_ref()
            .map(|[api_version, kind]| [api_version.as_str(), kind.as_str()]);
        reader.feed::<ListDecodeError>(bytes, |part| {
            let (names, reason) = match part {
                ListPart::Metadata(m) => {
                    *metadata = ObjectType::list_meta().decode(None, m)?;
                    return Ok(());
                }
                ListPart::Item(bytes) => match of.item.decode::<K>(type_meta, bytes) {
                    Ok(object) => {
                        items.push(apply_transform(transform.as_ref(), object));
                        if *keep_sent {
                            let [api_version, kind] = of.item_type.clone();
                            sent.push(SentBytes {
                                api_version,
                                kind,
                                message: bytes.to_vec(),
                            });
                        }
                        return Ok(());
                    }
                    Err(e) => (bytes, UndecodableReason::Decode(e.to_string())),
                },
                ListPart::Oversized { prefix, len } => (
                    prefix,
                    UndecodableReason::TooLarge {
                        size: len,
                        limit: *max_item_bytes,
                    },
                ),
            };
            undecodable.push(UndecodableObject::from_names(
                LooseNames::of_object(names),
                None,
                reason,
            ));
            Ok(())
        })
    }

    /// The body has ended: the items, the list metadata and the items skipped.
    pub(crate) fn finish(mut self) -> Result<DecodedList<K>, ListDecodeError> {
        self.reader.finish()?;
        self.items.shrink_to_fit();
        self.sent.shrink_to_fit();
        Ok(DecodedList {
            sent: self.sent,
            items: self.items,
            metadata: self.metadata,
            undecodable: self.undecodable,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cache::MAX_OBJECT_BYTES;
    use crate::protobuf::{Envelope, MAGIC, delimited};
    use k8s_openapi::api::core::v1::ConfigMap;

    /// A ConfigMapList (two items) that `hack/go/protobuf-table/fixtures.go` builds and
    /// k8s.io/apimachinery's protobuf serializer encodes, as the apiserver encodes a LIST
    /// body (`go run ./hack/go/protobuf-table -fixtures`); not captured from an apiserver.
    const LIST: &[u8] = include_bytes!("../../protobuf/testdata/configmap-list.pb");
    /// One ConfigMap (`default/web-config`), encoded the same way.
    const CONFIG_MAP: &[u8] = include_bytes!("../../protobuf/testdata/configmap.pb");

    fn decode(
        keep_sent: bool,
        transform: Option<TransformFunc<ConfigMap>>,
    ) -> DecodedList<ConfigMap> {
        let of = ProtobufType::of::<ConfigMap>(&()).expect("a built-in kind");
        let mut decoder = ListDecoder::new(of, transform, MAX_OBJECT_BYTES, keep_sent);
        for chunk in LIST.chunks(100) {
            decoder.feed(chunk).unwrap();
        }
        decoder.finish().unwrap()
    }

    /// A ConfigMap message `ns-x/broken` at resourceVersion 77 whose `data` comes in two
    /// runs (split by `immutable`): the decoder refuses it, its metadata reads.
    fn broken_config_map() -> Vec<u8> {
        let meta = [
            delimited(1, b"broken"),
            delimited(3, b"ns-x"),
            delimited(6, b"77"),
        ]
        .concat();
        let entry = |k: &[u8], v: &[u8]| delimited(2, &[delimited(1, k), delimited(2, v)].concat());
        [
            delimited(1, &meta),
            entry(b"a", b"1"),
            vec![0x20, 0x01],
            entry(b"b", b"2"),
        ]
        .concat()
    }

    // kubeloop's own (client-go fails the whole LIST): an item that does not decode is
    // skipped and named by namespace, name and resourceVersion, however the body is cut; the
    // items around it are kept.
    #[test]
    fn an_item_that_does_not_decode_is_skipped_and_named() {
        let good = Envelope::parse(CONFIG_MAP).unwrap().raw.to_vec();
        let list_meta = delimited(2, b"99");
        let items = [
            delimited(1, &list_meta),
            delimited(2, &good),
            delimited(2, &broken_config_map()),
            delimited(2, &good),
        ]
        .concat();
        let type_meta = [delimited(1, b"v1"), delimited(2, b"ConfigMapList")].concat();
        let body = [&MAGIC[..], &delimited(1, &type_meta), &delimited(2, &items)].concat();
        for chunk in [1, 13, body.len()] {
            let of = ProtobufType::of::<ConfigMap>(&()).expect("a built-in kind");
            let mut decoder = ListDecoder::new(of, None, MAX_OBJECT_BYTES, false);
            for bytes in body.chunks(chunk) {
                decoder.feed(bytes).unwrap();
            }
            let list: DecodedList<ConfigMap> = decoder.finish().unwrap();
            let names: Vec<_> = list.items.iter().map(|c| c.metadata.name.clone()).collect();
            assert_eq!(
                names,
                [Some("web-config".into()), Some("web-config".into())]
            );
            assert_eq!(list.metadata.resource_version.as_deref(), Some("99"));
            let [skipped] = &list.undecodable[..] else {
                panic!("one item skipped: {:?}", list.undecodable)
            };
            assert_eq!(skipped.key().as_deref(), Some("ns-x/broken"));
            assert_eq!(
                (skipped.resource_version.as_str(), skipped.event),
                ("77", None)
            );
            let text = skipped.to_string();
            assert!(
                text.starts_with("object ns-x/broken at resourceVersion 77 does not decode: ")
                    && text.contains("comes in two runs"),
                "chunks of {chunk}: {text}"
            );
        }
    }

    // kubeloop's own: asked to, a protobuf list keeps the bytes each item was sent as, which
    // decode to the item; not when not asked, and never with a transform.
    #[test]
    fn a_list_keeps_each_items_bytes_when_asked_and_untransformed() {
        let list = decode(true, None);
        assert!(!list.items.is_empty());
        assert_eq!(list.sent.len(), list.items.len());
        for (item, sent) in list.items.iter().zip(&list.sent) {
            assert_eq!((&*sent.api_version, &*sent.kind), ("v1", "ConfigMap"));
            let again: ConfigMap =
                crate::protobuf::decode_message(&sent.api_version, &sent.kind, &sent.message)
                    .unwrap();
            assert_eq!(&again, item);
        }
        assert!(decode(false, None).sent.is_empty());
        let transform: TransformFunc<ConfigMap> = Arc::new(|cm| cm);
        assert!(decode(true, Some(transform)).sent.is_empty());
    }
}
