//! What goes wrong talking to the apiserver: [`ListWatchError`], shared by the requests
//! (`list_watch.rs`) and the decoders of either wire (`wire/`), and the [`WatchStream`] they
//! hand the reflector.

use std::time::Duration;

use futures::stream::BoxStream;
use kube_client::core::{Status, WatchEvent};

use crate::protobuf;

use super::stored::SentBytes;
use super::undecodable::UndecodableObject;

/// The event stream of a WATCH.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, ListWatchError>>;

/// The event stream of a WATCH whose events may come with the bytes their objects were sent
/// as ([`ListerWatcher::watch_keeping_sent`](super::ListerWatcher::watch_keeping_sent)).
pub type SentWatchStream<K> =
    BoxStream<'static, Result<(WatchEvent<K>, Option<Box<SentBytes>>), ListWatchError>>;

/// What went wrong talking to the apiserver.
#[derive(Debug, thiserror::Error)]
pub enum ListWatchError {
    /// The apiserver answered with a failure `Status`.
    #[error("{verb} {url}: apiserver answered {code} {reason}: {message}")]
    Api {
        /// LIST or WATCH.
        verb: &'static str,
        /// Path and query.
        url: String,
        /// HTTP status code.
        code: u16,
        /// `Status.reason` (e.g. `Expired`, `Forbidden`).
        reason: String,
        /// `Status.message`.
        message: String,
        /// `Status.details.causes[].reason`.
        causes: Vec<String>,
        /// How many seconds the server asked the client to wait before trying again (429
        /// and some 5xx answers): the `Retry-After` header, else the Status's
        /// `details.retryAfterSeconds`. Whole seconds, as both carry it (see
        /// `retry_after_header`).
        retry_after_seconds: Option<u32>,
    },
    /// The request did not get an answer (connection refused, reset, TLS, ...).
    #[error("{verb} {url}: {source}")]
    Transport {
        /// LIST or WATCH.
        verb: &'static str,
        /// Path and query.
        url: String,
        /// The client error.
        #[source]
        source: kube_client::Error,
    },
    /// A response or watch line that is not what the protocol sends (not a list, not a
    /// watch event): the stream itself is broken.
    #[error("{verb} {url}: cannot decode the response: {source}")]
    Decode {
        /// LIST or WATCH.
        verb: &'static str,
        /// Path and query.
        url: String,
        /// The decoder error (JSON's or protobuf's).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A watch event whose object does not decode into the type, or a watch line over the
    /// size bound. Not a failure of the watch: the stream goes on, and the reflector skips
    /// the object (see `undecodable.rs`).
    #[error("{verb} {url}: skipping {object}")]
    Undecodable {
        /// WATCH.
        verb: &'static str,
        /// Path and query.
        url: String,
        /// The object skipped.
        #[source]
        object: Box<UndecodableObject>,
    },
}

impl ListWatchError {
    /// An error built from a watch `ERROR` event's `Status`.
    pub fn from_status(verb: &'static str, url: &str, status: &kube_client::core::Status) -> Self {
        ListWatchError::Api {
            verb,
            url: url.to_string(),
            code: status.code,
            reason: status.reason.clone(),
            message: status.message.clone(),
            causes: status
                .details
                .as_ref()
                .map(|d| d.causes.iter().map(|c| c.reason.clone()).collect())
                .unwrap_or_default(),
            retry_after_seconds: status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0),
        }
    }

    /// An error built from a failed HTTP answer: its `Status` body (or, for a body that is
    /// not one, a Status made from the text, as kube-client does) and its `Retry-After`
    /// header, which wins over the body's `details.retryAfterSeconds`.
    pub fn from_response(
        verb: &'static str,
        url: &str,
        code: http::StatusCode,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Self {
        let status = decode_status(body)
            .filter(|s| s.code != 0 || !s.reason.is_empty() || !s.message.is_empty())
            .unwrap_or_else(|| {
                Status::failure(String::from_utf8_lossy(body).trim(), "").with_code(code.as_u16())
            });
        let mut err = Self::from_status(verb, url, &status);
        if let ListWatchError::Api {
            code: c,
            retry_after_seconds,
            ..
        } = &mut err
        {
            if *c == 0 {
                *c = code.as_u16();
            }
            if let Some(header) = retry_after_header(headers) {
                *retry_after_seconds = Some(header);
            }
        }
        err
    }

    /// The HTTP code of an apiserver answer.
    pub fn code(&self) -> Option<u16> {
        match self {
            ListWatchError::Api { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// 410 Gone / reason Expired: the resourceVersion asked for was compacted
    /// (apimachinery `IsResourceExpired` / `IsGone`).
    pub fn is_expired(&self) -> bool {
        matches!(self, ListWatchError::Api { code, reason, .. }
            if *code == 410 || reason == "Expired" || reason == "Gone")
    }

    /// The apiserver's "Too large resource version" (504 with cause
    /// `ResourceVersionTooLarge`): the cache is behind the version asked for.
    pub fn is_too_large_resource_version(&self) -> bool {
        matches!(self, ListWatchError::Api { causes, message, .. }
            if causes.iter().any(|c| c == "ResourceVersionTooLarge")
                || message.contains("Too large resource version"))
    }

    /// 429 Too Many Requests.
    pub fn is_too_many_requests(&self) -> bool {
        self.code() == Some(429)
    }

    /// The delay the server asked for before the next attempt, if it named one
    /// (apimachinery `SuggestsClientDelay`, plus the `Retry-After` header client-go's rest
    /// client reads).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ListWatchError::Api {
                retry_after_seconds: Some(s),
                ..
            } => Some(Duration::from_secs((*s).into())),
            _ => None,
        }
    }

    /// The TCP connection was refused (apiserver down or restarting).
    pub fn is_connection_refused(&self) -> bool {
        let ListWatchError::Transport { source, .. } = self else {
            return false;
        };
        let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(source);
        while let Some(e) = cur {
            if let Some(io) = e.downcast_ref::<std::io::Error>()
                && io.kind() == std::io::ErrorKind::ConnectionRefused
            {
                return true;
            }
            if e.to_string().contains("Connection refused") {
                return true;
            }
            cur = e.source();
        }
        false
    }
}

/// A failure's `Status` body, in either wire: protobuf (`k8s\0` first) or JSON.
pub(crate) fn decode_status(body: &[u8]) -> Option<Status> {
    if body.starts_with(&protobuf::MAGIC) {
        protobuf::from_slice(body).ok()
    } else {
        serde_json::from_slice(body).ok()
    }
}

/// The `Retry-After` header in whole seconds, as client-go's rest client reads it
/// (`retryAfterSeconds` in rest/request.go: `strconv.Atoi`, so an HTTP date or a fraction is
/// ignored). Zero counts as no delay asked for.
pub(crate) fn retry_after_header(headers: &http::HeaderMap) -> Option<u32> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    let seconds: u32 = value.trim().parse().ok()?;
    (seconds > 0).then_some(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(retry_after: &str) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        h.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_str(retry_after).unwrap(),
        );
        h
    }

    // client-go: rest/request.go retryAfterSeconds (whole seconds only)
    #[test]
    fn retry_after_header_is_whole_seconds() {
        assert_eq!(retry_after_header(&headers("2")), Some(2));
        assert_eq!(retry_after_header(&headers(" 7 ")), Some(7));
        for ignored in ["0", "-1", "1.5", "Wed, 21 Oct 2015 07:28:00 GMT", ""] {
            assert_eq!(retry_after_header(&headers(ignored)), None, "{ignored:?}");
        }
        assert_eq!(retry_after_header(&http::HeaderMap::new()), None);
    }

    /// How the apiserver's watch cache answers while it is not ready (cacher.go's
    /// NewTooManyRequests); priority and fairness sends a plain-text body instead.
    const TOO_MANY: &str = r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"storage is (re)initializing","reason":"TooManyRequests","details":{"retryAfterSeconds":4},"code":429}"#;

    #[test]
    fn a_429_answer_carries_the_servers_delay() {
        let code = http::StatusCode::TOO_MANY_REQUESTS;
        // The header wins over the body's details.retryAfterSeconds.
        let e =
            ListWatchError::from_response("WATCH", "/w", code, &headers("2"), TOO_MANY.as_bytes());
        assert!(e.is_too_many_requests());
        assert_eq!(e.retry_after(), Some(Duration::from_secs(2)));
        assert!(e.to_string().contains("TooManyRequests"), "{e}");
        // Without the header, the body's details.
        let e = ListWatchError::from_response(
            "LIST",
            "/l",
            code,
            &http::HeaderMap::new(),
            TOO_MANY.as_bytes(),
        );
        assert_eq!(e.retry_after(), Some(Duration::from_secs(4)));
        // A body that is not a Status (priority and fairness answers in plain text) keeps the
        // HTTP code and the header.
        let e = ListWatchError::from_response(
            "WATCH",
            "/w",
            code,
            &headers("9"),
            b"Too many requests, please try again later.\n",
        );
        assert_eq!(e.code(), Some(429));
        assert_eq!(e.retry_after(), Some(Duration::from_secs(9)));
        assert!(e.to_string().contains("please try again later"), "{e}");
        // No delay named: none.
        let e = ListWatchError::from_response(
            "WATCH",
            "/w",
            http::StatusCode::FORBIDDEN,
            &http::HeaderMap::new(),
            br#"{"kind":"Status","status":"Failure","reason":"Forbidden","code":403}"#,
        );
        assert_eq!((e.code(), e.retry_after()), (Some(403), None));
    }

    #[test]
    fn error_classification() {
        let gone = ListWatchError::Api {
            verb: "WATCH",
            url: "/x".into(),
            code: 410,
            reason: "Expired".into(),
            message: "too old resource version".into(),
            causes: vec![],
            retry_after_seconds: None,
        };
        assert!(gone.is_expired());
        assert!(!gone.is_too_many_requests());
        let too_large = ListWatchError::Api {
            verb: "LIST",
            url: "/x".into(),
            code: 504,
            reason: "Timeout".into(),
            message: "Too large resource version: 10, current: 5".into(),
            causes: vec!["ResourceVersionTooLarge".into()],
            retry_after_seconds: None,
        };
        assert!(too_large.is_too_large_resource_version());
        assert!(!too_large.is_expired());
        assert!(gone.to_string().contains("/x") && gone.to_string().contains("410"));
    }
}
