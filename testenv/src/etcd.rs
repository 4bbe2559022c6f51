//! [`EtcdClient`]: the little the harness asks of etcd itself, beside the apiserver: whether it
//! is healthy (its readiness check) and a compaction ([`super::Cluster::compact_etcd`]).
//!
//! It speaks to etcd's JSON gateway (`/health`, `/v3/kv/...`) on the plain-http client port,
//! one hand-written HTTP/1.1 request per call: small enough to write by hand, and it keeps a
//! second HTTP client stack out of the harness.

use super::TestEnvError;

/// etcd's client URL on loopback, and the requests the harness sends there.
#[derive(Clone, Debug)]
pub(super) struct EtcdClient {
    /// `http://127.0.0.1:<port>`.
    url: String,
}

impl EtcdClient {
    /// The etcd that listens for clients on `127.0.0.1:port`.
    pub(super) fn local(port: u16) -> Self {
        Self {
            url: format!("http://127.0.0.1:{port}"),
        }
    }

    /// `http://127.0.0.1:<port>`, for etcd's `--listen-client-urls`.
    pub(super) fn url(&self) -> &str {
        &self.url
    }

    /// Whether etcd's `/health` says it is healthy.
    pub(super) async fn is_healthy(&self) -> Result<bool, TestEnvError> {
        let body = self.request("GET", "/health", "").await?;
        Ok(body.contains("\"health\":\"true\""))
    }

    /// Compacts etcd up to its current revision, so a watch or list from an older
    /// resourceVersion that reaches etcd gets 410 Gone. Returns the compacted revision.
    pub(super) async fn compact(&self) -> Result<i64, TestEnvError> {
        // A range over an arbitrary key returns the header revision.
        let range = self.post("/v3/kv/range", r#"{"key":"Lw=="}"#).await?;
        let revision: i64 = range
            .get("header")
            .and_then(|h| h.get("revision"))
            .and_then(|r| {
                r.as_str()
                    .and_then(|s| s.parse().ok())
                    .or_else(|| r.as_i64())
            })
            .ok_or_else(|| TestEnvError::Etcd(format!("no header.revision in {range}")))?;
        self.post(
            "/v3/kv/compaction",
            &format!(r#"{{"revision":"{revision}","physical":true}}"#),
        )
        .await?;
        Ok(revision)
    }

    async fn post(&self, path: &str, body: &str) -> Result<serde_json::Value, TestEnvError> {
        let text = self.request("POST", path, body).await?;
        serde_json::from_str(&text).map_err(|e| TestEnvError::Etcd(format!("{path}: {e}: {text}")))
    }

    /// One HTTP/1.1 request; the body of a 200 answer, or an error with the status line.
    async fn request(&self, method: &str, path: &str, body: &str) -> Result<String, TestEnvError> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let host = self.url.trim_start_matches("http://");
        let mut stream = tokio::net::TcpStream::connect(host)
            .await
            .map_err(|e| TestEnvError::Etcd(format!("connect {host}: {e}")))?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        stream
            .write_all(request.as_bytes())
            .await
            .map_err(|e| TestEnvError::Etcd(e.to_string()))?;
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .map_err(|e| TestEnvError::Etcd(e.to_string()))?;
        let response = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
        if !head.starts_with("HTTP/1.1 200") {
            return Err(TestEnvError::Etcd(format!(
                "{method} {path}: {head} {body}"
            )));
        }
        Ok(body.to_owned())
    }
}
