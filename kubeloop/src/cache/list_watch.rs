//! Raw LIST and WATCH requests: client-go `tools/cache/listwatch.go` plus the parts of the
//! typed clients it calls.
//!
//! kube-client only carries the HTTP request (auth, TLS, kubeconfig); the URL, the query
//! parameters and the meaning of the responses are built here. [`ListerWatcher`] is the seam
//! the [`Reflector`](super::Reflector) talks to, so its state machine can be unit-tested
//! against an in-memory fake; [`ListWatch`] is the real implementation.
//!
//! Works for typed k8s-openapi resources (`DynamicType = ()`) and for
//! [`DynamicObject`](kube_client::core::DynamicObject) (`DynamicType = ApiResource`).
//!
//! Requests go out with kube-client's `Client::send`, which hands back the whole HTTP
//! response: a failure keeps its `Retry-After` header (kube-client's `request_events` and
//! `request_stream` drop the headers) in [`ListWatchError::retry_after`]. The watch body is
//! split into lines and decoded here, as apimachinery's `StreamWatcher` under client-go's
//! rest client does: a complete line that is not a watch event is a decode error that ends
//! the watch; only an unterminated last line, cut off with the connection, is dropped. An
//! event whose object does not decode into the type, and a watch line or a list item over
//! the size bound, are not errors of the stream: the object is skipped and reported
//! ([`ListWatchError::Undecodable`], [`ListPage::undecodable`]; see `undecodable.rs`).
//!
//! Metadata-only: a `ListWatch<PartialObjectMeta<K>>` (kube-client's type, whose `Resource`
//! says `metadata_api()`) asks for `PartialObjectMetadata` by content negotiation, as
//! client-go's `metadata` client does (`metadata/metadata.go`: the `Accept` headers of its
//! List and Watch, their JSON parts; kube-rs asks the same): the apiserver sends each object's
//! metadata only, through the same list, streaming list and watch.
//!
//! Below `send`, kube-client's retry layer (`Config::default_retry`, on by default) retries
//! 429, 503 and 504 answers itself, honouring `Retry-After`, as client-go's rest client
//! does; an answer reaches this module as an error only when those retries run out, or
//! every time with `default_retry` off.

use std::fmt::Write as _;
use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{AsyncBufRead, AsyncBufReadExt, StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use kube_client::client::Body;
use kube_client::core::{Status, WatchEvent};
use kube_client::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::list_decoder::{ListDecodeError, ListDecoder};
use super::store::TransformFunc;
use super::undecodable::{MAX_OBJECT_BYTES, UndecodableObject, oversized_event, undecodable_event};

/// The object bound every cache type satisfies: any Kubernetes resource, typed or dynamic.
pub trait CacheObject:
    Resource<DynamicType: Clone + Send + Sync + 'static>
    + Clone
    + Serialize
    + DeserializeOwned
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<K> CacheObject for K where
    K: Resource<DynamicType: Clone + Send + Sync + 'static>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// Parameters of one LIST page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// `resourceVersion`; `None` leaves it out (most recent, quorum read).
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (`NotOlderThan` / `Exact`).
    pub resource_version_match: Option<String>,
    /// `limit`: page size; `None` asks for everything at once.
    pub limit: Option<u32>,
    /// `continue`: the token of the previous page.
    pub continue_token: Option<String>,
}

/// Parameters of a WATCH.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// `resourceVersion` to start after; "" means "from now" (or a consistent snapshot with
    /// `send_initial_events`).
    pub resource_version: String,
    /// `resourceVersionMatch` (required as `NotOlderThan` with `send_initial_events`).
    pub resource_version_match: Option<String>,
    /// `timeoutSeconds`: the server ends the watch after this long.
    pub timeout_seconds: Option<u32>,
    /// `allowWatchBookmarks`.
    pub allow_watch_bookmarks: bool,
    /// `sendInitialEvents` (the streaming list).
    pub send_initial_events: bool,
}

/// One page of a LIST.
#[derive(Debug, Clone)]
pub struct ListPage<K> {
    /// The objects of this page.
    pub items: Vec<K>,
    /// `metadata.resourceVersion` of the list.
    pub resource_version: String,
    /// `metadata.continue`, `None` on the last page.
    pub continue_token: Option<String>,
    /// The items of this page that were skipped: not decodable into `K`, or over the size
    /// bound. Never fatal to the page.
    pub undecodable: Vec<UndecodableObject>,
}

/// The event stream of a WATCH.
pub type WatchStream<K> = BoxStream<'static, Result<WatchEvent<K>, ListWatchError>>;

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
        /// [`retry_after_header`]).
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
        /// The decoder error.
        #[source]
        source: kube_client::Error,
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
        let status = serde_json::from_slice::<Status>(body)
            .ok()
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

/// LIST and WATCH of one resource type (client-go `ListerWatcher`).
pub trait ListerWatcher<K>: Send + Sync + 'static {
    /// One LIST page.
    fn list(
        &self,
        options: &ListOptions,
    ) -> impl Future<Output = Result<ListPage<K>, ListWatchError>> + Send;

    /// Opens a WATCH.
    fn watch(
        &self,
        options: &WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<K>, ListWatchError>> + Send;

    /// A short description of the type for logs and metrics, e.g. `v1/configmaps`.
    fn type_description(&self) -> String;

    /// [`list`](Self::list), running `transform` on each object as it is decoded, so a big
    /// LIST never holds all its objects untransformed at once (their managedFields, say).
    /// The default decodes the page first, then transforms.
    fn list_transformed(
        &self,
        options: &ListOptions,
        transform: Option<TransformFunc<K>>,
    ) -> impl Future<Output = Result<ListPage<K>, ListWatchError>> + Send
    where
        K: Send + 'static,
    {
        let page = self.list(options);
        async move {
            let mut page = page.await?;
            if let Some(t) = transform {
                page.items = page.items.into_iter().map(|o| t(o)).collect();
            }
            Ok(page)
        }
    }

    /// Whether `watch` understands `sendInitialEvents` (client-go
    /// `IsWatchListSemanticsUnSupported`, inverted): a reflector streams its list only then.
    /// True for the real apiserver; fakes that only replay events say false.
    fn supports_watch_list(&self) -> bool {
        true
    }
}

/// The real [`ListerWatcher`]: requests through a kube-client [`Client`].
pub struct ListWatch<K: Resource> {
    client: Client,
    /// `/api/v1/namespaces/ns/configmaps` or `/apis/group/version/plural`.
    path: String,
    description: String,
    label_selector: Option<String>,
    field_selector: Option<String>,
    /// The bound on one watch line or list item.
    max_object_bytes: usize,
    _marker: std::marker::PhantomData<fn() -> K>,
}

impl<K: Resource> Clone for ListWatch<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            path: self.path.clone(),
            description: self.description.clone(),
            label_selector: self.label_selector.clone(),
            field_selector: self.field_selector.clone(),
            max_object_bytes: self.max_object_bytes,
            _marker: std::marker::PhantomData,
        }
    }
}

impl<K: Resource> ListWatch<K> {
    /// All objects of a type in all namespaces (or the cluster-scoped type).
    pub fn all(client: Client) -> Self
    where
        K::DynamicType: Default,
    {
        Self::new(client, &Default::default(), None)
    }

    /// Objects in one namespace.
    pub fn namespaced(client: Client, namespace: &str) -> Self
    where
        K::DynamicType: Default,
    {
        Self::new(client, &Default::default(), Some(namespace))
    }

    /// Any type, with its dynamic type information (an `ApiResource` for `DynamicObject`).
    pub fn new(client: Client, dyntype: &K::DynamicType, namespace: Option<&str>) -> Self {
        let path = K::url_path(dyntype, namespace);
        let api_version = K::api_version(dyntype);
        let plural = K::plural(dyntype);
        Self {
            client,
            path,
            description: format!("{api_version}/{plural}"),
            label_selector: None,
            field_selector: None,
            max_object_bytes: MAX_OBJECT_BYTES,
            _marker: std::marker::PhantomData,
        }
    }

    /// Restricts to objects matching a label selector (`labelSelector`).
    pub fn labels(mut self, selector: &str) -> Self {
        self.label_selector = Some(selector.to_string()).filter(|s| !s.is_empty());
        self
    }

    /// Restricts to objects matching a field selector (`fieldSelector`).
    pub fn fields(mut self, selector: &str) -> Self {
        self.field_selector = Some(selector.to_string()).filter(|s| !s.is_empty());
        self
    }

    /// Skips a watch line or a list item over `bytes` as undecodable. Default
    /// [`MAX_OBJECT_BYTES`](super::MAX_OBJECT_BYTES), client-go's 16 MiB.
    pub fn max_object_bytes(mut self, bytes: usize) -> Self {
        self.max_object_bytes = bytes;
        self
    }

    /// The collection path requests go to.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The `Accept` header of a LIST: JSON, or [`METADATA_LIST_ACCEPT`] for a metadata-only
    /// type (`PartialObjectMeta<K>`).
    pub fn list_accept(&self) -> &'static str {
        Self::accept(METADATA_LIST_ACCEPT)
    }

    /// The `Accept` header of a WATCH: JSON, or [`METADATA_WATCH_ACCEPT`].
    pub fn watch_accept(&self) -> &'static str {
        Self::accept(METADATA_WATCH_ACCEPT)
    }

    fn accept(metadata_only: &'static str) -> &'static str {
        if K::metadata_api() {
            metadata_only
        } else {
            "application/json"
        }
    }

    fn selector_params(&self, q: &mut Query) {
        if let Some(l) = &self.label_selector {
            q.push("labelSelector", l);
        }
        if let Some(f) = &self.field_selector {
            q.push("fieldSelector", f);
        }
    }

    /// The LIST URL for `options`.
    pub fn list_url(&self, options: &ListOptions) -> String {
        let mut q = Query::default();
        self.selector_params(&mut q);
        if let Some(l) = options.limit {
            q.push("limit", &l.to_string());
        }
        if let Some(c) = &options.continue_token {
            q.push("continue", c);
        }
        if let Some(rv) = &options.resource_version {
            q.push("resourceVersion", rv);
        }
        if let Some(m) = &options.resource_version_match {
            q.push("resourceVersionMatch", m);
        }
        q.finish(&self.path)
    }

    /// The WATCH URL for `options`.
    pub fn watch_url(&self, options: &WatchOptions) -> String {
        let mut q = Query::default();
        q.push("watch", "true");
        self.selector_params(&mut q);
        if !options.resource_version.is_empty() {
            q.push("resourceVersion", &options.resource_version);
        }
        if let Some(m) = &options.resource_version_match {
            q.push("resourceVersionMatch", m);
        }
        if let Some(t) = options.timeout_seconds {
            q.push("timeoutSeconds", &t.to_string());
        }
        if options.allow_watch_bookmarks {
            q.push("allowWatchBookmarks", "true");
        }
        if options.send_initial_events {
            q.push("sendInitialEvents", "true");
        }
        q.finish(&self.path)
    }
}

fn list_decode_error(url: &str, e: ListDecodeError) -> ListWatchError {
    // Only the list's own shape and metadata can fail it; items that do not decode are
    // skipped.
    let source = match e {
        ListDecodeError::Item { source, .. } => source,
        other => <serde_json::Error as serde::de::Error>::custom(other),
    };
    ListWatchError::Decode {
        verb: "LIST",
        url: url.to_string(),
        source: kube_client::Error::SerdeError(source),
    }
}

fn classify(verb: &'static str, url: &str, err: kube_client::Error) -> ListWatchError {
    match err {
        kube_client::Error::Api(status) => ListWatchError::from_status(verb, url, &status),
        e @ kube_client::Error::SerdeError(_) => ListWatchError::Decode {
            verb,
            url: url.to_string(),
            source: e,
        },
        e => ListWatchError::Transport {
            verb,
            url: url.to_string(),
            source: e,
        },
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

/// Sends `req` and turns a 4xx or 5xx answer into [`ListWatchError::Api`] with its headers
/// read (kube-client's `handle_api_errors`, which drops them).
async fn send(
    client: &Client,
    verb: &'static str,
    url: &str,
    req: http::Request<Vec<u8>>,
) -> Result<http::Response<Body>, ListWatchError> {
    let res = client
        .send(req.map(Body::from))
        .await
        .map_err(|e| classify(verb, url, e))?;
    let code = res.status();
    if !(code.is_client_error() || code.is_server_error()) {
        return Ok(res);
    }
    let (parts, body) = res.into_parts();
    let body = body
        .collect_bytes()
        .await
        .map_err(|e| classify(verb, url, e))?;
    Err(ListWatchError::from_response(
        verb,
        url,
        code,
        &parts.headers,
        &body,
    ))
}

/// `Accept` of a metadata-only LIST: `PartialObjectMetadataList`, or plain JSON from a server
/// that cannot convert (whose full objects decode into `PartialObjectMeta` all the same).
pub const METADATA_LIST_ACCEPT: &str =
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
/// `Accept` of a metadata-only WATCH (and streaming list): one `PartialObjectMetadata` per event.
pub const METADATA_WATCH_ACCEPT: &str =
    "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

fn get_request(url: &str, accept: &'static str) -> http::Request<Vec<u8>> {
    let mut req = http::Request::new(Vec::new());
    // The URL is built from a path the Resource trait gives and escaped parameters, so it
    // always parses; a failure would be a bug here, reported as a 400 by the server at worst.
    *req.uri_mut() = url.parse().unwrap_or_else(|_| http::Uri::from_static("/"));
    req.headers_mut()
        .insert(http::header::ACCEPT, http::HeaderValue::from_static(accept));
    req
}

impl<K: CacheObject> ListerWatcher<K> for ListWatch<K> {
    fn list(
        &self,
        options: &ListOptions,
    ) -> impl Future<Output = Result<ListPage<K>, ListWatchError>> + Send {
        self.list_transformed(options, None)
    }

    fn list_transformed(
        &self,
        options: &ListOptions,
        transform: Option<TransformFunc<K>>,
    ) -> impl Future<Output = Result<ListPage<K>, ListWatchError>> + Send {
        let url = self.list_url(options);
        let client = self.client.clone();
        let max_object_bytes = self.max_object_bytes;
        let accept = self.list_accept();
        async move {
            // The body is decoded item by item as it arrives (list_decoder.rs): a LIST the
            // watch cache answers whole is never held as one string.
            let res = send(&client, "LIST", &url, get_request(&url, accept)).await?;
            let reader = res
                .into_body()
                .into_data_stream()
                .map_err(std::io::Error::other)
                .into_async_read();
            let mut reader = std::pin::pin!(reader);
            let mut decoder = ListDecoder::<K>::new()
                .with_transform(transform)
                .with_max_item_bytes(max_object_bytes);
            loop {
                let chunk = reader
                    .fill_buf()
                    .await
                    .map_err(|e| ListWatchError::Transport {
                        verb: "LIST",
                        url: url.clone(),
                        source: kube_client::Error::ReadEvents(e),
                    })?;
                if chunk.is_empty() {
                    break;
                }
                let n = chunk.len();
                decoder
                    .feed(chunk)
                    .map_err(|e| list_decode_error(&url, e))?;
                reader.as_mut().consume(n);
            }
            let list = decoder.finish().map_err(|e| list_decode_error(&url, e))?;
            Ok(ListPage {
                items: list.items,
                resource_version: list.metadata.resource_version.unwrap_or_default(),
                continue_token: list.metadata.continue_.filter(|c| !c.is_empty()),
                undecodable: list.undecodable,
            })
        }
    }

    fn watch(
        &self,
        options: &WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<K>, ListWatchError>> + Send {
        let url = self.watch_url(options);
        let client = self.client.clone();
        let max_object_bytes = self.max_object_bytes;
        let accept = self.watch_accept();
        async move {
            let mut req = get_request(&url, accept);
            // As kube-client's request_events: watch streams are not compressed (a gzip
            // member per event is more than its decompression layer reads).
            req.headers_mut().insert(
                http::header::ACCEPT_ENCODING,
                http::HeaderValue::from_static("identity"),
            );
            let res = send(&client, "WATCH", &url, req).await?;
            Ok(watch_events(res.into_body(), url, max_object_bytes))
        }
    }

    fn type_description(&self) -> String {
        self.description.clone()
    }
}

/// The event stream of a watch body: newline-delimited JSON, one `WatchEvent` a line
/// (apimachinery's `StreamWatcher` over the JSON framer, as client-go's rest client sets it up).
///
/// - A complete line that is not a watch event is a [`ListWatchError::Decode`] (a line
///   carrying a bare `Status`, kind `Status`, is an [`ListWatchError::Api`]): the
///   reflector ends the watch and relists, as the StreamWatcher reports a decode
///   error and stops. kube-client's `request_events` would read any JSON object that is not
///   an event as a `Status` (all its fields have defaults), which hides what went wrong.
/// - An `ADDED`, `MODIFIED` or `DELETED` event whose object does not decode into `K`, and a
///   line over `max_line_bytes` (dropped as it streams past, never buffered whole), are a
///   [`ListWatchError::Undecodable`] naming the object, and the stream goes on (client-go's
///   StreamWatcher ends the watch on both; see `undecodable.rs`).
/// - The body ending, or breaking with an unexpected EOF, ends the stream (the reflector
///   re-watches); an unterminated last line is dropped unless it decodes whole.
/// - Any other read failure is a [`ListWatchError::Transport`], after which the stream ends.
fn watch_events<K: CacheObject>(body: Body, url: String, max_line_bytes: usize) -> WatchStream<K> {
    watch_events_of_chunks(body.into_data_stream(), url, max_line_bytes)
}

/// [`watch_events`] over the body's chunks as they arrive.
fn watch_events_of_chunks<K, S, D>(chunks: S, url: String, max_line_bytes: usize) -> WatchStream<K>
where
    K: CacheObject,
    S: futures::Stream<Item = Result<D, kube_client::Error>> + Send + Unpin + 'static,
    D: AsRef<[u8]>,
{
    /// Invariants: `buf[start..start + scanned]` holds no newline; while `oversized` is set,
    /// the line it names is being dropped and `buf` holds only its bytes since the last read.
    struct Lines<S> {
        body: S,
        buf: Vec<u8>,
        /// Where the unread part of `buf` starts.
        start: usize,
        /// How many bytes after `start` are known to hold no newline, so a line that arrives
        /// in many chunks is searched once, not once per chunk.
        scanned: usize,
        ended: bool,
        url: String,
        max_line_bytes: usize,
        /// The line over the bound streaming past: the object it names, its bytes so far.
        oversized: Option<(UndecodableObject, usize)>,
    }
    let lines = Lines {
        body: chunks,
        buf: Vec::new(),
        start: 0,
        scanned: 0,
        ended: false,
        url,
        max_line_bytes,
        oversized: None,
    };
    futures::stream::unfold(lines, |mut st| async move {
        loop {
            let from = st.start + st.scanned;
            if let Some(n) = st.buf[from..].iter().position(|b| *b == b'\n') {
                let line = &st.buf[st.start..from + n];
                st.start = from + n + 1;
                st.scanned = 0;
                let oversized = match st.oversized.take() {
                    Some((skip, size)) => Some(skip.with_size(size + line.len())),
                    None if line.len() > st.max_line_bytes => {
                        Some(oversized_event(line, line.len(), st.max_line_bytes))
                    }
                    None => None,
                };
                if let Some(skip) = oversized {
                    let err = ListWatchError::Undecodable {
                        verb: "WATCH",
                        url: st.url.clone(),
                        object: Box::new(skip),
                    };
                    return Some((Err(err), st));
                }
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let event = decode_watch_line(line, &st.url);
                return Some((event, st));
            }
            if st.ended {
                let rest = std::mem::take(&mut st.buf);
                let rest = &rest[std::mem::take(&mut st.start)..];
                st.scanned = 0;
                // A line over the bound cut off by the close is dropped like any cut line.
                if st.oversized.take().is_some() || rest.iter().all(u8::is_ascii_whitespace) {
                    return None;
                }
                return match decode_watch_line::<K>(rest, &st.url) {
                    Err(ListWatchError::Decode { .. }) => None,
                    event => Some((event, st)),
                };
            }
            let pending = st.buf.len() - st.start;
            if let Some((_, size)) = &mut st.oversized {
                *size += pending;
                st.buf.clear();
                st.start = 0;
                st.scanned = 0;
            } else if pending > st.max_line_bytes {
                // Named from its first bytes, then dropped as it streams past.
                let skip = oversized_event(&st.buf[st.start..], 0, st.max_line_bytes);
                st.oversized = Some((skip, pending));
                st.buf.clear();
                st.start = 0;
                st.scanned = 0;
            } else {
                // Keep only the unread tail before reading more: each byte is moved once.
                st.scanned = pending;
                st.buf.drain(..st.start);
                st.start = 0;
            }
            match st.body.next().await {
                Some(Ok(chunk)) => st.buf.extend_from_slice(chunk.as_ref()),
                None => st.ended = true,
                Some(Err(e)) if ends_cleanly(&e) => {
                    tracing::debug!(url = %st.url, "watch stream ended: {e}");
                    st.ended = true;
                }
                Some(Err(e)) => {
                    let err = ListWatchError::Transport {
                        verb: "WATCH",
                        url: st.url.clone(),
                        source: kube_client::Error::ReadEvents(std::io::Error::other(e)),
                    };
                    st.buf.clear();
                    st.start = 0;
                    st.scanned = 0;
                    st.oversized = None;
                    st.ended = true;
                    return Some((Err(err), st));
                }
            }
        }
    })
    .boxed()
}

fn decode_watch_line<K: CacheObject>(
    line: &[u8],
    url: &str,
) -> Result<WatchEvent<K>, ListWatchError> {
    match serde_json::from_slice::<WatchEvent<K>>(line) {
        Ok(event) => Ok(event),
        Err(source) => {
            #[derive(serde::Deserialize)]
            struct Kind {
                #[serde(default)]
                kind: String,
            }
            if serde_json::from_slice::<Kind>(line).is_ok_and(|k| k.kind == "Status")
                && let Ok(status) = serde_json::from_slice::<Status>(line)
            {
                return Err(ListWatchError::from_status("WATCH", url, &status));
            }
            if let Some(skip) = undecodable_event(line, &source) {
                return Err(ListWatchError::Undecodable {
                    verb: "WATCH",
                    url: url.to_string(),
                    object: Box::new(skip),
                });
            }
            Err(ListWatchError::Decode {
                verb: "WATCH",
                url: url.to_string(),
                source: kube_client::Error::SerdeError(source),
            })
        }
    }
}

/// A read failure that is how watch streams end: the connection closed mid-chunk (kube-client
/// treats an `UnexpectedEof` anywhere in the chain, or hyper's "unexpected EOF during chunk",
/// as a resumable end) or a client read timeout.
fn ends_cleanly(err: &kube_client::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::TimedOut
            )
        {
            return true;
        }
        if e.to_string().contains("unexpected EOF during chunk") {
            return true;
        }
        cur = e.source();
    }
    false
}

/// A query string with percent-encoded values.
#[derive(Default)]
struct Query {
    out: String,
}

impl Query {
    fn push(&mut self, key: &str, value: &str) {
        self.out.push(if self.out.is_empty() { '?' } else { '&' });
        self.out.push_str(key);
        self.out.push('=');
        for b in value.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                self.out.push(b as char);
            } else {
                let _ = write!(self.out, "%{b:02X}");
            }
        }
    }

    fn finish(self, path: &str) -> String {
        format!("{path}{}", self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind, PartialObjectMeta};

    fn client() -> Client {
        // A client that is never used to send: only URL building is tested here.
        let cfg = kube_client::Config::new("http://127.0.0.1:1".parse().unwrap());
        Client::try_from(cfg).unwrap()
    }

    #[tokio::test]
    async fn list_urls_carry_paging_and_selectors() {
        let lw = ListWatch::<ConfigMap>::namespaced(client(), "ns1")
            .labels("app in (a,b),!x")
            .fields("metadata.name=foo");
        let url = lw.list_url(&ListOptions {
            resource_version: Some("0".into()),
            limit: Some(500),
            ..Default::default()
        });
        assert_eq!(
            url,
            "/api/v1/namespaces/ns1/configmaps?labelSelector=app%20in%20%28a%2Cb%29%2C%21x\
             &fieldSelector=metadata.name%3Dfoo&limit=500&resourceVersion=0"
        );
        let page2 = lw.list_url(&ListOptions {
            limit: Some(500),
            continue_token: Some("tok=".into()),
            ..Default::default()
        });
        assert!(page2.ends_with("&limit=500&continue=tok%3D"), "{page2}");
        assert_eq!(lw.type_description(), "v1/configmaps");
    }

    // kubeloop's own (the headers of client-go's metadata client, metadata/metadata.go): a
    // metadata-only ListWatch goes to the same URLs and asks for PartialObjectMetadata.
    #[tokio::test]
    async fn a_metadata_only_list_watch_negotiates_partial_object_metadata() {
        let full = ListWatch::<ConfigMap>::namespaced(client(), "ns1");
        let meta = ListWatch::<PartialObjectMeta<ConfigMap>>::namespaced(client(), "ns1");
        let list = ListOptions {
            limit: Some(500),
            ..Default::default()
        };
        let watch = WatchOptions {
            send_initial_events: true,
            ..Default::default()
        };
        assert_eq!(meta.list_url(&list), full.list_url(&list));
        assert_eq!(meta.watch_url(&watch), full.watch_url(&watch));
        assert_eq!(meta.type_description(), "v1/configmaps");
        assert_eq!(
            (full.list_accept(), full.watch_accept()),
            ("application/json", "application/json")
        );
        assert_eq!(
            meta.list_accept(),
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
        );
        assert_eq!(
            meta.watch_accept(),
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
        );
    }

    #[tokio::test]
    async fn watch_urls_for_typed_and_dynamic_objects() {
        let lw = ListWatch::<ConfigMap>::all(client());
        let url = lw.watch_url(&WatchOptions {
            resource_version: "42".into(),
            timeout_seconds: Some(377),
            allow_watch_bookmarks: true,
            ..Default::default()
        });
        assert_eq!(
            url,
            "/api/v1/configmaps?watch=true&resourceVersion=42&timeoutSeconds=377&allowWatchBookmarks=true"
        );
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("test.kubeloop.dev", "v1", "Widget"),
            "widgets",
        );
        let lw = ListWatch::<DynamicObject>::new(client(), &ar, Some("ns"));
        let url = lw.watch_url(&WatchOptions {
            resource_version_match: Some("NotOlderThan".into()),
            send_initial_events: true,
            allow_watch_bookmarks: true,
            ..Default::default()
        });
        assert_eq!(
            url,
            "/apis/test.kubeloop.dev/v1/namespaces/ns/widgets?watch=true\
             &resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&sendInitialEvents=true"
        );
    }

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

    async fn events_of(body: &str) -> Vec<Result<WatchEvent<ConfigMap>, ListWatchError>> {
        watch_events::<ConfigMap>(
            Body::from(body.as_bytes().to_vec()),
            "/w".into(),
            MAX_OBJECT_BYTES,
        )
        .collect()
        .await
    }

    const ADDED: &str = r#"{"type":"ADDED","object":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns","resourceVersion":"5"}}}"#;

    // After apimachinery's watch/streamwatcher.go: a decode failure is reported as an error
    // (and the reflector ends the watch on it), not skipped.
    #[tokio::test]
    async fn a_complete_line_that_is_not_an_event_is_a_decode_error() {
        let body =
            format!("{ADDED}\n\n{{\"type\":\"MODIFIED\",\"object\":\"not an object\"}}\n{ADDED}\n");
        let events = events_of(&body).await;
        assert_eq!(events.len(), 3, "{events:?}");
        assert!(
            matches!(&events[0], Ok(WatchEvent::Added(cm)) if cm.metadata.name.as_deref() == Some("a"))
        );
        assert!(
            matches!(
                &events[1],
                Err(ListWatchError::Decode { verb: "WATCH", .. })
            ),
            "{:?}",
            events[1]
        );
        // A bare Status line is the server's error, not a decode failure.
        let status = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}"#;
        let events = events_of(&format!("{status}\n")).await;
        assert!(
            matches!(&events[..], [Err(e)] if e.is_expired()),
            "{events:?}"
        );
    }

    // Lines cut across chunks anywhere (a byte at a time, then mid-line) decode as whole
    // lines: the newline search resumes where the previous chunk's search ended.
    #[tokio::test]
    async fn events_split_across_chunks_decode_as_whole_lines() {
        let body = format!("{ADDED}\n\n{ADDED}\n{ADDED}\n");
        for size in [1, 7, 64, body.len()] {
            let chunks: Vec<Result<Vec<u8>, kube_client::Error>> = body
                .as_bytes()
                .chunks(size)
                .map(|c| Ok(c.to_vec()))
                .collect();
            let events: Vec<_> = watch_events_of_chunks::<ConfigMap, _, _>(
                futures::stream::iter(chunks),
                "/w".into(),
                MAX_OBJECT_BYTES,
            )
            .collect()
            .await;
            assert_eq!(events.len(), 3, "chunks of {size}: {events:?}");
            assert!(
                events.iter().all(|e| matches!(e, Ok(WatchEvent::Added(_)))),
                "chunks of {size}: {events:?}"
            );
        }
    }

    // kubeloop's own (client-go's StreamWatcher ends the watch on it): an event whose object
    // does not decode into the type is reported as that object, and the stream goes on.
    #[tokio::test]
    async fn an_event_whose_object_does_not_decode_is_skipped_and_the_stream_goes_on() {
        let bad = r#"{"type":"MODIFIED","object":{"kind":"ConfigMap","metadata":{"name":"bad","namespace":"ns","resourceVersion":"6"},"data":{"k":7}}}"#;
        let events = events_of(&format!("{bad}\n{ADDED}\n")).await;
        let [
            Err(ListWatchError::Undecodable { object, .. }),
            Ok(WatchEvent::Added(_)),
        ] = &events[..]
        else {
            panic!("{events:?}")
        };
        assert_eq!(object.key().as_deref(), Some("ns/bad"));
        assert_eq!(object.resource_version, "6");
        assert_eq!(object.event, Some(crate::cache::WatchEventType::Modified));
        let text = ListWatchError::Undecodable {
            verb: "WATCH",
            url: "/w".into(),
            object: object.clone(),
        }
        .to_string();
        assert!(
            text.starts_with("WATCH /w: skipping object ns/bad at resourceVersion 6 does not decode: invalid type: integer `7`"),
            "{text}"
        );
    }

    // client-go's streaming decoder: a frame over maxBytes (16 MiB) is ErrObjectTooLarge and
    // the rest of the frame is drained, after which its StreamWatcher ends the watch. Here the
    // line is skipped (named from its first bytes), dropped as it streams past, and the
    // stream goes on.
    #[tokio::test]
    async fn a_line_over_the_bound_is_skipped_and_the_stream_goes_on() {
        let big = format!(
            r#"{{"type":"DELETED","object":{{"metadata":{{"name":"big","namespace":"ns","resourceVersion":"8"}},"data":{{"k":"{}"}}}}}}"#,
            "x".repeat(5000)
        );
        let body = format!("{ADDED}\n{big}\n{ADDED}\n");
        for size in [1, 100, body.len()] {
            let chunks: Vec<Result<Vec<u8>, kube_client::Error>> = body
                .as_bytes()
                .chunks(size)
                .map(|c| Ok(c.to_vec()))
                .collect();
            let events: Vec<_> = watch_events_of_chunks::<ConfigMap, _, _>(
                futures::stream::iter(chunks),
                "/w".into(),
                1000,
            )
            .collect()
            .await;
            let [
                Ok(WatchEvent::Added(_)),
                Err(ListWatchError::Undecodable { object, .. }),
                Ok(WatchEvent::Added(_)),
            ] = &events[..]
            else {
                panic!("chunks of {size}: {events:?}")
            };
            assert_eq!(object.key().as_deref(), Some("ns/big"), "chunks of {size}");
            assert_eq!(object.event, Some(crate::cache::WatchEventType::Deleted));
            assert_eq!(
                object.reason,
                crate::cache::UndecodableReason::TooLarge {
                    size: big.len(),
                    limit: 1000
                },
                "chunks of {size}"
            );
        }
    }

    #[tokio::test]
    async fn an_unterminated_last_line_is_dropped_unless_it_decodes_whole() {
        let cut = &ADDED[..40];
        let events = events_of(&format!("{ADDED}\n{cut}")).await;
        assert_eq!(events.len(), 1, "{events:?}");
        let events = events_of(ADDED).await;
        assert!(
            matches!(&events[..], [Ok(WatchEvent::Added(_))]),
            "{events:?}"
        );
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
