//! The metrics server's serving certificate: self-signed at start, or read from files and read
//! again when they change.
//!
//! Counterpart: controller-runtime's `pkg/certwatcher` (`CertWatcher.GetCertificate`, polled
//! every 10 s, `ReadCertificate` keeping the old pair when the new one does not load) as
//! `pkg/metrics/server` uses it, and the self-signed pair it falls back to. Flags as
//! kubebuilder's scaffold names them: `--metrics-cert-path` (a directory), `--metrics-cert-name`
//! (`tls.crt`), `--metrics-cert-key` (`tls.key`).
//!
//! Differences on purpose: no fsnotify, only the poll (a Secret volume swaps a symlink, which a
//! content comparison sees whatever the watcher backend); HTTP/1.1 only on ALPN, as
//! kubebuilder's scaffold turns HTTP/2 off by default (CVE-2023-44487).
//!
//! Invariant: the served pair is always one that loaded whole (certificates parsed, key parsed
//! and matching the leaf); a bad rewrite leaves the previous pair in place.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_util::sync::CancellationToken;

/// How often files are read again; controller-runtime's `defaultWatchInterval`.
pub const DEFAULT_CERT_POLL_INTERVAL: Duration = Duration::from_secs(10);

/// Why a serving certificate could not be made or loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file does not hold what it should.
    #[error("{path}: {problem}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// The key does not belong to the certificate, or rustls refused the pair.
    #[error("{cert} with {key}: {problem}")]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// Generating the self-signed pair failed.
    #[error("generating a self-signed serving certificate: {0}")]
    Generate(String),
}

/// The pair being served, swapped in place when the files change.
pub struct CertWatcher {
    files: Option<(PathBuf, PathBuf)>,
    current: RwLock<Loaded>,
}

/// A certificate file's and a key file's bytes, as read.
type PairBytes = (Vec<u8>, Vec<u8>);

struct Loaded {
    key: Arc<CertifiedKey>,
    /// The bytes the pair was loaded from (empty when generated): a poll that reads the same
    /// bytes changes nothing.
    source: PairBytes,
}

impl fmt::Debug for CertWatcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CertWatcher")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl CertWatcher {
    /// A pair generated now for `localhost`, `127.0.0.1` and this host's name, as
    /// controller-runtime serves when given no certificate. Scrapers must skip verification
    /// (Prometheus: `insecure_skip_verify: true`) or be given files instead.
    pub fn self_signed() -> Result<Arc<Self>, TlsError> {
        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
        let host = gethostname::gethostname().to_string_lossy().into_owned();
        if !host.is_empty() && !names.contains(&host) {
            names.push(host);
        }
        let generated = rcgen::generate_simple_self_signed(names)
            .map_err(|e| TlsError::Generate(e.to_string()))?;
        let key = PrivateKeyDer::Pkcs8(generated.signing_key.serialize_der().into());
        let certified =
            CertifiedKey::from_der(vec![generated.cert.der().clone()], key, &provider())
                .map_err(|e| TlsError::Generate(e.to_string()))?;
        Ok(Arc::new(Self {
            files: None,
            current: RwLock::new(Loaded {
                key: Arc::new(certified),
                source: (Vec::new(), Vec::new()),
            }),
        }))
    }

    /// The pair in `cert` (PEM, leaf first) and `key` (PEM, PKCS#8, PKCS#1 or SEC1), loaded now;
    /// an error names the file and the problem.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Arc<Self>, TlsError> {
        let (loaded_key, source) = load(cert, key)?;
        Ok(Arc::new(Self {
            files: Some((cert.to_owned(), key.to_owned())),
            current: RwLock::new(Loaded {
                key: loaded_key,
                source,
            }),
        }))
    }

    /// Reads the files again: `Ok(true)` if a new pair is now served, `Ok(false)` if they are
    /// unchanged (or the pair is generated), `Err` (the old pair kept) if the new one is bad.
    pub fn reload(&self) -> Result<bool, TlsError> {
        let Some((cert, key)) = &self.files else {
            return Ok(false);
        };
        let source = (read(cert)?, read(key)?);
        if self.current.read().source == source {
            return Ok(false);
        }
        let loaded = parse(cert, key, &source)?;
        *self.current.write() = Loaded {
            key: loaded,
            source,
        };
        Ok(true)
    }

    /// Polls the files every `interval` until `stop`; a pair that fails to load is logged and
    /// the previous one kept. Does nothing for a generated pair.
    pub fn watch(self: &Arc<Self>, interval: Duration, stop: CancellationToken) {
        let Some((cert, _)) = &self.files else {
            return;
        };
        tracing::info!(cert = %cert.display(), ?interval, "watching the metrics serving certificate");
        let watcher = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                match watcher.reload() {
                    Ok(true) => tracing::info!("metrics serving certificate reloaded"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(
                        error = %e,
                        "metrics serving certificate not reloaded; the previous one is served"
                    ),
                }
            }
        });
    }

    /// The pair served now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.read().key.clone()
    }

    /// A rustls server configuration serving this watcher's pair, HTTP/1.1 only.
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Generate(e.to_string()))?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for CertWatcher {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

fn load(cert: &Path, key: &Path) -> Result<(Arc<CertifiedKey>, PairBytes), TlsError> {
    let source = (read(cert)?, read(key)?);
    let loaded = parse(cert, key, &source)?;
    Ok((loaded, source))
}

fn parse(
    cert_path: &Path,
    key_path: &Path,
    (cert, key): &PairBytes,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Parse {
            path: cert_path.to_owned(),
            problem: format!("not PEM certificates: {e}"),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Parse {
            path: cert_path.to_owned(),
            problem: "no CERTIFICATE block".into(),
        });
    }
    let private = PrivateKeyDer::from_pem_slice(key).map_err(|e| TlsError::Parse {
        path: key_path.to_owned(),
        problem: format!("no PEM private key: {e}"),
    })?;
    CertifiedKey::from_der(chain, private, &provider())
        .map(Arc::new)
        .map_err(|e| TlsError::Pair {
            cert: cert_path.to_owned(),
            key: key_path.to_owned(),
            problem: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(name: &str) -> (String, String) {
        let generated = rcgen::generate_simple_self_signed(vec![name.to_string()]).unwrap();
        (generated.cert.pem(), generated.signing_key.serialize_pem())
    }

    fn leaf(watcher: &CertWatcher) -> Vec<u8> {
        watcher.current().cert[0].to_vec()
    }

    fn der_of(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .to_vec()
    }

    // controller-runtime v0.24.1 pkg/certwatcher/certwatcher_test.go: "should read the initial
    // cert/key" and "should reload currentCert when changed"; plus a bad rewrite keeping the
    // served pair (certwatcher's ReadCertificate returns the error and keeps the old one).
    #[test]
    fn a_rewritten_pair_is_served_after_reload_and_a_bad_one_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (cert_a, key_a) = pair("a.example");
        std::fs::write(&cert, &cert_a).unwrap();
        std::fs::write(&key, &key_a).unwrap();
        let watcher = CertWatcher::from_files(&cert, &key).unwrap();
        assert_eq!(leaf(&watcher), der_of(&cert_a));
        assert!(!watcher.reload().unwrap(), "unchanged files change nothing");

        let (cert_b, key_b) = pair("b.example");
        std::fs::write(&cert, &cert_b).unwrap();
        std::fs::write(&key, &key_b).unwrap();
        assert!(watcher.reload().unwrap());
        assert_eq!(leaf(&watcher), der_of(&cert_b));

        // A certificate rewritten before its key: the pair does not match, B stays.
        let (cert_c, _) = pair("c.example");
        std::fs::write(&cert, &cert_c).unwrap();
        let err = watcher.reload().unwrap_err().to_string();
        assert!(err.contains("tls.crt") && err.contains("tls.key"), "{err}");
        assert_eq!(leaf(&watcher), der_of(&cert_b));

        std::fs::write(&cert, "not a certificate").unwrap();
        let err = watcher.reload().unwrap_err().to_string();
        assert!(
            err.contains("tls.crt") && err.contains("no CERTIFICATE"),
            "{err}"
        );
        assert_eq!(leaf(&watcher), der_of(&cert_b));
    }

    #[tokio::test]
    async fn the_poll_picks_up_new_files() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (cert_a, key_a) = pair("a.example");
        std::fs::write(&cert, &cert_a).unwrap();
        std::fs::write(&key, &key_a).unwrap();
        let watcher = CertWatcher::from_files(&cert, &key).unwrap();
        let stop = CancellationToken::new();
        watcher.watch(Duration::from_millis(20), stop.clone());

        let (cert_b, key_b) = pair("b.example");
        // The key first, then the certificate: a poll between the two sees a mismatch and
        // keeps A; the next one serves B.
        std::fs::write(&key, &key_b).unwrap();
        std::fs::write(&cert, &cert_b).unwrap();
        let mut served = false;
        for _ in 0..500 {
            if leaf(&watcher) == der_of(&cert_b) {
                served = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.cancel();
        assert!(served, "the rewritten pair is served after a poll");
    }

    // controller-runtime v0.24.1 pkg/certwatcher/certwatcher_test.go: "should errors without
    // cert/key".
    #[test]
    fn missing_files_are_named() {
        let err = CertWatcher::from_files(Path::new("/nonexistent/tls.crt"), Path::new("k"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("reading /nonexistent/tls.crt: "), "{err}");
    }
}
