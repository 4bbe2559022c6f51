//! The Docker-API driver (controller101's `pkg/driver/docker.go`), through bollard, against
//! Docker or podman's Docker-compatible service (hack/setup-podman).
//!
//! Differences from controller101 on purpose:
//! - `NanoCpus = millicores * 1e6` (= cores * 1e9); controller101 passed the core count, so one
//!   core became one nanoCPU. `Memory` is the byte count of the quantity.
//! - Lookups are by exact name: `inspect` of the name, and the answer's name must be that name
//!   (controller101 listed containers with a `name` filter, which matches substrings, so VM
//!   `web` found `web2`'s container).
//! - Deleting a missing container (404) succeeds; creating a container whose name is taken
//!   adopts it (and starts it if it is not running) only if its `kubeloop.dev/vm-uid` label is
//!   the VM's uid. A delete inspects the container, checks that label and removes it by the id
//!   it found, so a container re-created under the same name in between is never the one
//!   removed.
//! - Errors are typed: a transport failure is [`DriverError::Unreachable`] naming the engine's
//!   address, so the VM's reason says which engine is down.
//!
//! Usage comes from one stats call per refresh, as `docker stats` computes it: CPU% =
//! cpu_delta / system_delta * online_cpus * 100 between this sample and the previous one the
//! driver kept for that container (so over the refresh interval; podman leaves
//! `precpu_stats` empty, and a filled one, as Docker's, is used when there is no previous
//! sample); Mem% = (usage - inactive file cache) / limit * 100. The first refresh of a
//! container with neither reports CPU 0; no second call, no sleep.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use bollard::Docker;
use bollard::errors::Error as BollardError;
use bollard::models::{
    ContainerCpuStats, ContainerCreateBody, ContainerInspectResponse, ContainerStatsResponse,
    HostConfig,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, InspectContainerOptions, ListContainersOptionsBuilder,
    RemoveContainerOptionsBuilder, StatsOptionsBuilder,
};
use futures::StreamExt;
use k8s_openapi::jiff::Timestamp;

use super::{
    Created, DEFAULT_MANAGED_BY, DeleteOutcome, Driver, DriverError, DriverServerStatus,
    ManagedServer, ServerSpec, labels_for,
};
use super::{LABEL_MANAGED_BY, LABEL_NAME, LABEL_NAMESPACE, LABEL_UID};

/// Socket hack/setup-podman serves the Docker API on.
pub const DEFAULT_DOCKER_HOST: &str = "unix:///run/kubeloop/podman.sock";
/// The image hack/setup-podman builds (busybox-static running `httpd`).
pub const DEFAULT_IMAGE: &str = "localhost/kubeloop/vm-busybox:latest";

/// How to reach the engine and what to run.
#[derive(Clone, Debug)]
pub struct DockerDriverConfig {
    /// `unix:///path`, `tcp://host:port`, ... (bollard's `connect_with_host`).
    pub host: String,
    /// The image every VM's container runs ([`DEFAULT_IMAGE`]).
    pub image: String,
    /// Per-request timeout; a hung engine must not hold a worker forever.
    pub timeout: Duration,
    /// The value of the `kubeloop.dev/managed-by` label this driver puts on its containers and
    /// lists by (see [`super::LABEL_MANAGED_BY`]).
    pub managed_by: String,
}

impl Default for DockerDriverConfig {
    fn default() -> Self {
        Self {
            host: DEFAULT_DOCKER_HOST.to_string(),
            image: DEFAULT_IMAGE.to_string(),
            timeout: Duration::from_secs(30),
            managed_by: DEFAULT_MANAGED_BY.to_string(),
        }
    }
}

impl DockerDriverConfig {
    /// `$DOCKER_HOST` if set, else [`DEFAULT_DOCKER_HOST`].
    pub fn from_env() -> Self {
        let host = std::env::var("DOCKER_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| DEFAULT_DOCKER_HOST.to_string());
        Self {
            host,
            ..Self::default()
        }
    }
}

/// The driver. Connecting is lazy: an engine that is down (even one whose socket file does not
/// exist yet, which bollard refuses at connect time) fails the calls, not the constructor, so
/// the controller starts and reports the outage on the VMs.
#[derive(Clone)]
pub struct DockerDriver {
    /// The client once connected; bollard opens a new connection per request on unix sockets,
    /// so a client stays valid across engine restarts.
    docker: Arc<Mutex<Option<Docker>>>,
    config: DockerDriverConfig,
    engine: String,
    /// The last CPU sample of each container, by name, with the container's id (a container
    /// re-created under the name starts afresh). Entries go when the driver deletes the
    /// container; the map holds at most one entry per container the driver ever refreshed.
    samples: Arc<Mutex<HashMap<String, (String, ContainerCpuStats)>>>,
}

impl DockerDriver {
    /// A driver for `config.host` (not contacted until the first call).
    pub fn new(config: DockerDriverConfig) -> Self {
        let engine = format!("docker engine at {}", config.host);
        Self {
            docker: Arc::default(),
            config,
            engine,
            samples: Arc::default(),
        }
    }

    fn client(&self) -> Result<Docker, DriverError> {
        let mut slot = self.docker.lock();
        if let Some(docker) = slot.as_ref() {
            return Ok(docker.clone());
        }
        let docker = Docker::connect_with_host(&self.config.host)
            .map_err(|e| DriverError::Unreachable {
                engine: self.engine.clone(),
                message: e.to_string(),
            })?
            .with_timeout(self.config.timeout);
        *slot = Some(docker.clone());
        Ok(docker)
    }

    fn error(&self, operation: &'static str, server: &str, error: BollardError) -> DriverError {
        match error {
            BollardError::DockerResponseServerError {
                status_code,
                message,
            } if refuses_spec(operation, status_code, &message) => DriverError::Refused {
                engine: self.engine.clone(),
                operation,
                server: server.to_string(),
                message: format!("{status_code}: {}", message.trim()),
            },
            BollardError::DockerResponseServerError {
                status_code,
                message,
            } => DriverError::Engine {
                engine: self.engine.clone(),
                operation,
                server: server.to_string(),
                message: format!("{status_code}: {}", message.trim()),
            },
            // The engine answered, but not in a form the Docker API defines.
            undecodable @ (BollardError::JsonDataError { .. }
            | BollardError::JsonSerdeError { .. }) => DriverError::Engine {
                engine: self.engine.clone(),
                operation,
                server: server.to_string(),
                message: format!("its answer does not decode: {}", with_sources(&undecodable)),
            },
            other => DriverError::Unreachable {
                engine: self.engine.clone(),
                message: with_sources(&other),
            },
        }
    }

    /// The container named exactly `name`, or `None`.
    async fn inspect(&self, name: &str) -> Result<Option<ContainerInspectResponse>, DriverError> {
        self.inspect_exact(name, false).await
    }

    /// The container named exactly `target` or (with `or_id`) whose full id is `target`.
    async fn inspect_exact(
        &self,
        target: &str,
        or_id: bool,
    ) -> Result<Option<ContainerInspectResponse>, DriverError> {
        let client = self.client()?;
        let answer = asked_again_while_stopping(|| {
            client.inspect_container(target, None::<InspectContainerOptions>)
        })
        .await;
        match answer {
            Ok(found) => {
                // The engine also resolves id prefixes and names of other containers by prefix;
                // only an exact name (or full id) counts.
                let found_name = found.name.as_deref().unwrap_or("").trim_start_matches('/');
                let exact = found_name == target || (or_id && found.id.as_deref() == Some(target));
                Ok(exact.then_some(found))
            }
            Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(None),
            Err(e) => Err(self.error("inspect", target, e)),
        }
    }

    async fn start(&self, name: &str) -> Result<(), DriverError> {
        match self.client()?.start_container(name, None).await {
            // 304: already running.
            Ok(())
            | Err(BollardError::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(e) => Err(self.error("start", name, e)),
        }
    }

    async fn one_sample(&self, name: &str) -> Result<Option<ContainerStatsResponse>, DriverError> {
        let options = StatsOptionsBuilder::new().stream(false).build();
        match self.client()?.stats(name, Some(options)).next().await {
            None => Ok(None),
            Some(Ok(stats)) => Ok(Some(stats)),
            Some(Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            })) => Ok(None),
            Some(Err(e)) => Err(self.error("read stats of", name, e)),
        }
    }

    /// (CPU%, Mem%) of a running container, from one stats call and the previous sample.
    async fn usage(&self, name: &str) -> Result<(f64, f64), DriverError> {
        let Some(sample) = self.one_sample(name).await? else {
            return Ok((0.0, 0.0));
        };
        let memory = memory_percent(&sample);
        let id = sample.id.clone().unwrap_or_default();
        let Some(now) = sample.cpu_stats.clone() else {
            return Ok((0.0, memory));
        };
        let previous = {
            let mut samples = self.samples.lock();
            let previous = samples
                .get(name)
                .filter(|(prev_id, _)| *prev_id == id)
                .map(|(_, cpu)| cpu.clone());
            samples.insert(name.to_string(), (id, now.clone()));
            previous
        };
        let precpu_filled = sample
            .precpu_stats
            .as_ref()
            .and_then(|p| p.system_cpu_usage)
            .unwrap_or(0)
            > 0;
        let cpu = match previous {
            Some(previous) => cpu_percent(Some(&previous), Some(&now)),
            None if precpu_filled => cpu_percent(sample.precpu_stats.as_ref(), Some(&now)),
            None => 0.0,
        };
        Ok((cpu, memory))
    }
}

/// True if the engine says the container runs.
fn is_running(found: &ContainerInspectResponse) -> bool {
    found
        .state
        .as_ref()
        .and_then(|s| s.running)
        .unwrap_or(false)
}

/// The container's `kubeloop.dev/vm-uid` label.
fn uid_label(found: &ContainerInspectResponse) -> Option<String> {
    found
        .config
        .as_ref()
        .and_then(|c| c.labels.as_ref())
        .and_then(|l| l.get(LABEL_UID))
        .cloned()
}

/// The error and its causes, `outer: inner: innermost` (bollard's transport errors say
/// "client error (Connect)" and keep "Connection refused" in their sources).
fn with_sources(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// CPU% between two samples: cpu_delta / system_delta * online_cpus * 100.
pub(crate) fn cpu_percent(
    before: Option<&ContainerCpuStats>,
    after: Option<&ContainerCpuStats>,
) -> f64 {
    let (Some(before), Some(after)) = (before, after) else {
        return 0.0;
    };
    let total = |s: &ContainerCpuStats| {
        s.cpu_usage
            .as_ref()
            .and_then(|u| u.total_usage)
            .unwrap_or(0)
    };
    let cpu_delta = total(after).saturating_sub(total(before)) as f64;
    let system_delta = after
        .system_cpu_usage
        .unwrap_or(0)
        .saturating_sub(before.system_cpu_usage.unwrap_or(0)) as f64;
    let online = after
        .online_cpus
        .filter(|n| *n > 0)
        .map(f64::from)
        .or_else(|| {
            after
                .cpu_usage
                .as_ref()
                .and_then(|u| u.percpu_usage.as_ref())
                .map(|p| p.len() as f64)
        })
        .unwrap_or(1.0);
    if system_delta <= 0.0 || cpu_delta <= 0.0 {
        return 0.0;
    }
    cpu_delta / system_delta * online * 100.0
}

/// Mem% as `docker stats` shows it: (usage - inactive file cache) / limit * 100 (0 without a
/// limit). The cache is `inactive_file` under cgroup v2, `total_inactive_file` under v1.
pub(crate) fn memory_percent(stats: &ContainerStatsResponse) -> f64 {
    let Some(memory) = stats.memory_stats.as_ref() else {
        return 0.0;
    };
    let cache = memory
        .stats
        .as_ref()
        .and_then(|s| {
            s.get("inactive_file")
                .or_else(|| s.get("total_inactive_file"))
        })
        .copied()
        .unwrap_or(0);
    match (memory.usage, memory.limit) {
        (Some(usage), Some(limit)) if limit > 0 => {
            usage.saturating_sub(cache) as f64 / limit as f64 * 100.0
        }
        _ => 0.0,
    }
}

impl Driver for DockerDriver {
    fn engine(&self) -> &str {
        &self.engine
    }

    async fn create_server(&self, spec: &ServerSpec) -> Result<Created, DriverError> {
        let labels: HashMap<String, String> = labels_for(spec, &self.config.managed_by)
            .into_iter()
            .collect();
        let nano_cpus = i64::try_from(spec.cpu_millis)
            .ok()
            .and_then(|m| m.checked_mul(1_000_000));
        let memory = i64::try_from(spec.memory_bytes).ok();
        // quantity.rs refuses such a spec before any driver sees it; said again here because
        // retrying a spec the API cannot represent never helps.
        let (Some(nano_cpus), Some(memory)) = (nano_cpus, memory) else {
            return Err(DriverError::Refused {
                engine: self.engine.clone(),
                operation: "create",
                server: spec.name.clone(),
                message: "cpu or memory does not fit the Docker API's 64-bit fields".into(),
            });
        };
        let body = ContainerCreateBody {
            image: Some(self.config.image.clone()),
            labels: Some(labels),
            host_config: Some(HostConfig {
                memory: Some(memory),
                nano_cpus: Some(nano_cpus),
                ..HostConfig::default()
            }),
            ..ContainerCreateBody::default()
        };
        let options = CreateContainerOptionsBuilder::new()
            .name(&spec.name)
            .build();
        let mut evicted = false;
        let adopted = loop {
            let err = match self
                .client()?
                .create_container(Some(options.clone()), body.clone())
                .await
            {
                Ok(_) => break false,
                Err(e) => e,
            };
            if !name_in_use(&err) {
                return Err(self.error("create", &spec.name, err));
            }
            // The name is taken: a container from an earlier attempt or controller, which is
            // adopted only if it carries this VM's uid.
            if let Some(found) = self.inspect(&spec.name).await? {
                let found_uid = uid_label(&found);
                if found_uid.as_deref() != Some(spec.vm_uid.as_str()) {
                    return Err(DriverError::NameTaken {
                        engine: self.engine.clone(),
                        server: spec.name.clone(),
                        id: found.id.unwrap_or_default(),
                        wanted_uid: spec.vm_uid.clone(),
                        found_uid,
                    });
                }
                tracing::info!(server = %spec.name, "server already exists; adopting it");
                break true;
            }
            // Taken by nothing the engine lists: podman's storage keeps the name of a create
            // that was cut off half way (its client killed mid-request) until that storage
            // container is evicted, which a forced remove by name does. Once, then retry.
            if evicted {
                return Err(self.error("create", &spec.name, err));
            }
            tracing::warn!(server = %spec.name, error = %err, "the name is held by a container the engine does not list; evicting it");
            let force = RemoveContainerOptionsBuilder::new().force(true).build();
            match self
                .client()?
                .remove_container(&spec.name, Some(force))
                .await
            {
                Ok(())
                | Err(BollardError::DockerResponseServerError {
                    status_code: 404, ..
                }) => {}
                Err(e) => return Err(self.error("create", &spec.name, e)),
            }
            evicted = true;
        };
        self.start(&spec.name).await?;
        match self.server_status(&spec.name).await? {
            Some(status) => Ok(Created { status, adopted }),
            None => Err(DriverError::Engine {
                engine: self.engine.clone(),
                operation: "create",
                server: spec.name.clone(),
                message: "the container disappeared right after it was started".into(),
            }),
        }
    }

    async fn delete_server(
        &self,
        name_or_id: &str,
        uid: &str,
    ) -> Result<DeleteOutcome, DriverError> {
        let Some(found) = self.inspect_exact(name_or_id, true).await? else {
            return Ok(DeleteOutcome::Absent);
        };
        let found_uid = uid_label(&found);
        let id = found.id.unwrap_or_default();
        if found_uid.as_deref() != Some(uid) {
            return Ok(DeleteOutcome::NotOwned { id, found_uid });
        }
        let options = RemoveContainerOptionsBuilder::new().force(true).build();
        self.samples.lock().retain(|_, (sampled, _)| *sampled != id);
        match self.client()?.remove_container(&id, Some(options)).await {
            Ok(()) => Ok(DeleteOutcome::Deleted { id }),
            Err(BollardError::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(DeleteOutcome::Absent),
            Err(e) => Err(self.error("delete", name_or_id, e)),
        }
    }

    async fn list_servers(&self) -> Result<Vec<ManagedServer>, DriverError> {
        let filter = format!("{LABEL_MANAGED_BY}={}", self.config.managed_by);
        let options = ListContainersOptionsBuilder::new()
            .all(true)
            .filters(&HashMap::from([("label", vec![filter.clone()])]))
            .build();
        let client = self.client()?;
        let listed = asked_again_while_stopping(|| client.list_containers(Some(options.clone())))
            .await
            .map_err(|e| self.error("list", &format!("labelled {filter}"), e))?;
        Ok(listed
            .into_iter()
            .filter_map(|c| {
                let labels = c.labels.unwrap_or_default();
                let name = c.names?.first()?.trim_start_matches('/').to_string();
                Some(ManagedServer {
                    id: c.id?,
                    name,
                    vm_namespace: labels.get(LABEL_NAMESPACE).cloned(),
                    vm_name: labels.get(LABEL_NAME).cloned(),
                    vm_uid: labels.get(LABEL_UID).cloned(),
                })
            })
            .collect())
    }

    async fn server_exists(&self, name: &str) -> Result<bool, DriverError> {
        Ok(self.inspect(name).await?.is_some())
    }

    async fn server_status(&self, name: &str) -> Result<Option<DriverServerStatus>, DriverError> {
        let Some(mut found) = self.inspect(name).await? else {
            return Ok(None);
        };
        let mut usage = (0.0, 0.0);
        if is_running(&found) {
            match self.usage(name).await {
                Ok(sampled) => usage = sampled,
                // A container that stops between the inspect and the stats call makes the
                // stats call fail (podman: 500 with no message): report it stopped, as a
                // second look shows it.
                Err(e) => match self.inspect(name).await? {
                    None => return Ok(None),
                    Some(again) if !is_running(&again) => found = again,
                    Some(_) => return Err(e),
                },
            }
        }
        let (cpu_percent, memory_percent) = usage;
        let state = found.state.as_ref();
        let running = is_running(&found);
        let state_name = state
            .and_then(|s| s.status)
            .map(|s| s.to_string())
            .unwrap_or_default();
        let vm_uid = uid_label(&found);
        let started_at = state.and_then(|s| engine_time(s.started_at.as_deref()));
        let finished_at = state
            .filter(|_| !running)
            .and_then(|s| engine_time(s.finished_at.as_deref()));
        let exit_code = finished_at.and(state.and_then(|s| s.exit_code));
        let limits = found.host_config.as_ref();
        let nano_cpus = limits.and_then(|h| h.nano_cpus).unwrap_or(0);
        let memory = limits.and_then(|h| h.memory).unwrap_or(0);
        Ok(Some(DriverServerStatus {
            id: found.id.unwrap_or_default(),
            state: state_name,
            running,
            cpu_percent,
            memory_percent,
            cpu_millis: u64::try_from(nano_cpus / 1_000_000).unwrap_or(0),
            memory_bytes: u64::try_from(memory).unwrap_or(0),
            vm_uid,
            started_at,
            finished_at,
            exit_code,
            accelerator: None,
        }))
    }
}

/// An engine timestamp (RFC 3339); `None` for the zero time (`0001-01-01T00:00:00Z`, "never")
/// or one that does not parse.
fn engine_time(text: Option<&str>) -> Option<Timestamp> {
    let at: Timestamp = text?.parse().ok()?;
    (at.as_second() > 0).then_some(at)
}

/// True if the engine's answer to `operation` says the container's spec cannot run, which the
/// same spec retried will not change: a create answered 404 (the image is missing: podman
/// "no such image", Docker "No such image") or 400 (the body is refused), and a start the OCI
/// runtime refused (podman: "unable to set memory limit to 1048576 (current usage ...)" for a
/// limit below what the process needs). Everything else (5xx of a busy or broken engine) may
/// pass and is retried with backoff.
fn refuses_spec(operation: &str, status_code: u16, message: &str) -> bool {
    match (operation, status_code) {
        ("create", 400 | 404) => true,
        ("start", 400) => true,
        ("start", 500) => message.contains("OCI runtime") || message.contains("cgroup"),
        _ => false,
    }
}

/// Docker answers a taken name with 409; podman 4 also with 500 "... is already in use" when
/// the name is held in its container storage.
fn name_in_use(err: &BollardError) -> bool {
    match err {
        BollardError::DockerResponseServerError {
            status_code: 409, ..
        } => true,
        BollardError::DockerResponseServerError {
            status_code: 500,
            message,
        } => message.contains("already in use"),
        _ => false,
    }
}

/// Asks the engine again, a few times 100 ms apart, while its answer does not decode: podman
/// reports a container that has just exited as `stopped` for a moment (until its cleanup marks
/// it `exited`), a state the Docker API does not have, in an inspect and in a list alike.
async fn asked_again_while_stopping<T, F, Fut>(mut ask: F) -> Result<T, BollardError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, BollardError>>,
{
    let mut attempts = 0;
    loop {
        match ask().await {
            Err(BollardError::JsonDataError { .. } | BollardError::JsonSerdeError { .. })
                if attempts < 5 =>
            {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            answer => return answer,
        }
    }
}

#[cfg(test)]
mod tests {
    use bollard::models::{ContainerCpuUsage, ContainerMemoryStats};

    use super::*;

    #[test]
    fn a_taken_name_is_409_or_podmans_500_already_in_use_and_nothing_else() {
        let err = |status_code, message: &str| BollardError::DockerResponseServerError {
            status_code,
            message: message.to_string(),
        };
        assert!(name_in_use(&err(409, "Conflict")));
        assert!(name_in_use(&err(
            500,
            "creating container storage: the container name \"x\" is already in use by 6005bd"
        )));
        assert!(!name_in_use(&err(500, "no such image")));
        assert!(!name_in_use(&err(404, "already in use")));
    }

    fn cpu(total: u64, system: u64, online: u32) -> ContainerCpuStats {
        ContainerCpuStats {
            cpu_usage: Some(ContainerCpuUsage {
                total_usage: Some(total),
                ..Default::default()
            }),
            system_cpu_usage: Some(system),
            online_cpus: Some(online),
            ..Default::default()
        }
    }

    #[test]
    fn a_missing_image_or_limits_the_runtime_refuses_are_permanent_and_a_busy_engine_is_not() {
        assert!(refuses_spec(
            "create",
            404,
            "no such image: localhost/nope:latest: image not known"
        ));
        assert!(refuses_spec(
            "start",
            500,
            "runc: runc create failed: unable to start container process: error during container init: error setting cgroup config for procHooks process: unable to set memory limit to 1048576 (current usage: 2179072, peak usage: 2482176): OCI runtime error"
        ));
        assert!(!refuses_spec("start", 500, "database is locked"));
        assert!(!refuses_spec("create", 500, "database is locked"));
        assert!(!refuses_spec("inspect", 404, "no such container"));
    }

    #[test]
    fn the_engines_zero_time_means_never() {
        assert_eq!(engine_time(Some("0001-01-01T00:00:00Z")), None);
        assert_eq!(engine_time(None), None);
        assert_eq!(
            engine_time(Some("2026-11-22T10:00:00.123456789Z")).map(|t| t.as_second()),
            Some(1_795_341_600)
        );
    }

    #[test]
    fn cpu_percent_is_the_share_of_system_time_times_online_cpus() {
        // One of two cores busy for the whole interval: 100%.
        assert_eq!(
            cpu_percent(Some(&cpu(0, 0, 2)), Some(&cpu(1_000, 2_000, 2))),
            100.0
        );
        // A quarter of one core on four cores: 25%.
        assert_eq!(
            cpu_percent(Some(&cpu(100, 1_000, 4)), Some(&cpu(200, 2_600, 4))),
            25.0
        );
        // No system time passed (an empty precpu): 0, not NaN.
        assert_eq!(cpu_percent(Some(&cpu(0, 5, 1)), Some(&cpu(10, 5, 1))), 0.0);
        assert_eq!(cpu_percent(None, Some(&cpu(10, 5, 1))), 0.0);
    }

    #[test]
    fn memory_percent_is_usage_over_limit() {
        let stats = ContainerStatsResponse {
            memory_stats: Some(ContainerMemoryStats {
                usage: Some(1_000_000),
                limit: Some(4_000_000),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(memory_percent(&stats), 25.0);
        assert_eq!(memory_percent(&ContainerStatsResponse::default()), 0.0);
    }

    #[test]
    fn memory_percent_leaves_out_the_inactive_file_cache_as_docker_stats_does() {
        let with = |key: &str| ContainerStatsResponse {
            memory_stats: Some(ContainerMemoryStats {
                usage: Some(3_000_000),
                limit: Some(4_000_000),
                stats: Some(HashMap::from([(key.to_string(), 2_000_000)])),
                ..Default::default()
            }),
            ..Default::default()
        };
        // cgroup v2 and v1 names of the cache.
        assert_eq!(memory_percent(&with("inactive_file")), 25.0);
        assert_eq!(memory_percent(&with("total_inactive_file")), 25.0);
        assert_eq!(memory_percent(&with("active_file")), 75.0);
    }

    #[tokio::test]
    async fn an_engine_that_is_not_there_is_reported_as_unreachable_naming_its_address() {
        let driver = DockerDriver::new(DockerDriverConfig {
            host: "unix:///nonexistent/kubeloop-test.sock".into(),
            ..Default::default()
        });
        let err = driver.server_exists("x").await.unwrap_err();
        assert!(matches!(err, DriverError::Unreachable { .. }), "{err:?}");
        assert!(
            err.to_string()
                .contains("docker engine at unix:///nonexistent/kubeloop-test.sock"),
            "{err}"
        );
    }
}
