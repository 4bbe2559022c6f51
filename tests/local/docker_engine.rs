//! The Docker-API engine the VM controller's docker driver uses: podman serving the Docker
//! API (hack/setup-podman), reached through bollard at $DOCKER_HOST (default: the socket
//! hack/setup-podman uses), running the image built from busybox-static.

use std::time::Duration;

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, RemoveContainerOptionsBuilder,
    StatsOptionsBuilder, StopContainerOptionsBuilder,
};
use futures::StreamExt;

const DEFAULT_SOCKET: &str = "unix:///run/kubeloop/podman.sock";
const IMAGE: &str = "localhost/kubeloop/vm-busybox:latest";

fn docker() -> Docker {
    let host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| DEFAULT_SOCKET.to_owned());
    Docker::connect_with_host(&host).unwrap_or_else(|e| {
        panic!("connecting to the Docker API at {host}: {e} (run hack/setup-podman)")
    })
}

#[tokio::test]
async fn container_with_limits_starts_reports_stats_and_is_removed() {
    let docker = docker();
    let version = docker
        .version()
        .await
        .expect("the engine answers /version (run hack/setup-podman)");
    assert!(version.api_version.is_some(), "{version:?}");

    let name = format!("kubeloop-engine-test-{}", std::process::id());
    let body = ContainerCreateBody {
        image: Some(IMAGE.to_owned()),
        host_config: Some(HostConfig {
            memory: Some(64 * 1024 * 1024),
            nano_cpus: Some(500_000_000),
            ..HostConfig::default()
        }),
        ..ContainerCreateBody::default()
    };
    let created = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::new().name(&name).build()),
            body,
        )
        .await
        .expect("creating the container");
    docker
        .start_container(&name, None)
        .await
        .expect("starting the container");

    let inspected = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await
        .unwrap();
    assert_eq!(inspected.id.as_deref(), Some(created.id.as_str()));
    assert_eq!(inspected.state.as_ref().and_then(|s| s.running), Some(true));
    let host_config = inspected.host_config.unwrap();
    assert_eq!(host_config.memory, Some(64 * 1024 * 1024));
    assert_eq!(host_config.nano_cpus, Some(500_000_000));

    // One stats sample: the fields the VM driver's CPU% and memory% formulas read.
    let stats = tokio::time::timeout(
        Duration::from_secs(30),
        docker
            .stats(
                &name,
                Some(StatsOptionsBuilder::new().stream(false).build()),
            )
            .next(),
    )
    .await
    .expect("stats within 30 s")
    .expect("one stats sample")
    .expect("stats succeed");
    let cpu = stats.cpu_stats.expect("cpu_stats");
    assert!(
        cpu.cpu_usage.and_then(|u| u.total_usage).is_some(),
        "cpu_stats.cpu_usage.total_usage"
    );
    assert!(cpu.online_cpus.unwrap_or(0) >= 1, "online_cpus");
    let memory = stats.memory_stats.expect("memory_stats");
    assert!(
        memory.usage.unwrap_or(0) > 0,
        "memory usage of a running httpd"
    );
    assert_eq!(
        memory.limit,
        Some(64 * 1024 * 1024),
        "the limit is the container's memory limit"
    );

    docker
        .stop_container(&name, Some(StopContainerOptionsBuilder::new().t(1).build()))
        .await
        .expect("stopping");
    docker
        .remove_container(
            &name,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await
        .expect("removing");
    let gone = docker
        .inspect_container(&name, None::<InspectContainerOptions>)
        .await;
    match gone {
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => {}
        other => panic!("the container should be gone (404), got {other:?}"),
    }
}
