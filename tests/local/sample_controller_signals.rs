//! `kubeloop sample-controller`'s signal handling when the drain cannot finish: the first
//! SIGTERM starts a graceful shutdown that waits for the in-flight sync, a second one exits at
//! once with status 1 (client-go's `SetupSignalHandler`).
//!
//! A sync that never finishes needs an API call that never answers, which the real apiserver
//! does not provide on demand; so this test serves the binary a stand-in HTTP endpoint whose
//! lists and watches are well-formed and whose Deployment create never answers. It claims
//! nothing about apiserver behaviour (tests/sample_controller.rs does that against the real
//! control plane), only about the process's reaction to signals.

// `foo` is the resource under test, not a placeholder name.
#![allow(clippy::disallowed_names)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kubeloop_testenv::Kubeloop;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const FOO_LIST: &str = r#"{"apiVersion":"samplecontroller.k8s.io/v1alpha1","kind":"FooList","metadata":{"resourceVersion":"10"},"items":[{"apiVersion":"samplecontroller.k8s.io/v1alpha1","kind":"Foo","metadata":{"name":"hang","namespace":"default","uid":"u-1","resourceVersion":"9"},"spec":{"deploymentName":"hang-web","replicas":1}}]}"#;
const DEPLOYMENT_LIST: &str = r#"{"apiVersion":"apps/v1","kind":"DeploymentList","metadata":{"resourceVersion":"10"},"items":[]}"#;

/// Answers lists, holds watches open, never answers a Deployment create (and flags it).
async fn serve(listener: TcpListener, create_seen: Arc<AtomicBool>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            return;
        };
        let create_seen = create_seen.clone();
        tokio::spawn(handle(stream, create_seen));
    }
}

async fn handle(mut stream: TcpStream, create_seen: Arc<AtomicBool>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut first = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (first.next().unwrap_or(""), first.next().unwrap_or(""));
    let watch = target.contains("watch=true") || target.contains("watch=1");
    let body = match (method, watch) {
        // A streaming list (client-go 1.36's default, and kubeloop's): answered as an apiserver
        // without the WatchList feature answers it, so the informer falls back to a LIST.
        ("GET", true) if target.contains("sendInitialEvents=true") => {
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Invalid","message":"sendInitialEvents is not supported","code":422}"#
        }
        ("GET", true) => {
            // A watch that stays open with no events.
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
                .await;
            std::future::pending::<()>().await;
            return;
        }
        ("GET", false) if target.starts_with("/apis/samplecontroller.k8s.io/v1alpha1/foos") => {
            FOO_LIST
        }
        ("GET", false) if target.starts_with("/apis/apps/v1/deployments") => DEPLOYMENT_LIST,
        ("POST", _) => {
            if target.contains("/deployments") {
                create_seen.store(true, Ordering::SeqCst);
            }
            std::future::pending::<()>().await;
            return;
        }
        _ => {
            r#"{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}"#
        }
    };
    let status = if body.contains("\"code\":404") {
        "404 Not Found"
    } else if body.contains("\"code\":422") {
        "422 Unprocessable Entity"
    } else {
        "200 OK"
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
}

#[tokio::test]
async fn a_second_sigterm_exits_at_once_while_the_first_waits_for_a_hung_sync() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let create_seen = Arc::new(AtomicBool::new(false));
    tokio::spawn(serve(listener, create_seen.clone()));

    let mut child =
        Kubeloop::new(["sample-controller", "--master", &format!("http://{addr}")]).start();

    kubeloop::testing::eventually(
        "the controller trying to create the Deployment",
        Duration::from_secs(30),
        || async { create_seen.load(Ordering::SeqCst) },
    )
    .await;

    child.signal(libc::SIGTERM);
    // The sync is stuck in the create: the graceful shutdown waits for it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        child.exited().is_none(),
        "the first SIGTERM waits for the in-flight sync"
    );

    child.signal(libc::SIGTERM);
    // The second SIGTERM ends the process.
    let status = child.wait(Duration::from_secs(10)).await;
    let stderr = child.log();
    assert_eq!(
        status.code(),
        Some(1),
        "exit status 1 after the second signal; stderr:\n{stderr}"
    );
    assert!(stderr.contains("shutting down"), "stderr:\n{stderr}");
    assert!(
        stderr.contains("received SIGTERM again, exiting at once"),
        "stderr:\n{stderr}"
    );
}
