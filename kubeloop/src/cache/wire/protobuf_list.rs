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
}

impl<K: DeserializeOwned> ListDecoder<K> {
    /// A decoder at the start of a body listing `of`'s items.
    pub(crate) fn new(
        of: ProtobufType,
        transform: Option<TransformFunc<K>>,
        max_item_bytes: usize,
    ) -> Self {
        Self {
            reader: ListReader::new(&of.list_kind, max_item_bytes),
            of,
            items: Vec::new(),
            undecodable: Vec::new(),
            metadata: ListMeta::default(),
            transform,
            max_item_bytes,
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
        Ok(DecodedList {
            items: self.items,
            metadata: self.metadata,
            undecodable: self.undecodable,
        })
    }
}
