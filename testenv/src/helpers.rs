//! The helpers every real-cluster test uses besides [`eventually`] (which lives in
//! [`kubeloop::testing`], for unit tests too): [`Cluster::kubectl`] (the cluster's own kubectl
//! with its admin kubeconfig), [`ensure_crd`] (a CRD created once and served) and
//! [`scrape_metrics`] (the status of a scrape of an ops server's HTTPS /metrics).
//!
//! They panic instead of returning errors: they are for tests, where a panic with a message is
//! the failure report.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_client::Client;
use kube_client::api::{Api, ListParams, PostParams};
use kube_client::core::{ApiResource, DynamicObject, GroupVersionKind};

use super::Cluster;
use kubeloop::testing::eventually;

/// Creates `crd` unless it exists (tests sharing a cluster race harmlessly) and waits until it
/// is Established and its first version answers a LIST (a CRD can be Established a moment
/// before its resource is served).
pub async fn ensure_crd(client: &Client, crd: &CustomResourceDefinition) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    match crds.create(&PostParams::default(), crd).await {
        Ok(_) => {}
        Err(kube_client::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("creating the CRD {name}: {e}"),
    }
    let spec = &crd.spec;
    let gvk = GroupVersionKind::gvk(&spec.group, &spec.versions[0].name, &spec.names.kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, &spec.names.plural);
    eventually(
        &format!("the CRD {name} to be Established and served"),
        Duration::from_secs(60),
        || async {
            let established = crds
                .get(&name)
                .await
                .map_err(|e| e.to_string())?
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if !established {
                return Err("not established".to_string());
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            api.list(&ListParams::default().limit(1))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

/// What one kubectl run gave.
#[derive(Debug, Clone)]
pub struct Kubectl {
    /// The arguments, for messages.
    pub args: Vec<String>,
    /// Whether it exited 0.
    pub success: bool,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl Kubectl {
    /// The standard output; panics with the arguments and stderr unless kubectl succeeded.
    pub fn ok(self) -> String {
        assert!(
            self.success,
            "kubectl {} failed: {}{}",
            self.args.join(" "),
            self.stderr,
            self.stdout
        );
        self.stdout
    }

    /// `Ok(stdout)` or `Err(stderr)`, for [`eventually`].
    pub fn result(self) -> Result<String, String> {
        if self.success {
            Ok(self.stdout)
        } else {
            Err(format!("kubectl {}: {}", self.args.join(" "), self.stderr))
        }
    }
}

impl Cluster {
    /// Runs the cluster's kubectl (from the control plane's bin directory) with the admin
    /// kubeconfig, in the repository's root directory (so `-f crds/foo.yaml` works). Never panics
    /// on kubectl's failure: see [`Kubectl::ok`].
    pub fn kubectl(&self, args: &[&str]) -> Kubectl {
        self.kubectl_stdin(args, None)
    }

    /// [`Cluster::kubectl`] with `stdin` fed to kubectl (`apply -f -`).
    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Kubectl {
        self.run_kubectl(self.kubeconfig_path(), args, stdin)
    }

    /// [`Cluster::kubectl`] as the user of `kubeconfig` (a ServiceAccount's token, say)
    /// instead of the admin.
    pub fn kubectl_as(&self, kubeconfig: &Path, args: &[&str]) -> Kubectl {
        self.run_kubectl(kubeconfig, args, None)
    }

    fn run_kubectl(&self, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> Kubectl {
        let mut child = Command::new(self.bin_dir().join("kubectl"))
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .args(args)
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running {}/kubectl: {e}", self.bin_dir().display()));
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(text.as_bytes())
                .expect("writing kubectl's stdin");
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().expect("waiting for kubectl");
        Kubectl {
            args: args.iter().map(|a| a.to_string()).collect(),
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

/// `curl` of `https://<addr>/metrics` (a kubeloop ops server's self-signed certificate, so
/// `-k`), with `token` as a Bearer token if given: the HTTP status (0 if none came back).
pub fn scrape_metrics(addr: &str, token: Option<&str>) -> u16 {
    let mut curl = Command::new("curl");
    curl.args([
        "-sk",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "10",
    ]);
    if let Some(token) = token {
        curl.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let out = curl
        .arg(format!("https://{addr}/metrics"))
        .output()
        .expect("running curl");
    String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
}
