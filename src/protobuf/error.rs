//! What a failed decode says: where (the JSON path of the field) and what.

/// Why bytes did not decode: malformed protobuf, or a message that does not fit the Rust type.
/// Says where (the JSON path of the field) and what.
///
/// One pointer wide (as serde_json's error), so the `Result`s every step of a decode returns
/// stay in registers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{}", path_prefix(&.0.path), .0.message)]
pub struct DecodeError(Box<Inner>);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Inner {
    path: String,
    message: String,
}

fn path_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("at {path}: ")
    }
}

impl DecodeError {
    pub(super) fn wire(message: String) -> Self {
        Self::object(format!("malformed protobuf: {message}"))
    }

    pub(super) fn object(message: String) -> Self {
        Self(Box::new(Inner {
            path: String::new(),
            message,
        }))
    }

    pub(super) fn json(error: serde_json::Error) -> Self {
        Self::object(format!("raw JSON inside protobuf: {error}"))
    }

    /// The same error, one field further out.
    pub(super) fn within(mut self, field: &str) -> Self {
        let path = &mut self.0.path;
        *path = if path.is_empty() {
            field.to_string()
        } else {
            format!("{field}.{path}")
        };
        self
    }

    /// The JSON path of the field that did not decode (`spec.containers.image`), empty at the
    /// top.
    pub fn path(&self) -> &str {
        &self.0.path
    }
}
