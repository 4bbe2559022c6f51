//! Look-ups in the generated table: a message by index, and the message of a top-level kind.

use super::generated::{MESSAGES, ROOTS};
use super::table::Message;

/// The message at `index`.
pub(crate) fn message(index: u16) -> &'static Message {
    &MESSAGES[usize::from(index)]
}

/// The message of a top-level kind (`"v1"`, `"ConfigMap"`), if the table has it.
pub(crate) fn root(api_version: &str, kind: &str) -> Option<&'static Message> {
    ROOTS
        .binary_search_by(|r| (r.api_version, r.kind).cmp(&(api_version, kind)))
        .ok()
        .map(|i| message(ROOTS[i].message))
}

/// meta/v1 `ListMeta`.
pub(crate) fn list_meta() -> &'static Message {
    static LIST_META: std::sync::OnceLock<&'static Message> = std::sync::OnceLock::new();
    LIST_META.get_or_init(|| {
        MESSAGES
            .iter()
            .find(|m| m.go == "k8s.io/apimachinery/pkg/apis/meta/v1.ListMeta")
            .expect("the table has meta/v1 ListMeta")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_are_sorted_and_name_their_messages() {
        assert!(
            ROOTS
                .windows(2)
                .all(|w| (w[0].api_version, w[0].kind) < (w[1].api_version, w[1].kind))
        );
        assert_eq!(
            root("v1", "ConfigMap").unwrap().go,
            "k8s.io/api/core/v1.ConfigMap"
        );
        assert_eq!(
            root("apps/v1", "DeploymentList").unwrap().short_name(),
            "v1.DeploymentList"
        );
        assert_eq!(
            root("meta.k8s.io/v1", "PartialObjectMetadata").unwrap().go,
            "k8s.io/apimachinery/pkg/apis/meta/v1.PartialObjectMetadata"
        );
        assert!(root("v1", "NoSuchKind").is_none());
    }

    #[test]
    fn fields_are_sorted_by_tag_and_fit_the_seen_set() {
        for m in &MESSAGES {
            assert!(m.fields.windows(2).all(|w| w[0].tag < w[1].tag), "{}", m.go);
            assert!(m.fields.len() <= 128, "{}", m.go);
        }
    }
}
