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
//! `request_stream` drop the headers) in [`ListWatchError::retry_after`]. The bodies are
//! decoded as they arrive by the wire their `Content-Type` names (`wire/`), as apimachinery's
//! `StreamWatcher` under client-go's rest client does: a complete line or frame that is not a
//! watch event is a decode error that ends the watch; only one cut off with the connection
//! is dropped. An event whose object does not decode into the type, and a watch event or a
//! list item over the size bound, are not errors of the stream: the object is skipped and
//! reported ([`ListWatchError::Undecodable`], [`ListPage::undecodable`]; see
//! `undecodable.rs`).
//!
//! The wire ([`Wire`]), as client-go's defaults: a built-in type asks for Kubernetes protobuf
//! (`Accept: application/vnd.kubernetes.protobuf,application/json`, as client-go's typed
//! clients since v0.32), a custom resource or a `DynamicObject` for JSON (client-go's dynamic
//! client). Metadata-only: a `ListWatch<PartialObjectMeta<K>>` (kube-client's type, whose
//! `Resource` says `metadata_api()`) asks for protobuf `PartialObjectMetadata` for any
//! resource, custom ones too, with JSON as the fallback, by the same `Accept` headers as
//! client-go's `metadata` client (`metadata/metadata.go`): the apiserver sends each object's
//! metadata only, through the same list, streaming list and watch. [`ListWatch::wire`] with
//! [`Wire::Json`] asks for JSON only.
//!
//! A shard selector ([`ListWatch::shards`], KEP-5866, `shard_selector.rs`) goes out as the
//! `shardSelector` parameter of every list and watch. An apiserver with the
//! `ShardedListAndWatch` gate filters and echoes the selector in the list's
//! `metadata.shardInfo` ([`ListPage::shard_info`]); one without it (every release before 1.36,
//! and 1.36 by default) ignores the parameter and sends everything, which is then filtered
//! here by the same hash, said once in a log line. Either way an object outside the selector
//! (a list item, or a watch event's object other than a bookmark's) is dropped here before
//! any cache sees it: with the echo present that is a cheap defence, without it the whole
//! filter.
//!
//! Below `send`, kube-client's retry layer (`Config::default_retry`, on by default) retries
//! 429, 503 and 504 answers itself, honouring `Retry-After`, as client-go's rest client
//! does; an answer reaches this module as an error only when those retries run out, or
//! every time with `default_retry` off.

use std::fmt::Write as _;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use futures::future::BoxFuture;
use futures::{AsyncBufRead, AsyncBufReadExt, FutureExt, StreamExt, TryStreamExt};
use http_body_util::BodyExt;
use kube_client::client::Body;
use kube_client::core::WatchEvent;
use kube_client::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::list_watch_error::{ListWatchError, SentWatchStream, WatchStream};
use super::resourceversion::compare_resource_version;
use super::shard_scope::{Selection, ShardScope};
use super::shard_selector::ShardSelector;
use super::store::TransformFunc;
use super::stored::SentBytes;
use super::undecodable::{MAX_OBJECT_BYTES, UndecodableObject};
use super::wire::{Encoding, ListBody, ListDecodeError, ProtobufType, Wire, watch_events};

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
    /// `metadata.shardInfo.selector`: the shard selector the apiserver filtered this page by
    /// (KEP-5866), `None` when it did not filter (no selector asked for, or a server without
    /// the `ShardedListAndWatch` gate).
    pub shard_info: Option<String>,
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

    /// [`watch`](Self::watch), where the initial events of a streaming list may come with
    /// the bytes the apiserver sent for their objects ([`SentBytes`](super::SentBytes)): a compact store keeps
    /// those instead of encoding each decoded object again. [`ListWatch`] hands them out for
    /// a protobuf stream; this default hands out none.
    fn watch_keeping_sent(
        &self,
        options: &WatchOptions,
    ) -> impl Future<Output = Result<SentWatchStream<K>, ListWatchError>> + Send
    where
        K: Send + 'static,
    {
        let watch = self.watch(options);
        async move { Ok(watch.await?.map_ok(|event| (event, None)).boxed()) }
    }

    /// A short description of the type for logs and metrics, e.g. `v1/configmaps`.
    fn type_description(&self) -> String;

    /// Whether the objects handed out have their managedFields' `fieldsV1` maps allocated at
    /// their length already, so a typed store need not rebuild them (`shrink_metadata` in
    /// cache/store.rs): [`ListWatch`] says so when it asks for protobuf, whose decoder builds
    /// raw JSON so (a server that answers JSON instead leaves those maps with spare room: more
    /// memory, the same objects). The default, false, has them rebuilt.
    fn fields_at_length(&self) -> bool {
        false
    }

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

    /// [`list`](Self::list), with the bytes the apiserver sent for each item, in item order
    /// ([`SentBytes`](super::SentBytes)): a compact store keeps those instead of encoding
    /// each decoded object again. [`ListWatch`] hands them out for a protobuf list; this
    /// default hands out none (an empty `Vec`). Either every item of the page has its bytes
    /// or none has.
    fn list_keeping_sent(
        &self,
        options: &ListOptions,
    ) -> impl Future<Output = Result<(ListPage<K>, Vec<SentBytes>), ListWatchError>> + Send
    where
        K: Send + 'static,
    {
        let page = self.list(options);
        async move { Ok((page.await?, Vec::new())) }
    }

    /// Whether `watch` understands `sendInitialEvents` (client-go
    /// `IsWatchListSemanticsUnSupported`, inverted): a reflector streams its list only then.
    /// True for the real apiserver; fakes that only replay events say false.
    fn supports_watch_list(&self) -> bool {
        true
    }

    /// Whether what this lister-watcher selects changed since its last list (its
    /// [`ShardScope`](super::ShardScope) moved on): the reflector then lists again at once
    /// instead of watching. client-go has no counterpart (its selectors never change).
    fn selection_changed(&self) -> bool {
        false
    }

    /// kubeloop: called before a relist the reflector makes with a synced store. `Some` when
    /// the selection changed since the list the store holds (a [`ShardScope`](super::ShardScope)
    /// took or gave up shards) and the store can follow without listing all of it again:
    /// - if shards were taken, the next LIST asks for them alone (the reflector adds what
    ///   comes back instead of replacing its store), and the watch after it, opened at the
    ///   store's version, drops their events that list already holds;
    /// - the objects of the shards given up leave the store
    ///   ([`ReflectorStore::release`](super::ReflectorStore::release)).
    ///
    /// `None` (the default): the next list is of the whole selection.
    fn prepare_selection_change(&self) -> Option<SelectionChange> {
        None
    }
}

/// How a store follows its selection's change without a whole relist (see
/// [`ListerWatcher::prepare_selection_change`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectionChange {
    /// The next LIST asks for the shards taken alone (`false`: none taken, no list).
    pub gained: bool,
    /// The shards given up, whose objects leave the store (`None`: none).
    pub released: Option<ShardSelector>,
}

/// The real [`ListerWatcher`]: requests through a kube-client [`Client`].
pub struct ListWatch<K: Resource> {
    client: Client,
    /// `/api/v1/namespaces/ns/configmaps` or `/apis/group/version/plural`.
    path: String,
    description: String,
    label_selector: Option<String>,
    field_selector: Option<String>,
    /// `shardSelector`, and the filter applied here to what comes back.
    shard: Option<ShardSource>,
    /// The bound on one watch line or list item.
    max_object_bytes: usize,
    /// What a protobuf list or watch of `K` is made of; `None` asks for JSON only.
    protobuf: Option<ProtobufType>,
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
            shard: self.shard.clone(),
            max_object_bytes: self.max_object_bytes,
            protobuf: self.protobuf.clone(),
            _marker: std::marker::PhantomData,
        }
    }
}

impl<K: Resource<DynamicType: 'static>> ListWatch<K> {
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
            shard: None,
            max_object_bytes: MAX_OBJECT_BYTES,
            protobuf: ProtobufType::of::<K>(dyntype),
            _marker: std::marker::PhantomData,
        }
    }

    /// Which wire to ask for: [`Wire::Auto`] (the default: protobuf for built-in types and
    /// metadata-only, JSON for the rest), or [`Wire::Json`] only.
    pub fn wire(mut self, wire: Wire) -> Self {
        if wire == Wire::Json {
            self.protobuf = None;
        }
        self
    }

    /// Whether requests ask for protobuf (the response's `Content-Type` still decides how
    /// each body is read).
    pub fn asks_for_protobuf(&self) -> bool {
        self.protobuf.is_some()
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

    /// Restricts to the objects `selector` selects (`shardSelector`, KEP-5866): filtered by
    /// the apiserver when it has the `ShardedListAndWatch` gate, and here in any case (see the
    /// module's doc).
    pub fn shards(mut self, selector: ShardSelector) -> Self {
        self.shard = Some(ShardSource::Fixed(ShardFilter::new(selector)));
        self
    }

    /// Restricts to the shards `scope` holds at each list, which change while the informer
    /// runs (`shard_scope.rs`): each change ends the watch and lists again with the new
    /// selector (or only what changed: see [`ListerWatcher::prepare_selection_change`]).
    /// Replaces [`shards`](Self::shards). A scoped
    /// list-watch does not stream its lists (paged LISTs only): a scope holding nothing lists
    /// nothing, without a request.
    pub fn shard_scope(mut self, scope: ShardScope) -> Self {
        self.shard = Some(ShardSource::Scoped(ScopedShards {
            listed: scope.register(),
            scope,
            listing: Arc::default(),
            stored: Arc::default(),
            said_unfiltered: Arc::default(),
        }));
        self
    }

    /// The shard selector of the next list and watch, if any (for a scope holding nothing,
    /// `None`, and nothing is listed).
    pub fn shard_selector(&self) -> Option<ShardSelector> {
        match &self.shard {
            None => None,
            Some(ShardSource::Fixed(f)) => Some(f.selector.clone()),
            Some(ShardSource::Scoped(s)) => s.scope.selector(),
        }
    }

    /// What a list's request asks for: for a first page, the scope as it is now (or the
    /// shards [`prepare_selection_change`](ListerWatcher::prepare_selection_change) made the
    /// next list ask for); for a later page, what its first page asked for (a continue token
    /// holds the first page's selector).
    ///
    /// For the first page of a list of gained shards, also where to record the version it
    /// answered at.
    fn shard_now(&self, continuing: bool) -> (ShardNow, Option<GainedAnswer>) {
        match &self.shard {
            None => (ShardNow::Everything, None),
            Some(ShardSource::Fixed(f)) => (ShardNow::Filter(f.clone()), None),
            Some(ShardSource::Scoped(s)) => {
                let mut listing = s.listing.lock();
                let mut answer = None;
                let keep = listing.as_mut().is_some_and(|l| {
                    if continuing {
                        return true;
                    }
                    if !matches!(l.part, Part::GainedNext) {
                        return false;
                    }
                    l.part = Part::Gained(None);
                    answer = Some(GainedAnswer {
                        listing: s.listing.clone(),
                        generation: l.selection.generation,
                    });
                    true
                });
                if !keep {
                    let selection = s.scope.snapshot();
                    *listing = Some(Listing {
                        asked: selection.selector.clone(),
                        selection,
                        part: Part::Whole,
                    });
                }
                let asked = listing.as_ref().and_then(|l| l.asked.clone());
                drop(listing);
                (s.ask(asked), answer)
            }
        }
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

    /// The `Accept` header of a LIST: protobuf with JSON as the fallback, or JSON only
    /// ([`Wire`]); for a metadata-only type (`PartialObjectMeta<K>`) the same asking for
    /// `PartialObjectMetadataList` ([`METADATA_LIST_ACCEPT`] in JSON).
    pub fn list_accept(&self) -> &'static str {
        self.accept([METADATA_LIST_ACCEPT, METADATA_PROTOBUF_LIST_ACCEPT])
    }

    /// The `Accept` header of a WATCH: as [`list_accept`](Self::list_accept), asking for one
    /// `PartialObjectMetadata` per event for a metadata-only type.
    pub fn watch_accept(&self) -> &'static str {
        self.accept([METADATA_WATCH_ACCEPT, METADATA_PROTOBUF_WATCH_ACCEPT])
    }

    /// By the wire asked for: JSON or protobuf; for a metadata-only type, `metadata`'s JSON or
    /// protobuf header.
    fn accept(&self, [metadata_json, metadata_protobuf]: [&'static str; 2]) -> &'static str {
        match (K::metadata_api(), self.protobuf.is_some()) {
            (false, false) => "application/json",
            (false, true) => PROTOBUF_ACCEPT,
            (true, false) => metadata_json,
            (true, true) => metadata_protobuf,
        }
    }

    fn selector_params(&self, q: &mut Query, shard: Option<&ShardFilter>) {
        if let Some(l) = &self.label_selector {
            q.push("labelSelector", l);
        }
        if let Some(f) = &self.field_selector {
            q.push("fieldSelector", f);
        }
        if let Some(s) = shard {
            q.push("shardSelector", &s.query);
        }
    }

    /// The shard filter a URL built now carries (a scope's as it is now).
    fn shard_for_url(&self) -> Option<ShardFilter> {
        match &self.shard {
            None => None,
            Some(ShardSource::Fixed(f)) => Some(f.clone()),
            Some(ShardSource::Scoped(s)) => s.scope.selector().map(ShardFilter::new),
        }
    }

    /// The LIST URL for `options`.
    pub fn list_url(&self, options: &ListOptions) -> String {
        self.list_url_with(options, self.shard_for_url().as_ref())
    }

    fn list_url_with(&self, options: &ListOptions, shard: Option<&ShardFilter>) -> String {
        let mut q = Query::default();
        self.selector_params(&mut q, shard);
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
        self.watch_url_with(options, self.shard_for_url().as_ref())
    }

    fn watch_url_with(&self, options: &WatchOptions, shard: Option<&ShardFilter>) -> String {
        let mut q = Query::default();
        q.push("watch", "true");
        self.selector_params(&mut q, shard);
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
    ListWatchError::Decode {
        verb: "LIST",
        url: url.to_string(),
        source: e.into(),
    }
}

fn classify(verb: &'static str, url: &str, err: kube_client::Error) -> ListWatchError {
    match err {
        kube_client::Error::Api(status) => ListWatchError::from_status(verb, url, &status),
        e @ kube_client::Error::SerdeError(_) => ListWatchError::Decode {
            verb,
            url: url.to_string(),
            source: e.into(),
        },
        e => ListWatchError::Transport {
            verb,
            url: url.to_string(),
            source: e,
        },
    }
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

/// `Accept` of a built-in type's LIST or WATCH: protobuf, or JSON from a server that does not
/// speak it (client-go's `rest.Config` for protobuf: its `AcceptContentTypes`).
const PROTOBUF_ACCEPT: &str = "application/vnd.kubernetes.protobuf,application/json";
/// `Accept` of a metadata-only LIST, as client-go's metadata client asks: protobuf
/// `PartialObjectMetadataList`, then the same in JSON, then plain JSON.
const METADATA_PROTOBUF_LIST_ACCEPT: &str = "application/vnd.kubernetes.protobuf;\
     as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,\
     application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
/// `Accept` of a metadata-only WATCH, as client-go's metadata client asks.
const METADATA_PROTOBUF_WATCH_ACCEPT: &str = "application/vnd.kubernetes.protobuf;\
     as=PartialObjectMetadata;g=meta.k8s.io;v=v1,\
     application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json";

/// `Accept` of a metadata-only LIST in JSON only ([`Wire::Json`]): `PartialObjectMetadataList`,
/// or plain JSON from a server
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
        let list = self.list_with(options, transform, false);
        async move { Ok(list.await?.0) }
    }

    fn list_keeping_sent(
        &self,
        options: &ListOptions,
    ) -> impl Future<Output = Result<(ListPage<K>, Vec<SentBytes>), ListWatchError>> + Send {
        self.list_with(options, None, true)
    }

    fn watch(
        &self,
        options: &WatchOptions,
    ) -> impl Future<Output = Result<WatchStream<K>, ListWatchError>> + Send {
        let watch = self.open_watch(options, false);
        async move { Ok(watch.await?.map_ok(|(event, _)| event).boxed()) }
    }

    fn watch_keeping_sent(
        &self,
        options: &WatchOptions,
    ) -> impl Future<Output = Result<SentWatchStream<K>, ListWatchError>> + Send {
        self.open_watch(options, true)
    }

    fn type_description(&self) -> String {
        self.description.clone()
    }

    fn fields_at_length(&self) -> bool {
        self.asks_for_protobuf()
    }

    /// Not on a [`ShardScope`]: a streaming list cannot be cut short by a change of the
    /// scope and listed again the way a paged one is.
    fn supports_watch_list(&self) -> bool {
        !matches!(self.shard, Some(ShardSource::Scoped(_)))
    }

    fn selection_changed(&self) -> bool {
        matches!(&self.shard, Some(ShardSource::Scoped(s)) if s.changed())
    }

    fn prepare_selection_change(&self) -> Option<SelectionChange> {
        match &self.shard {
            Some(ShardSource::Scoped(s)) => s.prepare_selection_change(),
            _ => None,
        }
    }
}

impl<K: CacheObject> ListWatch<K> {
    /// One LIST page, each item transformed as it is decoded; with `keep_sent`, a protobuf
    /// page comes with the bytes each item was sent as.
    fn list_with(
        &self,
        options: &ListOptions,
        transform: Option<TransformFunc<K>>,
        keep_sent: bool,
    ) -> impl Future<Output = Result<(ListPage<K>, Vec<SentBytes>), ListWatchError>> + Send + 'static
    {
        let (shard, gained) = self.shard_now(options.continue_token.is_some());
        let url = self.list_url_with(options, shard.filter());
        let client = self.client.clone();
        let max_object_bytes = self.max_object_bytes;
        let accept = self.list_accept();
        let protobuf = self.protobuf.clone();
        async move {
            if let ShardNow::Nothing = shard {
                let nothing = ListPage {
                    items: Vec::new(),
                    resource_version: String::new(),
                    continue_token: None,
                    undecodable: Vec::new(),
                    shard_info: None,
                };
                return Ok((nothing, Vec::new()));
            }
            // The body is decoded item by item as it arrives (wire/): a LIST the watch cache
            // answers whole is never held whole.
            let res = send(&client, "LIST", &url, get_request(&url, accept)).await?;
            let encoding = Encoding::of(res.headers().get(http::header::CONTENT_TYPE));
            let mut decoder = ListBody::<K>::new(
                encoding,
                protobuf.as_ref(),
                transform,
                max_object_bytes,
                keep_sent,
            )
            .map_err(|e| list_decode_error(&url, e))?;
            let reader = res
                .into_body()
                .into_data_stream()
                .map_err(std::io::Error::other)
                .into_async_read();
            let mut reader = std::pin::pin!(reader);
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
            let mut list = decoder.finish().map_err(|e| list_decode_error(&url, e))?;
            let shard_info = shard_echo(&mut list.metadata);
            if let (Some(gained), Some(rv)) = (gained, &list.metadata.resource_version) {
                gained.answered_at(rv);
            }
            if let Some(shard) = shard.filter() {
                shard.check_echo(shard_info.as_deref(), &url);
                shard.retain(&mut list.items, &mut list.sent);
            }
            let page = ListPage {
                items: list.items,
                resource_version: list.metadata.resource_version.unwrap_or_default(),
                continue_token: list.metadata.continue_.filter(|c| !c.is_empty()),
                undecodable: list.undecodable,
                shard_info,
            };
            Ok((page, list.sent))
        }
    }
    /// Opens a WATCH; with `keep_sent`, a protobuf stream's initial events come with the
    /// bytes their objects were sent as.
    fn open_watch(
        &self,
        options: &WatchOptions,
        keep_sent: bool,
    ) -> impl Future<Output = Result<SentWatchStream<K>, ListWatchError>> + Send + 'static {
        let scoped = match &self.shard {
            Some(ShardSource::Scoped(s)) => s.watch_now(),
            _ => None,
        };
        let shard = match &scoped {
            Some(watch) => watch.shard.clone(),
            None => self.shard_now(false).0,
        };
        let stale = scoped.as_ref().and_then(|w| w.stale.clone());
        let url = self.watch_url_with(options, shard.filter());
        let client = self.client.clone();
        let max_object_bytes = self.max_object_bytes;
        let accept = self.watch_accept();
        async move {
            let ended = match scoped {
                None => None,
                Some(ScopedWatch { changed: None, .. }) => {
                    // The list the store holds is of another selection: end at once, and
                    // the reflector lists again.
                    return Ok(futures::stream::empty().boxed());
                }
                Some(ScopedWatch {
                    changed: Some(changed),
                    ..
                }) => Some(changed),
            };
            if let (ShardNow::Nothing, Some(ended)) = (&shard, ended.clone()) {
                // Nothing held: nothing to watch until the scope changes.
                return Ok(futures::stream::once(ended)
                    .filter_map(|()| futures::future::ready(None))
                    .boxed());
            }
            let mut req = get_request(&url, accept);
            // As kube-client's request_events: watch streams are not compressed (a gzip
            // member per event is more than its decompression layer reads).
            req.headers_mut().insert(
                http::header::ACCEPT_ENCODING,
                http::HeaderValue::from_static("identity"),
            );
            let res = send(&client, "WATCH", &url, req).await?;
            let encoding = Encoding::of(res.headers().get(http::header::CONTENT_TYPE));
            let events = watch_events(encoding, res.into_body(), url, max_object_bytes, keep_sent);
            let events = match shard.filter().cloned() {
                None => events,
                Some(shard) => events
                    .try_filter(move |(event, _)| futures::future::ready(shard.keeps(event)))
                    .boxed(),
            };
            let events = match stale {
                None => events,
                Some(stale) => events
                    .try_filter(move |(event, _)| futures::future::ready(!stale.covers(event)))
                    .boxed(),
            };
            Ok(match ended {
                None => events,
                Some(ended) => events.take_until(ended).boxed(),
            })
        }
    }
}

/// Where a [`ListWatch`]'s shard selector comes from.
#[derive(Clone)]
enum ShardSource {
    /// [`ListWatch::shards`]: one selector for the list-watch's life.
    Fixed(ShardFilter),
    /// [`ListWatch::shard_scope`]: the scope's at each list.
    Scoped(ScopedShards),
}

/// A [`ShardScope`] as one list-watch (and its clones) follows it.
#[derive(Clone)]
struct ScopedShards {
    scope: ShardScope,
    /// The list under way or last made (`None`: none yet).
    listing: Arc<parking_lot::Mutex<Option<Listing>>>,
    /// The selection of the list the store is known to hold: that of the last list a watch
    /// followed (a reflector watches only after its list went to its store).
    stored: Arc<parking_lot::Mutex<Option<Selection>>>,
    /// The scope's record of the generation this list-watch last listed at.
    listed: Arc<AtomicU64>,
    said_unfiltered: Arc<AtomicBool>,
}

/// A watch opened on a scope.
struct ScopedWatch {
    shard: ShardNow,
    /// After a list of gained shards: their events the list already holds.
    stale: Option<StaleEvents>,
    /// Resolves when the scope moves on; `None` when the store's list is of another
    /// generation than the scope's now (the watch must not open).
    changed: Option<futures::future::Shared<BoxFuture<'static, ()>>>,
}

/// A list on a scope.
struct Listing {
    /// The scope when the list began: what the store holds once the list is in it.
    selection: Selection,
    /// What its requests ask for: the selection's selector, or for a list of the gained
    /// shards alone, theirs (`None`: nothing, and no request is made).
    asked: Option<ShardSelector>,
    part: Part,
}

/// What part of its selection a [`Listing`] lists.
enum Part {
    /// All of it; or nothing, after a change that took no shard (`prepare_selection_change`):
    /// the store holds the shards kept and the watch follows from its version.
    Whole,
    /// The gained shards alone (`prepare_selection_change`); the list has not begun.
    GainedNext,
    /// The gained shards alone; the version the apiserver answered at, once it answered.
    Gained(Option<String>),
}

/// Where the first page of a list of gained shards records the version it answered at.
struct GainedAnswer {
    listing: Arc<parking_lot::Mutex<Option<Listing>>>,
    generation: u64,
}

impl GainedAnswer {
    fn answered_at(self, resource_version: &str) {
        if let Some(l) = self.listing.lock().as_mut()
            && l.selection.generation == self.generation
            && matches!(l.part, Part::Gained(None))
        {
            l.part = Part::Gained(Some(resource_version.to_string()));
        }
    }
}

/// The events of a watch after a list of gained shards that the list already holds: that
/// list was answered at a version at or after the store's (it asks for no older, so the
/// watch cache serves it), and the watch starts at the store's version, so it replays the
/// gained shards' changes up to the list's version, which are older than what the list
/// handed the store. They are dropped: an object of those shards at or before that version.
#[derive(Clone)]
struct StaleEvents {
    gained: ShardSelector,
    listed_at: String,
}

impl StaleEvents {
    fn covers<K: Resource>(&self, event: &WatchEvent<K>) -> bool {
        let (WatchEvent::Added(object)
        | WatchEvent::Modified(object)
        | WatchEvent::Deleted(object)) = event
        else {
            return false;
        };
        let meta = object.meta();
        self.gained.matches(meta)
            && meta.resource_version.as_deref().is_some_and(|rv| {
                compare_resource_version(rv, &self.listed_at).is_ok_and(|o| o.is_le())
            })
    }
}

impl ScopedShards {
    /// Whether the scope moved on since the last list.
    fn changed(&self) -> bool {
        self.listing
            .lock()
            .as_ref()
            .is_some_and(|l| l.selection.generation != self.scope.generation())
    }

    /// A request for `asked`'s objects (`None`: none).
    fn ask(&self, asked: Option<ShardSelector>) -> ShardNow {
        match asked {
            Some(selector) => ShardNow::Filter(ShardFilter {
                query: selector.to_query(),
                selector,
                said_unfiltered: self.said_unfiltered.clone(),
            }),
            None => ShardNow::Nothing,
        }
    }

    /// See [`ListerWatcher::prepare_selection_change`]. Only when the store is known to hold
    /// the last list made (a list made since, which failed or whose watch never opened, may
    /// or may not be in the store: then everything is listed again).
    fn prepare_selection_change(&self) -> Option<SelectionChange> {
        let mut listing = self.listing.lock();
        let stored = self.stored.lock();
        let (Some(last), Some(stored)) = (listing.as_ref(), stored.as_ref()) else {
            return None;
        };
        let now = self.scope.snapshot();
        if last.selection.generation != stored.generation || now.generation == stored.generation {
            return None;
        }
        let gained = self.scope.selector_of(now.held.difference(&stored.held));
        let change = SelectionChange {
            gained: gained.is_some(),
            released: self.scope.selector_of(stored.held.difference(&now.held)),
        };
        *listing = Some(Listing {
            part: if change.gained {
                Part::GainedNext
            } else {
                Part::Whole
            },
            asked: gained,
            selection: now,
        });
        Some(change)
    }

    /// The watch that follows the last list: of its selection if the scope is still there
    /// (which marks the list as in the store: a reflector watches only after its list went to
    /// its store), else one that must not open.
    fn watch_now(&self) -> Option<ScopedWatch> {
        let (selection, stale) = {
            let listing = self.listing.lock();
            let l = listing.as_ref()?;
            let stale = match (&l.part, &l.asked) {
                (Part::Gained(Some(rv)), Some(gained)) => Some(StaleEvents {
                    gained: gained.clone(),
                    listed_at: rv.clone(),
                }),
                _ => None,
            };
            (l.selection.clone(), stale)
        };
        if selection.generation != self.scope.generation() {
            return Some(ScopedWatch {
                shard: ShardNow::Nothing,
                stale: None,
                changed: None,
            });
        }
        self.scope.mark_listed(&self.listed, selection.generation);
        let changed: BoxFuture<'static, ()> =
            Box::pin(self.scope.changed_since(selection.generation));
        let shard = self.ask(selection.selector.clone());
        *self.stored.lock() = Some(selection);
        Some(ScopedWatch {
            shard,
            stale,
            changed: Some(changed.shared()),
        })
    }
}

/// What one request asks for.
#[derive(Clone)]
enum ShardNow {
    /// No shard selector.
    Everything,
    /// The objects this selector selects.
    Filter(ShardFilter),
    /// A scope holding no shard: nothing (no request is made).
    Nothing,
}

impl ShardNow {
    fn filter(&self) -> Option<&ShardFilter> {
        match self {
            ShardNow::Filter(f) => Some(f),
            _ => None,
        }
    }
}

/// A [`ShardSelector`] as a [`ListWatch`] applies it: the rendered parameter, the filter of
/// what comes back, and whether the log line about a server that did not filter was written
/// (once per `ListWatch` and its clones, not once per relist).
#[derive(Clone)]
struct ShardFilter {
    selector: ShardSelector,
    /// `selector` rendered, as sent and as a filtering server echoes it.
    query: String,
    said_unfiltered: Arc<AtomicBool>,
}

impl ShardFilter {
    fn new(selector: ShardSelector) -> Self {
        Self {
            query: selector.to_query(),
            selector,
            said_unfiltered: Arc::new(AtomicBool::new(false)),
        }
    }

    fn selects<K: Resource>(&self, object: &K) -> bool {
        self.selector.matches(object.meta())
    }

    /// Says once when a list came back without the echo, or with another selector's, so it
    /// is known that the filter here is doing the work.
    fn check_echo(&self, echo: Option<&str>, url: &str) {
        if echo == Some(self.query.as_str()) || self.said_unfiltered.swap(true, Ordering::Relaxed) {
            return;
        }
        match echo {
            None => tracing::info!(
                %url,
                selector = %self.query,
                "the apiserver did not filter by shardSelector (no metadata.shardInfo: the \
                 ShardedListAndWatch feature gate is off, or the server predates 1.36); \
                 objects outside the shard are dropped here instead"
            ),
            Some(echo) => tracing::warn!(
                %url,
                selector = %self.query,
                %echo,
                "the apiserver echoed another shard selector than the one sent; objects \
                 outside the one sent are dropped here"
            ),
        }
    }

    /// Keeps the items the selector selects, and the bytes sent for them (`sent` is either
    /// empty or one entry per item, in item order).
    fn retain<K: Resource>(&self, items: &mut Vec<K>, sent: &mut Vec<SentBytes>) {
        if sent.is_empty() {
            items.retain(|item| self.selects(item));
            return;
        }
        let kept: Vec<bool> = items.iter().map(|item| self.selects(item)).collect();
        let mut flags = kept.iter().copied();
        items.retain(|_| flags.next().unwrap_or(true));
        let mut flags = kept.iter().copied();
        sent.retain(|_| flags.next().unwrap_or(true));
    }

    /// Whether a watch event goes on: a bookmark or an error always; an object's event only
    /// when the selector selects the object (the field hashed, namespace or uid, never
    /// changes, so an object never moves in or out of a shard by an update).
    fn keeps<K: Resource>(&self, event: &WatchEvent<K>) -> bool {
        match event {
            WatchEvent::Added(object)
            | WatchEvent::Modified(object)
            | WatchEvent::Deleted(object) => self.selects(object),
            WatchEvent::Bookmark(_) | WatchEvent::Error(_) => true,
        }
    }
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

k8s_openapi::k8s_if_ge_1_36! {
    /// The selector a list echoes in `metadata.shardInfo` (a server that filtered it by one).
    fn shard_echo(meta: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta) -> Option<String> {
        meta.shard_info.take().map(|info| info.selector)
    }
}

k8s_openapi::k8s_if_le_1_35! {
    /// k8s-openapi before v1_36 has no `ListMeta.shardInfo` (its field is dropped in decoding):
    /// the list reads as unfiltered, and the selector is applied here.
    fn shard_echo(_: &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta) -> Option<String> {
        None
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
            (PROTOBUF_ACCEPT, PROTOBUF_ACCEPT)
        );
        assert_eq!(
            meta.list_accept(),
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,\
             application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
        );
        assert_eq!(
            meta.watch_accept(),
            "application/vnd.kubernetes.protobuf;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,\
             application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json"
        );
        // JSON only, by choice.
        let (full, meta) = (full.wire(Wire::Json), meta.wire(Wire::Json));
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

    // client-go: a typed client prefers protobuf; the dynamic client and a custom resource's
    // client speak JSON; the metadata client asks for protobuf for every resource.
    #[tokio::test]
    async fn built_in_types_ask_for_protobuf_and_the_rest_for_json() {
        use k8s_openapi::api::apps::v1::Deployment;
        assert!(ListWatch::<ConfigMap>::all(client()).asks_for_protobuf());
        assert!(ListWatch::<Deployment>::all(client()).asks_for_protobuf());
        let widget = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("test.kubeloop.dev", "v1", "Widget"),
            "widgets",
        );
        assert!(!ListWatch::<DynamicObject>::new(client(), &widget, None).asks_for_protobuf());
        let config_maps = ApiResource::erase::<ConfigMap>(&());
        assert!(!ListWatch::<DynamicObject>::new(client(), &config_maps, None).asks_for_protobuf());
        assert!(
            ListWatch::<PartialObjectMeta<DynamicObject>>::new(client(), &widget, None)
                .asks_for_protobuf()
        );
        let json = ListWatch::<ConfigMap>::all(client()).wire(Wire::Json);
        assert!(!json.asks_for_protobuf());
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

    fn in_namespace(namespace: &str) -> ConfigMap {
        ConfigMap {
            metadata: kube_client::core::ObjectMeta {
                namespace: Some(namespace.into()),
                name: Some(format!("cm-{namespace}")),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    // kubeloop's own (KEP-5866): the selector goes out on both verbs, rendered as the
    // apiserver renders it.
    #[tokio::test]
    async fn a_shard_selector_goes_out_on_every_list_and_watch() {
        use crate::cache::{HashRange, ShardSelector};
        let shard = ShardSelector::namespaces([HashRange::ring(4, 0).unwrap()]).unwrap();
        let lw = ListWatch::<ConfigMap>::all(client()).shards(shard.clone());
        assert_eq!(lw.shard_selector(), Some(shard.clone()));
        let selector = "shardSelector=shardRange%28object.metadata.namespace%2C%20\
                        %270x0000000000000000%27%2C%20%270x4000000000000000%27%29";
        assert_eq!(
            lw.list_url(&ListOptions::default()),
            format!("/api/v1/configmaps?{selector}")
        );
        assert_eq!(
            lw.watch_url(&WatchOptions {
                resource_version: "5".into(),
                ..Default::default()
            }),
            format!("/api/v1/configmaps?watch=true&{selector}&resourceVersion=5")
        );
    }

    // kubeloop's own: a list-watch on a shard scope that holds nothing sends nothing (this
    // client's server does not exist: any request would fail), watches until the scope
    // changes, and then wants a list of the new selection, which it asks the server for.
    #[tokio::test]
    async fn a_shard_scope_holding_nothing_lists_nothing_and_a_change_ends_the_watch() {
        use crate::cache::ShardScope;
        let scope = ShardScope::namespaces(4).unwrap();
        let lw = ListWatch::<ConfigMap>::all(client()).shard_scope(scope.clone());
        assert!(!lw.supports_watch_list());
        let page = lw
            .list(&ListOptions::default())
            .await
            .expect("no request is made");
        assert!(page.items.is_empty() && page.shard_info.is_none());
        assert!(!lw.selection_changed());
        let mut watch = lw
            .watch(&WatchOptions::default())
            .await
            .expect("no request is made");
        let next = tokio::spawn(async move { watch.next().await.is_none() });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !next.is_finished(),
            "the watch waits while the scope holds nothing"
        );
        let generation = scope.hold(1);
        assert!(
            tokio::time::timeout(std::time::Duration::from_secs(5), next)
                .await
                .expect("a change of the scope ends the watch")
                .unwrap(),
            "it ends without an event"
        );
        assert!(lw.selection_changed());
        let opened = lw
            .watch(&WatchOptions::default())
            .await
            .expect("no request is made");
        assert_eq!(
            opened.collect::<Vec<_>>().await.len(),
            0,
            "no watch of a stale list"
        );
        let listing = lw.list(&ListOptions::default()).await;
        assert!(
            listing.is_err(),
            "the new selection is asked for: {listing:?}"
        );
        assert!(
            lw.list_url(&ListOptions::default())
                .contains("0x4000000000000000%27%2C%20%270x8000000000000000"),
            "{}",
            lw.list_url(&ListOptions::default())
        );
        assert!(!lw.selection_changed());
        let _ = generation;
    }

    // kubeloop's own: once the store holds a list of shard 1 (the watch after it opened),
    // taking shard 2 as well makes the next list ask for shard 2 alone, its continue pages
    // too; the watch after it asks for both. Giving shard 2 up again lists nothing: the
    // store releases shard 2 and the watch asks for shard 1. A change made before the store
    // is known to hold its list lists the whole selection.
    // This client's server does not exist: each request fails naming its URL.
    #[tokio::test]
    async fn a_changed_scope_lists_only_the_shards_taken_and_releases_those_given_up() {
        use crate::cache::ShardScope;
        const SHARD_1: &str = "0x4000000000000000%27%2C%20%270x8000000000000000";
        const SHARD_2: &str = "0x8000000000000000%27%2C%20%270xc000000000000000";
        const SHARDS_1_2: &str = "0x4000000000000000%27%2C%20%270xc000000000000000";
        let scope = ShardScope::namespaces(4).unwrap();
        scope.hold(1);
        let lw = ListWatch::<ConfigMap>::all(client()).shard_scope(scope.clone());
        let first = ListOptions::default();
        let next = ListOptions {
            continue_token: Some("c".into()),
            ..Default::default()
        };
        // The request's error, which names its URL.
        fn asked<T>(result: Result<T, ListWatchError>) -> String {
            match result {
                Ok(_) => panic!("no server"),
                Err(e) => e.to_string(),
            }
        }
        let shard_2 = scope.selector_of(&[2]);
        assert_eq!(lw.prepare_selection_change(), None, "nothing listed yet");
        assert!(asked(lw.list(&first).await).contains(SHARD_1));
        scope.hold(2);
        assert_eq!(
            lw.prepare_selection_change(),
            None,
            "the store may not hold the list: no watch followed it"
        );
        assert!(asked(lw.list(&first).await).contains(SHARDS_1_2));
        assert!(asked(lw.watch(&WatchOptions::default()).await).contains(SHARDS_1_2));

        scope.release(2);
        assert!(lw.selection_changed());
        assert_eq!(
            lw.prepare_selection_change(),
            Some(SelectionChange {
                gained: false,
                released: shard_2.clone(),
            })
        );
        assert!(!lw.selection_changed());
        let watch = asked(lw.watch(&WatchOptions::default()).await);
        assert!(
            watch.contains(SHARD_1) && !watch.contains(SHARD_2),
            "{watch}"
        );

        scope.hold(2);
        assert!(lw.selection_changed());
        assert_eq!(
            lw.prepare_selection_change(),
            Some(SelectionChange {
                gained: true,
                released: None,
            })
        );
        let gained = asked(lw.list(&first).await);
        assert!(
            gained.contains(SHARD_2) && !gained.contains(SHARD_1),
            "{gained}"
        );
        let gained = asked(lw.list(&next).await);
        assert!(
            gained.contains(SHARD_2) && !gained.contains(SHARD_1),
            "{gained}"
        );
        assert!(!lw.selection_changed());
        assert!(asked(lw.watch(&WatchOptions::default()).await).contains(SHARDS_1_2));
        assert!(
            asked(lw.list(&first).await).contains(SHARDS_1_2),
            "only the list after the preparation asks for the gained shards"
        );
    }

    // kubeloop's own: after a list of gained shards answered at "20", the watch from the
    // store's older version drops the gained shards' events up to "20" (the list holds them)
    // and keeps their later ones, every event of the shards kept, and bookmarks.
    #[test]
    fn after_a_list_of_gained_shards_the_watch_drops_what_the_list_holds() {
        use crate::cache::{HashRange, ShardSelector, fnv1a_64};
        let a = fnv1a_64(b"a");
        let stale = StaleEvents {
            gained: ShardSelector::namespaces([HashRange::new(a, u128::from(a) + 1).unwrap()])
                .unwrap(),
            listed_at: "20".into(),
        };
        let at = |namespace: &str, rv: &str| {
            let mut cm = in_namespace(namespace);
            cm.metadata.resource_version = Some(rv.into());
            cm
        };
        assert!(stale.covers(&WatchEvent::Added(at("a", "15"))));
        assert!(stale.covers(&WatchEvent::Modified(at("a", "20"))));
        assert!(stale.covers(&WatchEvent::Deleted(at("a", "9"))));
        assert!(!stale.covers(&WatchEvent::Modified(at("a", "21"))));
        assert!(!stale.covers(&WatchEvent::Deleted(at("a", "100"))));
        assert!(
            !stale.covers(&WatchEvent::Modified(at("b", "15"))),
            "a kept shard"
        );
        let bookmark: WatchEvent<ConfigMap> = serde_json::from_str(
            r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#,
        )
        .unwrap();
        assert!(!stale.covers(&bookmark));
    }

    // kubeloop's own: what comes back outside the shard is dropped, the bytes sent for a
    // list item with it; bookmarks always pass.
    #[test]
    fn the_shard_filter_drops_objects_outside_and_keeps_bookmarks() {
        use crate::cache::{HashRange, ShardSelector, fnv1a_64};
        // Only namespace "a" (0xaf63dc4c8601ec8c).
        let a = fnv1a_64(b"a");
        let filter = ShardFilter::new(
            ShardSelector::namespaces([HashRange::new(a, u128::from(a) + 1).unwrap()]).unwrap(),
        );
        let sent = |n: &str| SentBytes {
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            message: n.as_bytes().to_vec(),
        };
        let mut items = vec![in_namespace("b"), in_namespace("a"), in_namespace("c")];
        let mut bytes = vec![sent("b"), sent("a"), sent("c")];
        filter.retain(&mut items, &mut bytes);
        assert_eq!(items, [in_namespace("a")]);
        assert_eq!(bytes, [sent("a")]);
        let mut items = vec![in_namespace("a"), in_namespace("b")];
        filter.retain(&mut items, &mut Vec::new());
        assert_eq!(items, [in_namespace("a")]);

        assert!(filter.keeps(&WatchEvent::Added(in_namespace("a"))));
        assert!(!filter.keeps(&WatchEvent::Modified(in_namespace("b"))));
        assert!(!filter.keeps(&WatchEvent::Deleted(in_namespace("b"))));
        let bookmark: WatchEvent<ConfigMap> = serde_json::from_str(
            r#"{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"9"}}}"#,
        )
        .unwrap();
        assert!(filter.keeps(&bookmark));
    }
}
