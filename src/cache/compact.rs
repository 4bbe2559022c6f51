//! The compact store's encoding: each cached object held as a zstd frame, of the bytes the
//! apiserver sent for it where the wire hands them out (a protobuf LIST or streaming list, no
//! transform: [`SentBytes`]) and of its JSON otherwise, with a dictionary per form
//! trained on the informer's first list. No client-go counterpart: client-go's
//! informers keep decoded Go objects; Kubernetes' work-in-progress "bytecache" store
//! (kubernetes#141683) and argo-cd's compressed cache (argo-cd#28600) keep bytes, as this does.
//!
//! Why zstd with a trained dictionary: a binary encoding (MessagePack, CBOR) of one object
//! saves only JSON's punctuation, and a compressor working on one object at a time finds
//! little to share inside it. A dictionary trained on a hundred of the type's objects holds
//! what they all repeat (the keys, managedFields' field sets, the manager names, the
//! namespace), so each frame carries mostly its own data (for random payloads, their base64
//! entropy-coded). The dictionary is trained once, on the first list with at least
//! [`TRAIN_MIN_OBJECTS`] objects, and kept for the informer's life; objects encoded before it
//! exists are frames without one, and every frame says which it is (zstd writes the
//! dictionary's id into the frame header).
//!
//! Which bytes: a frame of the protobuf the apiserver sent is as small as a frame of the
//! decoded object's JSON (the dictionary holds what either form repeats) and skips
//! serializing the JSON, so a store keeps the sent bytes wherever it has them. Watch events
//! after the sync reach the store through the queue as decoded objects, and are framed as
//! JSON (with their own dictionary, trained on the same first list). zstd's negative levels
//! would encode faster but leave literals raw, and the frames larger.
//!
//! How it compresses ([`compression_parameters`]): level 1, in blocks of at most 1 KiB, with a
//! faster-skipping match search. Most of an encode at plain level 1 went to building a Huffman
//! table for each frame's literals (the random data) and to searching for matches in data
//! that has none; in blocks of at most 1 KiB zstd takes the dictionary's Huffman table for
//! literals instead of building one. Encoding, the sync's cost, becomes several times cheaper
//! for frames a little larger and a slower decode (literals coded with the dictionary's table
//! come as one stream): the store is for memory, and sync is where its cost was over
//! client-go's.
//!
//! What it costs: every read decodes a frame, so a lister read and a full list cost more than
//! the typed store's (no cache of decoded objects: it would hold back what the store saves),
//! and a controller that lists everything often should keep the typed store.
//! benches/README.md ("Informer") has the measurements.
//!
//! Contexts are reused: each thread keeps a decompression context, a compression context for
//! frames without a dictionary and the buffer it compresses into; a dictionary keeps its own
//! compression contexts (as many as frames were ever compressed with it at once). So a read
//! allocates only its output and an encoding only its frame; a fresh context per object costs
//! more than the work.

use std::cell::RefCell;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use serde::Serialize;
use serde::de::DeserializeOwned;
use zstd::zstd_safe::{self, CCtx, CParameter, DCtx, DDict};

use super::stored::{Arrived, Codec, CodecError, Encoded, ObjectCodec, SentBytes};

/// The first list with at least this many objects trains the dictionary.
pub const TRAIN_MIN_OBJECTS: usize = 64;
/// How many of that list's objects the dictionary is trained on.
const TRAIN_SAMPLES: usize = 128;
/// The dictionary's size: on the bench's ConfigMaps a 4 KiB dictionary compressed as well as
/// a 16 KiB one.
const DICT_BYTES: usize = 4096;
/// zstd's fastest level with entropy-coded literals: higher levels saved under 0.1% here and
/// cost a third more time; the negative ones leave the literals raw (a frame 1.26x bigger).
const LEVEL: i32 = 1;

/// A compact store's codec for `K`.
pub(crate) fn codec<K: Serialize + DeserializeOwned + 'static>() -> Arc<Codec<K>> {
    Arc::new(ZstdCodec::<K>::new())
}

/// What a frame holds, its first byte; a zstd frame follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    /// The object's JSON, as serde_json writes it from the decoded object.
    Json = 0,
    /// The protobuf message the apiserver sent, of the codec's [`SentType`] (the one
    /// `apiVersion` and `kind` a store's sent bytes have: one resource's).
    Protobuf = 1,
}

impl Form {
    fn of(byte: u8) -> Option<Self> {
        [Self::Json, Self::Protobuf]
            .into_iter()
            .find(|f| *f as u8 == byte)
    }
}

/// What a frame's decoding or encoding failed on, below the object's own decoding.
#[derive(Debug, thiserror::Error)]
enum FrameError {
    /// zstd refused the frame.
    #[error("zstd: {}", zstd_safe::get_error_name(*.0))]
    Zstd(usize),
    /// The frame was made with a dictionary this store does not have.
    #[error("frame needs dictionary {0}, which this store does not have")]
    UnknownDictionary(u32),
    /// The frame does not start with a form this codec writes.
    #[error("a frame of unknown form {0:?}")]
    UnknownForm(Option<u8>),
    /// A protobuf frame in a codec that never framed sent bytes.
    #[error("a protobuf frame in a store that never kept the bytes the apiserver sent")]
    NoSentType,
}

/// Encodes and decodes one type's objects as zstd frames, of the bytes the apiserver sent
/// when they are given, else of their JSON.
struct ZstdCodec<K> {
    to_json: fn(&K) -> serde_json::Result<Vec<u8>>,
    from_json: fn(&[u8]) -> serde_json::Result<K>,
    from_protobuf: fn(&str, &str, &[u8]) -> Result<K, crate::protobuf::DecodeError>,
    /// One per [`Form`], both set by the one training: `Some` when trained, `None` when
    /// training failed or had too few samples of that form (never tried again).
    dictionaries: [OnceLock<Option<Dictionary>>; 2],
    /// The type of the sent bytes its protobuf frames hold, set by the first it sees: a
    /// frame holds only the message. Sent bytes of another type (none come from one
    /// resource's list and watch) are framed as JSON.
    sent_type: OnceLock<SentType>,
}

/// The `apiVersion` and `kind` of sent bytes.
#[derive(Debug, PartialEq, Eq)]
struct SentType {
    api_version: String,
    kind: String,
}

struct Dictionary {
    id: u32,
    /// The trained bytes, which each compression context in `compress` loads.
    bytes: Vec<u8>,
    /// Compression contexts with this dictionary loaded under [`compression_parameters`],
    /// one taken per frame and put back (as many as frames were ever compressed at once).
    compress: Mutex<Vec<CCtx<'static>>>,
    decompress: DDict<'static>,
}

/// The parameters a dictionary's frames are compressed with (the module docs measure them):
/// zstd's level 1, in blocks of at most 1 KiB, so that a block's literals take the
/// dictionary's Huffman table instead of building one each (zstd reuses a table only for
/// literals of at most 1 KiB); a match search that skips ahead faster through data it finds
/// no match in (`targetLength`), with the literals still entropy-coded, which that setting
/// alone would turn off.
fn compression_parameters() -> [CParameter; 4] {
    [
        CParameter::CompressionLevel(LEVEL),
        CParameter::MaxBlockSize(1024),
        CParameter::TargetLength(16),
        CParameter::LiteralCompressionMode(zstd_safe::ParamSwitch::Enable),
    ]
}

impl Dictionary {
    /// Compresses `content` into `out` with a context of this dictionary's.
    fn compress(&self, out: &mut Vec<u8>, content: &[u8]) -> Result<usize, FrameError> {
        let taken = self.compress.lock().pop();
        let mut context = match taken {
            Some(context) => context,
            None => {
                let mut context = CCtx::create();
                for parameter in compression_parameters() {
                    context.set_parameter(parameter).map_err(FrameError::Zstd)?;
                }
                context
                    .load_dictionary(&self.bytes)
                    .map_err(FrameError::Zstd)?;
                context
            }
        };
        let written = context.compress2(out, content).map_err(FrameError::Zstd);
        self.compress.lock().push(context);
        written
    }
}

/// A thread's zstd contexts (its compression context for frames without a dictionary), and
/// the buffer it compresses into before a frame is made.
struct Contexts {
    compress: CCtx<'static>,
    decompress: DCtx<'static>,
    compressed: Vec<u8>,
}

thread_local! {
    static CONTEXTS: RefCell<Contexts> = RefCell::new(Contexts {
        compress: CCtx::create(),
        decompress: DCtx::create(),
        compressed: Vec::new(),
    });
}

impl<K: Serialize + DeserializeOwned> ZstdCodec<K> {
    fn new() -> Self {
        Self {
            to_json: |k| serde_json::to_vec(k),
            from_json: |b| serde_json::from_slice(b),
            from_protobuf: |api_version, kind, message| {
                crate::protobuf::decode_message(api_version, kind, message)
            },
            dictionaries: Default::default(),
            sent_type: OnceLock::new(),
        }
    }
}

/// Trains a dictionary on `samples`, or says why not (logged) with `None`.
fn train_on(form: Form, samples: &[Vec<u8>]) -> Option<Dictionary> {
    if samples.len() < TRAIN_MIN_OBJECTS {
        return None;
    }
    match zstd::dict::from_samples(samples, DICT_BYTES) {
        Ok(bytes) => Some(Dictionary {
            id: zstd_safe::get_dict_id(&bytes).map_or(0, |id| id.get()),
            decompress: DDict::create(&bytes),
            compress: Mutex::new(Vec::new()),
            bytes,
        }),
        Err(e) => {
            tracing::warn!(
                "compact store: no {form:?} dictionary trained ({e}); frames go without one"
            );
            None
        }
    }
}

impl<K> ZstdCodec<K> {
    /// Trains the dictionaries on `objects` if there are none yet and they are enough: the
    /// JSON one on their JSON, the protobuf one on the bytes they were sent as, if enough of
    /// them came with those. A training that fails leaves that form's frames without one.
    fn train(&self, objects: &[Arrived<K>]) {
        if self.settled() || objects.len() < TRAIN_MIN_OBJECTS {
            return;
        }
        let objects = &objects[..objects.len().min(TRAIN_SAMPLES)];
        let json: Vec<Vec<u8>> = objects
            .iter()
            .filter_map(|o| (self.to_json)(&o.object).ok())
            .collect();
        let protobuf: Vec<Vec<u8>> = objects
            .iter()
            .filter_map(|o| self.message_of(o.sent.as_deref()?).map(<[u8]>::to_vec))
            .collect();
        let _ = self.dictionaries[Form::Protobuf as usize].set(train_on(Form::Protobuf, &protobuf));
        let _ = self.dictionaries[Form::Json as usize].set(train_on(Form::Json, &json));
    }

    /// The message of `sent`, if it is of the type this codec's protobuf frames hold (the
    /// first type it sees becomes that).
    fn message_of<'s>(&self, sent: &'s SentBytes) -> Option<&'s [u8]> {
        let of = self.sent_type.get_or_init(|| SentType {
            api_version: sent.api_version.clone(),
            kind: sent.kind.clone(),
        });
        (of.api_version == sent.api_version && of.kind == sent.kind).then_some(&sent.message[..])
    }

    /// Whether training is over (trained, or failed for good): objects no longer wait for it.
    fn settled(&self) -> bool {
        self.dictionaries[Form::Json as usize].get().is_some()
    }

    fn trained(&self, form: Form) -> Option<&Dictionary> {
        self.dictionaries[form as usize]
            .get()
            .and_then(Option::as_ref)
    }

    /// `form`, then `content` compressed with that form's dictionary if there is one.
    /// The frame is allocated once, at its size, and filled from the thread's buffer.
    fn compress(&self, form: Form, content: &[u8]) -> Result<Encoded, FrameError> {
        CONTEXTS.with_borrow_mut(|c| {
            let out = &mut c.compressed;
            out.clear();
            out.reserve(zstd_safe::compress_bound(content.len()));
            match self.trained(form) {
                Some(d) => d.compress(out, content)?,
                None => c
                    .compress
                    .compress(out, content, LEVEL)
                    .map_err(FrameError::Zstd)?,
            };
            Ok(std::iter::once(form as u8)
                .chain(out.iter().copied())
                .collect())
        })
    }

    /// A frame's form and content.
    fn decompress(&self, frame: &[u8]) -> Result<(Form, Vec<u8>), FrameError> {
        let (form, frame) = match frame.split_first() {
            Some((&byte, rest)) => (
                Form::of(byte).ok_or(FrameError::UnknownForm(Some(byte)))?,
                rest,
            ),
            None => return Err(FrameError::UnknownForm(None)),
        };
        let size = zstd_safe::get_frame_content_size(frame)
            .ok()
            .flatten()
            .unwrap_or(0) as usize;
        let mut content = Vec::with_capacity(size);
        CONTEXTS.with_borrow_mut(|c| match zstd_safe::get_dict_id_from_frame(frame) {
            None => c
                .decompress
                .decompress(&mut content, frame)
                .map_err(FrameError::Zstd),
            Some(id) => match self.trained(form) {
                Some(d) if d.id == id.get() => c
                    .decompress
                    .decompress_using_ddict(&mut content, frame, &d.decompress)
                    .map_err(FrameError::Zstd),
                _ => Err(FrameError::UnknownDictionary(id.get())),
            },
        })?;
        Ok((form, content))
    }
}

impl<K> ObjectCodec<K> for ZstdCodec<K> {
    /// The first [`TRAIN_SAMPLES`] objects of the first list wait for the dictionaries.
    fn ready(&self, waiting: &[Arrived<K>]) -> bool {
        if !self.settled() && waiting.len() >= TRAIN_SAMPLES {
            self.train(waiting);
        }
        self.settled()
    }

    fn learn(&self, objects: &[Arrived<K>]) {
        self.train(objects);
    }

    fn encode(&self, obj: &K, sent: Option<&SentBytes>) -> Result<Encoded, CodecError> {
        Ok(match sent.and_then(|s| self.message_of(s)) {
            Some(message) => self.compress(Form::Protobuf, message)?,
            None => self.compress(Form::Json, &(self.to_json)(obj)?)?,
        })
    }

    fn decode(&self, frame: &[u8]) -> Result<K, CodecError> {
        let (form, content) = self.decompress(frame)?;
        match form {
            Form::Json => Ok((self.from_json)(&content)?),
            Form::Protobuf => {
                let of = self.sent_type.get().ok_or(FrameError::NoSentType)?;
                Ok((self.from_protobuf)(&of.api_version, &of.kind, &content)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube_client::api::ObjectMeta;

    fn cm(i: usize) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(format!("cm-{i}")),
                namespace: Some("ns".into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                resource_version: Some(i.to_string()),
                ..Default::default()
            },
            data: Some([("k".to_string(), format!("value {i} {}", i * 7919))].into()),
            ..Default::default()
        }
    }

    fn arrived(objects: impl Iterator<Item = ConfigMap>) -> Vec<Arrived<ConfigMap>> {
        objects
            .map(|o| Arrived {
                object: Arc::new(o),
                sent: None,
            })
            .collect()
    }

    // kubeloop's own: frames from before and after the dictionary both decode to the object,
    // and the dictionary makes them smaller.
    #[test]
    fn frames_round_trip_with_and_without_the_dictionary() {
        let codec = ZstdCodec::<ConfigMap>::new();
        let before = codec.encode(&cm(1), None).unwrap();
        let objects = arrived((0..TRAIN_MIN_OBJECTS * 2).map(cm));
        assert!(
            !codec.ready(&objects[..TRAIN_MIN_OBJECTS]),
            "waits for more"
        );
        codec.learn(&objects[..TRAIN_MIN_OBJECTS - 1]);
        assert!(
            codec.trained(Form::Json).is_none(),
            "too few objects to train on"
        );
        codec.learn(&objects);
        assert!(codec.trained(Form::Json).is_some());
        assert!(
            codec.trained(Form::Protobuf).is_none(),
            "no protobuf samples: no protobuf dictionary"
        );
        let after = codec.encode(&cm(1), None).unwrap();
        assert!(
            after.len() < before.len(),
            "{} >= {}",
            after.len(),
            before.len()
        );
        assert_eq!(codec.decode(&before).unwrap(), cm(1));
        assert_eq!(codec.decode(&after).unwrap(), cm(1));
    }

    /// The blocks of a zstd frame (RFC 8878, 3.1.1): the frame header's fields, then each
    /// block's three-byte header until the last.
    fn blocks_of(frame: &[u8]) -> usize {
        let descriptor = frame[4];
        let single_segment = descriptor & 0x20 != 0;
        let dictionary_id = [0, 1, 2, 4][usize::from(descriptor & 3)];
        let content_size = [usize::from(single_segment), 2, 4, 8][usize::from(descriptor >> 6)];
        let mut at = 5 + usize::from(!single_segment) + dictionary_id + content_size;
        let mut blocks = 0;
        loop {
            let header = u32::from_le_bytes([frame[at], frame[at + 1], frame[at + 2], 0]);
            blocks += 1;
            let size = (header >> 3) as usize;
            at += 3 + if (header >> 1) & 3 == 1 { 1 } else { size };
            if header & 1 == 1 {
                return blocks;
            }
        }
    }

    // kubeloop's own: a frame made with a dictionary is cut into blocks of at most 1 KiB
    // (compression_parameters), so its literals take the dictionary's Huffman table; one
    // without a dictionary is a single block at zstd's defaults.
    #[test]
    fn dictionary_frames_are_cut_into_blocks_of_a_kibibyte() {
        let mut seed = 7u64;
        let mut noisy = |i: usize| {
            let mut o = cm(i);
            let value: String = (0..3000)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    char::from(b'a' + (seed >> 59) as u8)
                })
                .collect();
            o.data = Some([("k".to_string(), value)].into());
            o
        };
        let codec = ZstdCodec::<ConfigMap>::new();
        let before = codec.encode(&noisy(0), None).unwrap();
        assert_eq!(blocks_of(&before[1..]), 1);
        codec.learn(&arrived((0..TRAIN_SAMPLES).map(&mut noisy)));
        assert!(codec.trained(Form::Json).is_some());
        let object = noisy(1);
        let after = codec.encode(&object, None).unwrap();
        assert!(
            blocks_of(&after[1..]) >= 3,
            "{} blocks",
            blocks_of(&after[1..])
        );
        assert_eq!(codec.decode(&after).unwrap(), object);
    }

    /// The testdata ConfigMap as the apiserver sent it, and its parsed envelope.
    fn sent_configmap() -> (SentBytes, crate::protobuf::Envelope<'static>) {
        let body = include_bytes!("../protobuf/testdata/configmap.pb");
        let envelope = crate::protobuf::Envelope::parse(body).unwrap();
        let sent = SentBytes {
            api_version: envelope.api_version.to_string(),
            kind: envelope.kind.to_string(),
            message: envelope.raw.to_vec(),
        };
        (sent, envelope)
    }

    // kubeloop's own: an object that came with the bytes the apiserver sent is kept as those
    // bytes and decodes to what the wire decoded, with and without the protobuf dictionary.
    #[test]
    fn sent_bytes_are_kept_and_decode_to_the_same_object() {
        let (sent, envelope) = sent_configmap();
        let wire: ConfigMap = envelope.decode().unwrap();
        let codec = ZstdCodec::<ConfigMap>::new();
        let frame = codec.encode(&ConfigMap::default(), Some(&sent)).unwrap();
        assert_eq!(frame[0], Form::Protobuf as u8);
        assert_eq!(
            codec.decode(&frame).unwrap(),
            wire,
            "the sent bytes, not the object"
        );
        // Trained on objects that were sent this way, with their names changed so the
        // samples differ.
        let objects: Vec<Arrived<ConfigMap>> = (0..TRAIN_SAMPLES)
            .map(|i| {
                let mut message = sent.message.clone();
                let at = message.len() / 2;
                message[at..at + 4].copy_from_slice(&(i as u32).to_be_bytes());
                Arrived {
                    object: Arc::new(cm(i)),
                    sent: Some(Box::new(SentBytes {
                        message,
                        ..sent.clone()
                    })),
                }
            })
            .collect();
        assert!(codec.ready(&objects));
        assert!(codec.trained(Form::Json).is_some());
        assert!(codec.trained(Form::Protobuf).is_some());
        let trained = codec.encode(&ConfigMap::default(), Some(&sent)).unwrap();
        assert!(
            trained.len() < frame.len(),
            "{} >= {}",
            trained.len(),
            frame.len()
        );
        assert_eq!(codec.decode(&trained).unwrap(), wire);
        assert_eq!(
            codec.decode(&frame).unwrap(),
            wire,
            "a frame from before training"
        );
    }

    // kubeloop's own: a codec's protobuf frames hold the messages of one type, the first it
    // sees; sent bytes of another type are framed as the object's JSON, and a protobuf frame
    // in a codec that never kept sent bytes is refused by name.
    #[test]
    fn sent_bytes_of_a_second_type_are_framed_as_json() {
        let (sent, _) = sent_configmap();
        let codec = ZstdCodec::<ConfigMap>::new();
        let first = codec.encode(&cm(1), Some(&sent)).unwrap();
        assert_eq!(first[0], Form::Protobuf as u8);
        let other = SentBytes {
            kind: "Secret".into(),
            ..sent.clone()
        };
        let second = codec.encode(&cm(2), Some(&other)).unwrap();
        assert_eq!(second[0], Form::Json as u8);
        assert_eq!(codec.decode(&second).unwrap(), cm(2));
        let err = ZstdCodec::<ConfigMap>::new().decode(&first).unwrap_err();
        assert!(err.to_string().contains("never kept"), "{err}");
    }

    // kubeloop's own: a frame made with another store's dictionary, or of a form this codec
    // does not write, is an error naming it, never a wrong object.
    #[test]
    fn a_frame_from_another_dictionary_or_form_is_refused() {
        let objects = arrived((0..TRAIN_SAMPLES).map(cm));
        let one = ZstdCodec::<ConfigMap>::new();
        assert!(one.ready(&objects), "trains on a full sample");
        let other = ZstdCodec::<ConfigMap>::new();
        let frame = one.encode(&cm(3), None).unwrap();
        let err = other.decode(&frame).unwrap_err();
        assert!(
            matches!(err.downcast_ref(), Some(FrameError::UnknownDictionary(_))),
            "{err}"
        );
        let mut unknown = frame.to_vec();
        unknown[0] = 7;
        let err = one.decode(&unknown).unwrap_err();
        assert!(
            matches!(err.downcast_ref(), Some(FrameError::UnknownForm(Some(7)))),
            "{err}"
        );
    }
}
