//! A fault-injecting TCP proxy on loopback, between a client and the apiserver.
//!
//! TLS passes through untouched (the serving certificate covers 127.0.0.1), so a client
//! pointed at the proxy with [`super::Cluster::client_config_via`] works as usual until a
//! fault is injected: [`FaultProxy::cut_all`] drops every open connection (a watch ends
//! mid-stream), [`FaultProxy::set_blocked`] makes new connections fail at once, as a
//! refused or unreachable apiserver would.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::TestEnvError;

/// A TCP proxy in front of the apiserver that can cut every connection or refuse new ones,
/// to test what a client does when the network fails.
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: CancellationToken,
}

struct Shared {
    target: SocketAddr,
    blocked: AtomicBool,
    /// Bumped by `cut_all`; each connection ends when it sees a generation newer than its own.
    generation: watch::Sender<u64>,
    accepted: AtomicU64,
}

impl FaultProxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    /// The accept loop runs on the current tokio runtime until the proxy is dropped.
    pub async fn start(target: SocketAddr) -> Result<Self, TestEnvError> {
        let listener =
            TcpListener::bind("127.0.0.1:0")
                .await
                .map_err(|source| TestEnvError::Io {
                    path: "127.0.0.1:0".into(),
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| TestEnvError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })?;
        let shared = Arc::new(Shared {
            target,
            blocked: AtomicBool::new(false),
            generation: watch::channel(0).0,
            accepted: AtomicU64::new(0),
        });
        let stop = CancellationToken::new();
        tokio::spawn(accept_loop(listener, shared.clone(), stop.clone()));
        Ok(Self { addr, shared, stop })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every connection open now. New connections are accepted as before.
    pub fn cut_all(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
    }

    /// While blocked, new connections are closed as soon as they are accepted.
    /// Open connections are left alone: combine with [`FaultProxy::cut_all`] for a full outage.
    pub fn set_blocked(&self, blocked: bool) {
        self.shared.blocked.store(blocked, Ordering::SeqCst);
    }

    /// How many connections have been accepted (blocked ones included).
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.cut_all();
        self.stop.cancel();
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((inbound, _)) = accepted else { continue };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        if shared.blocked.load(Ordering::SeqCst) {
            drop(inbound);
            continue;
        }
        tokio::spawn(forward(inbound, shared.clone()));
    }
}

async fn forward(mut inbound: TcpStream, shared: Arc<Shared>) {
    let mut generation = shared.generation.subscribe();
    let born = *generation.borrow_and_update();
    let Ok(mut outbound) = TcpStream::connect(shared.target).await else {
        return;
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = generation.wait_for(|g| *g != born) => {
            // Dropping both halves resets the connection: the client sees it end mid-stream.
        }
    }
}
