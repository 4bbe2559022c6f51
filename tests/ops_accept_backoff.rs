//! An ops server out of file descriptors waits between accepts instead of spinning: with the
//! process at its `RLIMIT_NOFILE` and a connection pending in the backlog, every `accept` fails
//! with EMFILE; the server retries after 5 ms, 10 ms, ... up to 1 s (Go's `net/http` delays), so
//! two seconds see about ten failed accepts, not the hundreds of thousands of a loop that
//! retries at once. Once descriptors are free again it serves.
//!
//! Its own test binary: the descriptor limit is the whole process's.

use std::io::Write;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kubeloop::ops::{CheckFn, OpsServer, ServeConfig};
use kubeloop_testenv::ManagedProcess;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Log lines, kept in memory (writing them needs no descriptor).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn accept_failures(&self) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .matches("accept failed")
            .count()
    }
}

fn nofile() -> libc::rlimit {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    assert_eq!(rc, 0);
    limit
}

fn set_nofile(limit: libc::rlimit) {
    // SAFETY: setrlimit reads the struct it is given.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);
}

async fn healthz(addr: std::net::SocketAddr) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.unwrap();
    raw[9..12].parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accept_errors_back_off_instead_of_spinning_and_serving_resumes() {
    let captured = Captured::default();
    let sink = captured.clone();
    tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .init();

    let stop = tokio_util::sync::CancellationToken::new();
    let config = ServeConfig {
        healthz: vec![Arc::new(CheckFn::new("ping", || Ok(())))],
        ..Default::default()
    };
    let server = OpsServer::start("127.0.0.1:0".parse().unwrap(), config, stop.clone())
        .await
        .unwrap();
    assert_eq!(healthz(server.addr()).await, 200);

    // A client in another process that connects when told (SIGUSR1): its connect needs no
    // descriptor of ours, so it can queue in the backlog while we have none left.
    let port = server.addr().port();
    let mut command = Command::new("bash");
    command.arg("-c").arg(format!(
        "trap 'exec 3<>/dev/tcp/127.0.0.1/{port}' USR1; while :; do sleep 0.1; done"
    ));
    let client = ManagedProcess::start_temp_log("client", command).expect("starting bash");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Every descriptor up to a lowered limit taken.
    let saved = nofile();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    set_nofile(libc::rlimit {
        rlim_cur: open + 16,
        rlim_max: saved.rlim_max,
    });
    let mut fillers = Vec::new();
    while let Ok(file) = std::fs::File::open("/dev/null") {
        fillers.push(file);
    }
    assert!(!fillers.is_empty());

    client.signal(libc::SIGUSR1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = captured.accept_failures();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let in_two_seconds = captured.accept_failures() - before;

    drop(fillers);
    set_nofile(saved);
    let answered = tokio::time::timeout(Duration::from_secs(10), healthz(server.addr())).await;
    drop(client);
    stop.cancel();

    eprintln!("failed accepts in 2 s at EMFILE: {in_two_seconds}");
    assert!(
        in_two_seconds >= 1,
        "the pending connection met EMFILE (log: {})",
        String::from_utf8_lossy(&captured.0.lock().unwrap())
    );
    assert!(
        in_two_seconds <= 20,
        "{in_two_seconds} failed accepts in 2 s: the loop is not backing off (5 ms doubling to 1 s \
         allows about 10)"
    );
    assert_eq!(
        answered.expect("served again once descriptors are free"),
        200
    );
}
