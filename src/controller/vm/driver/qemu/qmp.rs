//! A minimal QMP client (QEMU Machine Protocol, docs/interop/qmp-spec.rst): connect to the
//! unix socket, read the greeting, negotiate `qmp_capabilities`, then one command at a time.
//! Asynchronous events (`{"event": ...}`) arriving between a command and its answer are
//! skipped. Every step is bounded by the timeout given to [`Qmp::connect`].
//!
//! QEMU serves one QMP client at a time on a socket (others wait in the listen backlog), so a
//! connection is opened per driver call and closed right after.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};
use thiserror::Error;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};

/// A QMP exchange that failed.
#[derive(Debug, Error)]
pub enum QmpError {
    #[error("connecting to QMP at {path}: {source}")]
    /// The socket could not be connected to.
    Connect {
        /// The QMP socket.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    #[error("QMP at {path}: {source}")]
    /// Reading or writing the socket failed.
    Io {
        /// The QMP socket.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    #[error("QMP at {path} did not answer {command} within {timeout:?}")]
    /// No answer in time.
    Timeout {
        /// The QMP socket.
        path: String,
        /// The QMP command sent.
        command: String,
        /// How long the answer was waited for.
        timeout: Duration,
    },
    #[error("QMP at {path} closed the connection during {command}")]
    /// QEMU closed the socket before answering.
    Closed {
        /// The QMP socket.
        path: String,
        /// The QMP command sent.
        command: String,
    },
    #[error("QMP at {path} sent something that is not JSON: {line}")]
    /// An answer that is not QMP's JSON.
    Garbled {
        /// The QMP socket.
        path: String,
        /// The line as received.
        line: String,
    },
    #[error("QMP at {path} refused {command}: {class}: {desc}")]
    /// QEMU answered the command with an error.
    Refused {
        /// The QMP socket.
        path: String,
        /// The QMP command sent.
        command: String,
        /// QEMU's error class.
        class: String,
        /// QEMU's description of the error.
        desc: String,
    },
}

/// One negotiated QMP connection to a QEMU VM's `qmp.sock` (QEMU Machine Protocol). QEMU serves
/// one client at a time, so hold it only for the commands at hand.
pub struct Qmp {
    path: String,
    reader: BufReader<OwnedReadHalf>,
    writer: OwnedWriteHalf,
    timeout: Duration,
}

impl Qmp {
    /// Connects and leaves capabilities negotiation mode.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Self, QmpError> {
        let display = path.display().to_string();
        let stream = tokio::time::timeout(timeout, UnixStream::connect(path))
            .await
            .map_err(|_| QmpError::Timeout {
                path: display.clone(),
                command: "connect".into(),
                timeout,
            })?
            .map_err(|source| QmpError::Connect {
                path: display.clone(),
                source,
            })?;
        let (read, writer) = stream.into_split();
        let mut qmp = Self {
            path: display,
            reader: BufReader::new(read),
            writer,
            timeout,
        };
        // The greeting: {"QMP": {"version": ..., "capabilities": [...]}}.
        qmp.read_message("greeting").await?;
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    /// Runs `command` (with `arguments`) and returns its `return` value.
    pub async fn execute(
        &mut self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        let mut request = json!({ "execute": command });
        if let Some(arguments) = arguments {
            request["arguments"] = arguments;
        }
        let mut line = request.to_string();
        line.push('\n');
        let path = self.path.clone();
        tokio::time::timeout(self.timeout, self.writer.write_all(line.as_bytes()))
            .await
            .map_err(|_| QmpError::Timeout {
                path: path.clone(),
                command: command.into(),
                timeout: self.timeout,
            })?
            .map_err(|source| QmpError::Io {
                path: path.clone(),
                source,
            })?;
        loop {
            let message = self.read_message(command).await?;
            if message.get("event").is_some() {
                continue;
            }
            if let Some(value) = message.get("return") {
                return Ok(value.clone());
            }
            if let Some(error) = message.get("error") {
                let text = |k: &str| {
                    error
                        .get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string()
                };
                return Err(QmpError::Refused {
                    path,
                    command: command.into(),
                    class: text("class"),
                    desc: text("desc"),
                });
            }
        }
    }

    async fn read_message(&mut self, command: &str) -> Result<Value, QmpError> {
        let mut line = String::new();
        let read = tokio::time::timeout(self.timeout, self.reader.read_line(&mut line))
            .await
            .map_err(|_| QmpError::Timeout {
                path: self.path.clone(),
                command: command.into(),
                timeout: self.timeout,
            })?
            .map_err(|source| QmpError::Io {
                path: self.path.clone(),
                source,
            })?;
        if read == 0 {
            return Err(QmpError::Closed {
                path: self.path.clone(),
                command: command.into(),
            });
        }
        serde_json::from_str(line.trim()).map_err(|_| QmpError::Garbled {
            path: self.path.clone(),
            line: line.trim().chars().take(200).collect(),
        })
    }
}

/// `query-status`'s `status` (`running`, `paused`, `shutdown`, `internal-error`, ...).
pub(crate) async fn query_status(qmp: &mut Qmp) -> Result<String, QmpError> {
    let answer = qmp.execute("query-status", None).await?;
    Ok(answer
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_string())
}

/// `kvm` if `query-kvm` says KVM is enabled, else `tcg`.
pub(crate) async fn query_accelerator(qmp: &mut Qmp) -> Result<&'static str, QmpError> {
    let answer = qmp.execute("query-kvm", None).await?;
    Ok(
        if answer.get("enabled").and_then(Value::as_bool) == Some(true) {
            "kvm"
        } else {
            "tcg"
        },
    )
}

#[cfg(test)]
mod tests {
    use tokio::net::UnixListener;

    use super::*;

    /// A QMP server stand-in answering with QEMU's framing: greeting, then one line per
    /// request, with an event slipped in before the second answer.
    async fn serve(listener: UnixListener, answers: Vec<&'static str>) {
        let (stream, _) = listener.accept().await.unwrap();
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        write
            .write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\r\n")
            .await
            .unwrap();
        for (i, answer) in answers.into_iter().enumerate() {
            lines.next_line().await.unwrap().unwrap();
            if i == 1 {
                write
                    .write_all(b"{\"event\": \"RESUME\", \"timestamp\": {}}\r\n")
                    .await
                    .unwrap();
            }
            write.write_all(answer.as_bytes()).await.unwrap();
            write.write_all(b"\r\n").await.unwrap();
        }
    }

    #[tokio::test]
    async fn commands_get_their_answers_past_events_and_errors_name_the_command() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(serve(
            listener,
            vec![
                r#"{"return": {}}"#,
                r#"{"return": {"status": "running", "running": true}}"#,
                r#"{"error": {"class": "GenericError", "desc": "nope"}}"#,
            ],
        ));
        let mut qmp = Qmp::connect(&path, Duration::from_secs(5)).await.unwrap();
        assert_eq!(query_status(&mut qmp).await.unwrap(), "running");
        let err = qmp.execute("quit", None).await.unwrap_err();
        assert!(
            err.to_string().contains("refused quit: GenericError: nope"),
            "{err}"
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_socket_nobody_serves_is_a_connect_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("absent.sock");
        let err = Qmp::connect(&path, Duration::from_secs(1))
            .await
            .err()
            .unwrap();
        assert!(matches!(err, QmpError::Connect { .. }), "{err}");
        assert!(err.to_string().contains("absent.sock"), "{err}");
    }
}
