//! Writes of whole objects as client-go's typed clients make them: a built-in type's create,
//! update and status update sent as Kubernetes protobuf and its answer read as protobuf, JSON
//! for what protobuf cannot carry (a custom resource) and for a server that refuses it.
//!
//! Reads are the informers' (`cache`, whose `wire/` reads LIST and WATCH bodies in either
//! encoding); patches stay with kube-client's `Api`, as client-go sends them as JSON too.
//!
//! | File | Holds | client-go |
//! |---|---|---|
//! | `write_api.rs` | [`WriteApi`]: create, replace, replace_status; the 415 fallback to JSON | `gentype/type.go` (`Create`, `Update`, `UpdateStatus`, `PrefersProtobuf`), `rest/client.go` (`clientContentConfigProvider`) |

mod write_api;

pub use write_api::WriteApi;
