//! What a failed decode says: where (the JSON path of the field) and what.

/// Why bytes did not decode: malformed protobuf, or a message that does not fit the Rust type.
/// Says where (the JSON path of the field) and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", path_prefix(.path))]
pub struct DecodeError {
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
        Self {
            path: String::new(),
            message: format!("malformed protobuf: {message}"),
        }
    }

    pub(super) fn object(message: String) -> Self {
        Self {
            path: String::new(),
            message,
        }
    }

    pub(super) fn json(error: serde_json::Error) -> Self {
        Self::object(format!("raw JSON inside protobuf: {error}"))
    }

    /// The same error, one field further out.
    pub(super) fn within(mut self, field: &str) -> Self {
        self.path = if self.path.is_empty() {
            field.to_string()
        } else {
            format!("{field}.{}", self.path)
        };
        self
    }

    /// The JSON path of the field that did not decode (`spec.containers.image`), empty at the
    /// top.
    pub fn path(&self) -> &str {
        &self.path
    }
}
