//! Values handed to a visitor as the very type it makes, where that type is one the decoder
//! can build better than the visitor would from Go's JSON of it:
//!
//! - `serde_json::Value` (k8s-openapi's `FieldsV1`, `RawExtension` and apiextensions' `JSON`
//!   hold one): the raw JSON on the wire is parsed into maps and arrays built at their length.
//!   serde_json's own visitor grows each map as it inserts (an `IndexMap` of one entry keeps
//!   room for three), which a typed cache would then rebuild to keep 100k objects' managedFields
//!   from holding about 54 MB of spare room (cache/store.rs, `shrink_metadata`).
//! - `jiff::Timestamp` (k8s-openapi's `Time` and `MicroTime`): made from the wire's seconds and
//!   nanoseconds, instead of written as RFC 3339 text for the visitor to parse back.
//!
//! Any other visitor gets Go's JSON form, as before.

use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::error::DecodeError as Error;

/// The types [`made_as`] makes.
///
/// # Safety
///
/// The type has no lifetime parameter (not even one that `'static` fixes), so that one
/// `TypeId` with lifetimes erased (`typeid::of`) means one type: [`made_as`] transmutes a
/// `T: Made` into a visitor's `Value` when their erased `TypeId`s match, which is sound only
/// if they are then the very same type, not the same type with other lifetimes.
pub(super) unsafe trait Made: 'static {}

// SAFETY: `serde_json::Value` has no lifetime parameter.
unsafe impl Made for Value {}

// SAFETY: `jiff::Timestamp` has no lifetime parameter.
unsafe impl Made for jiff::Timestamp {}

/// `make()` as what `V` makes, when `V` makes exactly a `T`; `None` (and `make` not called)
/// otherwise.
pub(super) fn made_as<'de, V: Visitor<'de>, T: Made>(
    make: impl FnOnce() -> Result<T, Error>,
) -> Option<Result<V::Value, Error>> {
    if typeid::of::<V::Value>() != typeid::of::<T>() {
        return None;
    }
    Some(make().map(|value| {
        let value = std::mem::ManuallyDrop::new(value);
        // SAFETY: `V::Value` and `T` have one `TypeId` with lifetimes erased, and `T` has no
        // lifetime parameter to differ in (`Made`'s contract): they are one type. `value` is
        // not dropped here; the copy owns it.
        unsafe { std::mem::transmute_copy::<T, V::Value>(&value) }
    }))
}

/// `raw` JSON as a `Value` whose every map and array is allocated at its length.
pub(super) fn exact_json(raw: &[u8]) -> Result<Value, Error> {
    let mut json = serde_json::Deserializer::from_slice(raw);
    let mut entries = Vec::new();
    let value = Exact {
        entries: &mut entries,
    }
    .deserialize(&mut json)
    .map_err(Error::json)?;
    json.end().map_err(Error::json)?;
    Ok(value)
}

/// A JSON value built as serde_json's own visitor builds it, but each map from its gathered
/// entries: `entries` is a stack the maps being read push onto, and each takes its own off the
/// top when it ends.
struct Exact<'s> {
    entries: &'s mut Vec<(String, Value)>,
}

impl<'de> DeserializeSeed<'de> for Exact<'_> {
    type Value = Value;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Exact<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Exact {
            entries: &mut *self.entries,
        })? {
            items.push(item);
        }
        items.shrink_to_fit();
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let start = self.entries.len();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(Exact {
                entries: &mut *self.entries,
            })?;
            self.entries.push((key, value));
        }
        let mut object = Map::with_capacity(self.entries.len() - start);
        object.extend(self.entries.drain(start..));
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of JSON value, nested, decodes to what serde_json's own visitor makes.
    #[test]
    fn exact_json_is_serde_jsons_value() {
        for raw in [
            r#"{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:data":{".":{},"f:k":{}}}"#,
            r#"[1, -2, 3.5, 1e300, 18446744073709551615, true, false, null, "\u00e9\n", [], {}]"#,
            r#"{"a":{"b":[{"c":1},{"c":2}]},"a":"the later duplicate wins"}"#,
            r#""a string""#,
            "0",
        ] {
            let want: Value = serde_json::from_str(raw).unwrap();
            assert_eq!(exact_json(raw.as_bytes()).unwrap(), want, "{raw}");
        }
        for bad in [r#"{"a":"#, r#"{"a":1} x"#, "", "[1,]"] {
            assert!(exact_json(bad.as_bytes()).is_err(), "{bad}");
        }
    }
}
