//! [`WriteApi`]: create, replace and replace_status of one namespaced type, in protobuf where
//! the apiserver takes it, as client-go's typed clients write.
//!
//! Since v0.32 client-go's typed clients (`gentype`, `PrefersProtobuf`) send a built-in
//! object as `Content-Type: application/vnd.kubernetes.protobuf` and ask
//! `Accept: application/vnd.kubernetes.protobuf, application/json`: the apiserver decodes and
//! encodes no JSON for them. kube-client's `Api` writes JSON only; this does what client-go
//! does, over the same `kube_client::Client`:
//! - the body is [`protobuf::to_vec`] of the object, for a kind the protobuf table knows; a
//!   custom resource is written as JSON, which is all the apiserver takes for one;
//! - the answer is read by its `Content-Type`: protobuf with the protobuf decoder, anything
//!   else as JSON; an error answer (4xx, 5xx) is its `Status`, in either encoding, as
//!   `kube_client::Error::Api`, the error kube's `Api` gives, so callers match `code` and
//!   `reason` as before;
//! - a server that answers 415 Unsupported Media Type (or 406 Not Acceptable) to a protobuf
//!   write gets the same write again as JSON, and every later write of this `WriteApi` (and
//!   its clones) as JSON. client-go also switches for good
//!   (`clientContentConfigProvider.UnsupportedMediaType` in rest/client.go) but returns the
//!   refused write's error; a create or update refused for its encoding was not applied, so
//!   sending it again as JSON is safe and spares the caller a retry;
//! - an object the encoder cannot write (a value out of its field's range, a field the
//!   table does not know) is an error naming its kind and the field, and nothing is sent.
//!
//! What differs on purpose: one `WriteApi` serves every namespace, writing each object into
//! its own `metadata.namespace` (client-go's typed clients are bound to one namespace), so
//! that a controller keeps one per type and what it learnt about the server (the fallback)
//! holds for all its writes of that type. Only the default `PostParams` are sent (no dry run,
//! no field manager): the runtime's writes use no other.
//!
//! Invariant: `protobuf` only goes from true to false: once a server refused protobuf for
//! this type, this `WriteApi` never sends it again.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderValue, StatusCode, header};
use kube_client::client::Body;
use kube_client::core::{NamespaceResourceScope, Request, Status, request};
use kube_client::{Client, Error, Resource, api::PostParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::cache::{Encoding, Wire, decode_status};
use crate::protobuf::{self, ObjectType};

/// What a protobuf write asks for: protobuf, or JSON from a server that cannot (client-go's
/// `AcceptContentTypes` with protobuf preferred).
const PROTOBUF_ACCEPT: &str = "application/vnd.kubernetes.protobuf, application/json";
const JSON: &str = "application/json";

/// Creates, replaces and replaces the status of namespaced objects of type `K`, as client-go's
/// typed clients do (module docs): protobuf for a built-in kind, JSON otherwise or after the
/// server refused protobuf. Clones share what was learnt about the server.
pub struct WriteApi<K> {
    client: Client,
    /// Whether writes go as protobuf: set for a kind the protobuf table knows (unless
    /// [`Wire::Json`] was asked for), cleared for good by a 415 or 406 answer.
    protobuf: Arc<AtomicBool>,
    kind: PhantomData<fn() -> K>,
}

impl<K> Clone for WriteApi<K> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            protobuf: self.protobuf.clone(),
            kind: PhantomData,
        }
    }
}

/// The three writes, by where they go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verb {
    Create,
    Replace,
    ReplaceStatus,
}

impl<K> WriteApi<K>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope> + Serialize + DeserializeOwned,
{
    /// Writes of `K` through `client`: protobuf if `K` is a built-in kind (the protobuf
    /// table knows it), JSON if not.
    pub fn new(client: Client) -> Self {
        let built_in = ObjectType::of(&K::api_version(&()), &K::kind(&())).is_some();
        Self {
            client,
            protobuf: Arc::new(AtomicBool::new(built_in)),
            kind: PhantomData,
        }
    }

    /// Which encoding to write in: [`Wire::Auto`] (the default) as [`WriteApi::new`] says,
    /// [`Wire::Json`] for JSON only (to read the wire as text, or through a proxy that
    /// rewrites bodies).
    pub fn wire(self, wire: Wire) -> Self {
        if wire == Wire::Json {
            self.protobuf.store(false, Ordering::Relaxed);
        }
        self
    }

    /// Whether the next write goes as protobuf.
    pub fn writes_protobuf(&self) -> bool {
        self.protobuf.load(Ordering::Relaxed)
    }

    /// Creates `object` in its namespace (POST), returning what the apiserver stored.
    pub async fn create(&self, object: &K) -> Result<K, Error> {
        self.write(Verb::Create, object, Self::decode).await
    }

    /// Creates `object` as [`WriteApi::create`] does, for a caller that never reads what the
    /// apiserver stored (the events.k8s.io recorder): a success's body is not decoded.
    pub async fn create_unread(&self, object: &K) -> Result<(), Error> {
        self.write(Verb::Create, object, |_, _| Ok(())).await
    }

    /// Replaces the object named in `object`'s metadata (PUT); its resourceVersion, if set,
    /// makes this fail with 409 Conflict when someone wrote since.
    pub async fn replace(&self, object: &K) -> Result<K, Error> {
        self.write(Verb::Replace, object, Self::decode).await
    }

    /// Replaces the status of the object named in `object`'s metadata (PUT to its `status`
    /// subresource); 409 on a resourceVersion conflict.
    pub async fn replace_status(&self, object: &K) -> Result<K, Error> {
        self.write(Verb::ReplaceStatus, object, Self::decode).await
    }

    /// One write: as protobuf while this type is written so, once more as JSON if the server
    /// refuses protobuf; as JSON otherwise. A success's answer is what `read` makes of its
    /// body.
    async fn write<T>(&self, verb: Verb, object: &K, read: Reader<T>) -> Result<T, Error> {
        if self.writes_protobuf() {
            // Encoded before anything is sent: an object the encoder refuses sends nothing.
            let body = protobuf::to_vec(object).map_err(|e| unserializable(e.to_string()))?;
            let request = self.request(verb, object, body, Encoding::Protobuf)?;
            match self.send(request, read).await {
                Err(Error::Api(status)) if refuses_protobuf(&status) => {
                    self.protobuf.store(false, Ordering::Relaxed);
                    tracing::info!(
                        kind = %K::kind(&()),
                        code = status.code,
                        "the apiserver refuses protobuf writes of this type: writing JSON from now on"
                    );
                }
                answer => return answer,
            }
        }
        let body = serde_json::to_vec(object)
            .map_err(|e| Error::BuildRequest(request::Error::SerializeBody(e)))?;
        self.send(self.request(verb, object, body, Encoding::Json)?, read)
            .await
    }

    /// The request of `verb` for `object` with `body` in `encoding`, asking for the same
    /// encoding back (protobuf with JSON as its fallback).
    fn request(
        &self,
        verb: Verb,
        object: &K,
        body: Vec<u8>,
        encoding: Encoding,
    ) -> Result<http::Request<Vec<u8>>, Error> {
        let meta = object.meta();
        let Some(namespace) = meta.namespace.as_deref().filter(|ns| !ns.is_empty()) else {
            return Err(Error::BuildRequest(request::Error::Validation(format!(
                "{} {:?} has no metadata.namespace to be written into",
                K::kind(&()),
                meta.name.as_deref().unwrap_or_default()
            ))));
        };
        let url = Request::new(K::url_path(&(), Some(namespace)));
        let name = meta.name.as_deref().unwrap_or_default();
        let params = PostParams::default();
        let mut request = match verb {
            Verb::Create => url.create(&params, body),
            Verb::Replace => url.replace(name, &params, body),
            Verb::ReplaceStatus => url.replace_subresource("status", name, &params, body),
        }
        .map_err(Error::BuildRequest)?;
        let (content_type, accept) = match encoding {
            Encoding::Protobuf => (protobuf::CONTENT_TYPE, PROTOBUF_ACCEPT),
            Encoding::Json => (JSON, JSON),
        };
        let headers = request.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(header::ACCEPT, HeaderValue::from_static(accept));
        Ok(request)
    }

    /// Sends `request`: a success is what `read` makes of its body, a failure its `Status`.
    async fn send<T>(&self, request: http::Request<Vec<u8>>, read: Reader<T>) -> Result<T, Error> {
        let response = self.client.send(request.map(Body::from)).await?;
        let code = response.status();
        let encoding = Encoding::of(response.headers().get(header::CONTENT_TYPE));
        let body = response.into_body().collect_bytes().await?;
        if code.is_client_error() || code.is_server_error() {
            return Err(Error::Api(status_of(code, &body).boxed()));
        }
        read(encoding, &body)
    }

    /// A successful answer's body as the stored object, decoded by its `Content-Type`.
    fn decode(encoding: Encoding, body: &[u8]) -> Result<K, Error> {
        match encoding {
            Encoding::Json => serde_json::from_slice(body).map_err(Error::SerdeError),
            Encoding::Protobuf => protobuf::from_slice(body).map_err(|e| {
                Error::SerdeError(serde::de::Error::custom(format!(
                    "the {} answer in protobuf: {e}",
                    K::kind(&())
                )))
            }),
        }
    }
}

/// What a write makes of a successful answer's body, given its encoding.
type Reader<T> = fn(Encoding, &[u8]) -> Result<T, Error>;

/// A failed answer's `Status`, in either encoding; for a body that is none (a proxy's text),
/// one made from its text and code, as kube-client's `handle_api_errors` makes it.
fn status_of(code: StatusCode, body: &[u8]) -> Status {
    let mut status = decode_status(body)
        .filter(|s| s.code != 0 || !s.reason.is_empty() || !s.message.is_empty())
        .unwrap_or_else(|| {
            Status::failure(
                String::from_utf8_lossy(body).trim(),
                "Failed to parse error data",
            )
        });
    if status.code == 0 {
        status.code = code.as_u16();
    }
    status
}

/// Whether an answer says the server does not take protobuf: 415 for the body, 406 for what
/// was asked back.
fn refuses_protobuf(status: &Status) -> bool {
    status.code == StatusCode::UNSUPPORTED_MEDIA_TYPE.as_u16()
        || status.code == StatusCode::NOT_ACCEPTABLE.as_u16()
}

/// An object that cannot be put in a request body: the error kube's `Api` gives for a body
/// that does not serialize, with the encoder's words (the kind and the field).
fn unserializable(message: String) -> Error {
    Error::BuildRequest(request::Error::SerializeBody(serde::ser::Error::custom(
        message,
    )))
}

#[cfg(test)]
#[path = "write_api_tests.rs"]
mod tests;
