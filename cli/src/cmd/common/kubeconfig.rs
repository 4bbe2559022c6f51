//! `--kubeconfig` and `--master`: which cluster a controller talks to, found the way client-go
//! programs find it.
//!
//! Counterparts: client-go's `clientcmd` default loading rules for the order (what kubectl and
//! `clientcmd.NewNonInteractiveDeferredLoadingClientConfig` programs do: `$KUBECONFIG` or
//! `~/.kube/config`, falling back to the in-cluster configuration when neither gives one),
//! `clientcmd.BuildConfigFromFlags` for `--master`, and `ClientConfigLoadingRules` for
//! `$KUBECONFIG`. (controller-runtime's `config.GetConfig` tries in-cluster before
//! `~/.kube/config`; the issue that asked for this layer named the clientcmd order.)
//!
//! 1. `--kubeconfig PATH`: that file; it must exist and parse.
//! 2. `$KUBECONFIG`: a colon-separated list, merged with client-go's rules (the first file to
//!    set a value wins; kube-client's `Kubeconfig::merge` implements them). Files that do not
//!    exist are skipped as client-go skips them; a file that exists but does not parse is an
//!    error naming it.
//! 3. `--master URL` alone: that server and nothing else (no credentials), as
//!    `BuildConfigFromFlags(master, "")` gives.
//! 4. `~/.kube/config`, if it exists.
//! 5. The in-cluster configuration (service account token, `KUBERNETES_SERVICE_HOST`).
//!
//! With 1 or 2, `--master` replaces the server URL the kubeconfig names. `--kubeconfig=` and
//! `--master=` (empty) count as not given, as Go's `len(flag) > 0` checks do.
//!
//! What differs on purpose from kube-client's `Config::infer` (whose pieces this reuses): infer
//! fails on a missing `$KUBECONFIG` file, which client-go skips.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context;
use kube_client::config::{
    InClusterError, KubeConfigOptions, Kubeconfig, KubeconfigError as KubeError,
};
use kube_client::{Client, Config};

/// `--kubeconfig` and `--master`, shared by both controllers.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ClusterArgs {
    /// Path to a kubeconfig. Only required if out-of-cluster. Default: $KUBECONFIG (a
    /// colon-separated list, merged), else ~/.kube/config, else the in-cluster service account.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The address of the Kubernetes API server. Overrides any value in kubeconfig. Only
    /// required if out-of-cluster.
    #[arg(long, value_name = "URL")]
    pub master: Option<String>,
}

/// Where the configuration came from; logged at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigSource {
    /// `--kubeconfig`.
    Flag(PathBuf),
    /// `$KUBECONFIG`: the files that existed and were merged, in order.
    Env(Vec<PathBuf>),
    /// `--master` with no kubeconfig.
    MasterOnly,
    InCluster,
    /// `~/.kube/config`.
    Home(PathBuf),
}

/// Why no configuration could be loaded. Each names the file or flag at fault and says what
/// was wrong with it in its one message (no source chain to repeat it).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("kubeconfig {}: {}", path.display(), describe(problem))]
    Read { path: PathBuf, problem: KubeError },
    #[error("$KUBECONFIG={value:?}: merging {}: {}", path.display(), describe(problem))]
    Merge {
        value: String,
        path: PathBuf,
        problem: KubeError,
    },
    #[error("$KUBECONFIG={0:?} names no file that exists")]
    EnvNoFile(String),
    #[error("{what}: {}", describe(problem))]
    Load { what: String, problem: KubeError },
    #[error("--master {text:?} is not a URL: {problem}")]
    Master {
        text: String,
        problem: http::uri::InvalidUri,
    },
    #[error(
        "no cluster configuration: neither --kubeconfig, $KUBECONFIG nor --master is set, the in-cluster configuration is not available ({in_cluster}), and {} does not exist; pass --kubeconfig",
        home.as_deref().map_or_else(|| "~/.kube/config".to_string(), |h| h.display().to_string())
    )]
    Nothing {
        in_cluster: InClusterError,
        home: Option<PathBuf>,
    },
}

/// What the resolution reads from the process: kept apart so tests can give their own.
#[derive(Debug, Clone, Default)]
pub struct Environment {
    /// `$KUBECONFIG`, as set.
    pub kubeconfig: Option<OsString>,
    /// `~/.kube/config` (from `$HOME`).
    pub home_config: Option<PathBuf>,
}

impl Environment {
    pub fn from_process() -> Self {
        Self {
            kubeconfig: std::env::var_os("KUBECONFIG"),
            home_config: std::env::home_dir().map(|home| home.join(".kube").join("config")),
        }
    }
}

impl ClusterArgs {
    /// A client for the configuration [`ClusterArgs::resolve`] finds in this process's
    /// environment (logged with where it came from).
    pub async fn client(&self) -> anyhow::Result<Client> {
        let (config, source) = self
            .resolve(&Environment::from_process(), Config::incluster)
            .await?;
        tracing::info!(source = %source, server = %config.cluster_url, "cluster configuration");
        Client::try_from(config).context("building the Kubernetes client")
    }

    /// Finds the configuration in the order the module documentation gives. `in_cluster` is
    /// [`Config::incluster`] outside tests.
    pub async fn resolve(
        &self,
        env: &Environment,
        in_cluster: impl FnOnce() -> Result<Config, InClusterError>,
    ) -> Result<(Config, ConfigSource), ConfigError> {
        let master = self.master.as_deref().filter(|m| !m.is_empty());
        let master_url = master
            .map(|text| {
                text.parse::<http::Uri>()
                    .map_err(|problem| ConfigError::Master {
                        text: text.to_string(),
                        problem,
                    })
            })
            .transpose()?;
        let flag = self
            .kubeconfig
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty());
        let env_files = env
            .kubeconfig
            .as_ref()
            .map(|value| {
                std::env::split_paths(value)
                    .filter(|p| !p.as_os_str().is_empty())
                    .collect::<Vec<_>>()
            })
            .filter(|files| !files.is_empty());

        let (mut config, source) = if let Some(path) = flag {
            let kubeconfig = read(path)?;
            let what = format!("kubeconfig {}", path.display());
            (
                load(kubeconfig, what).await?,
                ConfigSource::Flag(path.to_owned()),
            )
        } else if let Some(files) = env_files {
            let value = env
                .kubeconfig
                .as_ref()
                .map(|v| v.to_string_lossy().into_owned())
                .unwrap_or_default();
            let (kubeconfig, merged) = read_env_list(&value, &files)?;
            let what = format!("kubeconfig from $KUBECONFIG={value:?}");
            (load(kubeconfig, what).await?, ConfigSource::Env(merged))
        } else if let Some(url) = &master_url {
            (Config::new(url.clone()), ConfigSource::MasterOnly)
        } else if let Some(path) = env.home_config.as_deref().filter(|p| p.exists()) {
            let kubeconfig = read(path)?;
            let what = format!("kubeconfig {}", path.display());
            (
                load(kubeconfig, what).await?,
                ConfigSource::Home(path.to_owned()),
            )
        } else {
            match in_cluster() {
                Ok(config) => (config, ConfigSource::InCluster),
                Err(in_cluster) => {
                    return Err(ConfigError::Nothing {
                        in_cluster,
                        home: env.home_config.clone(),
                    });
                }
            }
        };
        if let Some(url) = master_url {
            config.cluster_url = url;
        }
        Ok((config, source))
    }
}

impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Flag(path) => write!(f, "--kubeconfig {}", path.display()),
            Self::Env(paths) => {
                let paths: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
                write!(f, "$KUBECONFIG ({})", paths.join(":"))
            }
            Self::MasterOnly => write!(f, "--master"),
            Self::InCluster => write!(f, "in-cluster service account"),
            Self::Home(path) => write!(f, "{}", path.display()),
        }
    }
}

fn read(path: &Path) -> Result<Kubeconfig, ConfigError> {
    Kubeconfig::read_from(path).map_err(|problem| ConfigError::Read {
        path: path.to_owned(),
        problem,
    })
}

/// client-go's `ClientConfigLoadingRules.Load` over the `$KUBECONFIG` list: missing files are
/// skipped, every other file must parse, and the merge keeps the first value set.
fn read_env_list(
    value: &str,
    files: &[PathBuf],
) -> Result<(Kubeconfig, Vec<PathBuf>), ConfigError> {
    let mut merged: Option<Kubeconfig> = None;
    let mut used = Vec::new();
    for path in files {
        if let Err(e) = std::fs::metadata(path)
            && e.kind() == std::io::ErrorKind::NotFound
        {
            tracing::debug!(path = %path.display(), "$KUBECONFIG lists a file that does not exist; skipping it");
            continue;
        }
        let next = read(path)?;
        merged = Some(match merged {
            None => next,
            Some(so_far) => so_far.merge(next).map_err(|problem| ConfigError::Merge {
                value: value.to_string(),
                path: path.clone(),
                problem,
            })?,
        });
        used.push(path.clone());
    }
    match merged {
        Some(kubeconfig) => Ok((kubeconfig, used)),
        None => Err(ConfigError::EnvNoFile(value.to_string())),
    }
}

async fn load(kubeconfig: Kubeconfig, what: String) -> Result<Config, ConfigError> {
    Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|problem| ConfigError::Load { what, problem })
}

/// kube-client's messages, without the path it repeats (ours names the file already).
fn describe(error: &KubeError) -> String {
    match error {
        KubeError::ReadConfig(io, _) => io.to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
#[allow(unsafe_code)] // `std::env::set_var`, under ENV_LOCK.
mod tests {
    use super::*;

    fn kubeconfig_yaml(server: &str, context: &str) -> String {
        format!(
            r#"apiVersion: v1
kind: Config
clusters:
- name: {context}
  cluster:
    server: {server}
users:
- name: {context}
  user:
    token: token-{context}
contexts:
- name: {context}
  context:
    cluster: {context}
    user: {context}
    namespace: ns-{context}
current-context: {context}
"#
        )
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    fn not_in_cluster() -> Result<Config, InClusterError> {
        Err(InClusterError::ReadEnvironmentVariable(
            std::env::VarError::NotPresent,
        ))
    }

    fn in_cluster() -> Result<Config, InClusterError> {
        Ok(Config::new("https://10.96.0.1:443".parse().unwrap()))
    }

    fn args(kubeconfig: Option<&Path>, master: Option<&str>) -> ClusterArgs {
        ClusterArgs {
            kubeconfig: kubeconfig.map(Path::to_owned),
            master: master.map(str::to_string),
        }
    }

    fn env(kubeconfig: Option<String>, home: Option<&Path>) -> Environment {
        Environment {
            kubeconfig: kubeconfig.map(OsString::from),
            home_config: home.map(Path::to_owned),
        }
    }

    /// One directory with a kubeconfig per source, each naming its own server.
    struct Files {
        _dir: tempfile::TempDir,
        flag: PathBuf,
        env_a: PathBuf,
        env_b: PathBuf,
        home: PathBuf,
    }

    fn files() -> Files {
        let dir = tempfile::tempdir().unwrap();
        Files {
            flag: write(
                dir.path(),
                "flag",
                &kubeconfig_yaml("https://flag:6443", "flag"),
            ),
            env_a: write(dir.path(), "a", &kubeconfig_yaml("https://env-a:6443", "a")),
            env_b: write(dir.path(), "b", &kubeconfig_yaml("https://env-b:6443", "b")),
            home: write(
                dir.path(),
                "home",
                &kubeconfig_yaml("https://home:6443", "home"),
            ),
            _dir: dir,
        }
    }

    fn joined(paths: &[&Path]) -> String {
        std::env::join_paths(paths).unwrap().into_string().unwrap()
    }

    #[tokio::test]
    async fn the_order_is_flag_then_env_then_home_then_in_cluster() {
        let f = files();
        let all_env = env(Some(joined(&[&f.env_a])), Some(&f.home));

        let (config, source) = args(Some(&f.flag), None)
            .resolve(&all_env, in_cluster)
            .await
            .unwrap();
        assert_eq!(source, ConfigSource::Flag(f.flag.clone()));
        assert_eq!(config.cluster_url, "https://flag:6443/");

        let (config, source) = args(None, None)
            .resolve(&all_env, in_cluster)
            .await
            .unwrap();
        assert_eq!(source, ConfigSource::Env(vec![f.env_a.clone()]));
        assert_eq!(config.cluster_url, "https://env-a:6443/");
        assert_eq!(config.default_namespace, "ns-a");

        let no_env = env(None, Some(&f.home));
        let (config, source) = args(None, None).resolve(&no_env, in_cluster).await.unwrap();
        assert_eq!(source, ConfigSource::Home(f.home.clone()));
        assert_eq!(config.cluster_url, "https://home:6443/");

        let no_home = env(None, Some(&f.home.with_file_name("no-such-config")));
        let (config, source) = args(None, None)
            .resolve(&no_home, in_cluster)
            .await
            .unwrap();
        assert_eq!(source, ConfigSource::InCluster);
        assert_eq!(config.cluster_url, "https://10.96.0.1:443/");

        // An empty $KUBECONFIG and an empty --kubeconfig= count as unset.
        let empty = env(Some(String::new()), Some(&f.home));
        let (_, source) = args(Some(Path::new("")), None)
            .resolve(&empty, not_in_cluster)
            .await
            .unwrap();
        assert_eq!(source, ConfigSource::Home(f.home.clone()));
    }

    #[tokio::test]
    async fn kubeconfig_lists_merge_first_value_wins_and_skip_missing_files() {
        let f = files();
        let missing = f.flag.with_file_name("missing");
        let list = joined(&[&missing, &f.env_b, &f.env_a]);
        let (config, source) = args(None, None)
            .resolve(&env(Some(list), None), not_in_cluster)
            .await
            .unwrap();
        assert_eq!(
            source,
            ConfigSource::Env(vec![f.env_b.clone(), f.env_a.clone()])
        );
        // b came first, so its current-context (and so its server) wins.
        assert_eq!(config.cluster_url, "https://env-b:6443/");

        let err = args(None, None)
            .resolve(&env(Some(joined(&[&missing])), Some(&f.home)), in_cluster)
            .await
            .unwrap_err();
        assert!(matches!(err, ConfigError::EnvNoFile(_)), "{err}");
        assert!(err.to_string().contains(missing.to_str().unwrap()), "{err}");
    }

    #[tokio::test]
    async fn master_overrides_the_server_or_stands_alone_without_a_kubeconfig() {
        let f = files();
        let (config, source) = args(Some(&f.flag), Some("https://override:7443"))
            .resolve(&env(None, None), not_in_cluster)
            .await
            .unwrap();
        assert_eq!(source, ConfigSource::Flag(f.flag.clone()));
        assert_eq!(config.cluster_url, "https://override:7443/");
        assert_eq!(
            config.default_namespace, "ns-flag",
            "the rest of the kubeconfig stays"
        );

        let (config, source) = args(None, Some("http://127.0.0.1:8080"))
            .resolve(&env(None, Some(&f.home)), in_cluster)
            .await
            .unwrap();
        assert_eq!(source, ConfigSource::MasterOnly);
        assert_eq!(config.cluster_url, "http://127.0.0.1:8080/");

        let err = args(None, Some("not a url"))
            .resolve(&env(None, None), in_cluster)
            .await
            .unwrap_err();
        assert_eq!(
            err.to_string().split(" is not a URL").next(),
            Some("--master \"not a url\"")
        );
    }

    #[tokio::test]
    async fn a_bad_file_is_named_with_its_problem() {
        let f = files();
        let dir = f.flag.parent().unwrap();
        let garbage = write(dir, "garbage", "clusters: [this is: not a kubeconfig");
        let no_context = write(
            dir,
            "no-context",
            "apiVersion: v1\nkind: Config\nclusters: []\n",
        );
        let missing = dir.join("nope");

        let err = args(Some(&missing), None)
            .resolve(&env(None, None), in_cluster)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("kubeconfig {}: ", missing.display())),
            "{text}"
        );
        assert!(text.contains("No such file"), "{text}");

        for path in [&garbage, &no_context] {
            let err = args(Some(path), None)
                .resolve(&env(None, None), in_cluster)
                .await
                .unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("kubeconfig {}: ", path.display())),
                "{text}"
            );
        }

        // In a $KUBECONFIG list too, the bad file is the one named.
        let err = args(None, None)
            .resolve(&env(Some(joined(&[&f.env_a, &garbage])), None), in_cluster)
            .await
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("kubeconfig {}: ", garbage.display())),
            "{err}"
        );
    }

    #[tokio::test]
    async fn nothing_found_says_what_was_tried() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().join(".kube").join("config");
        let err = args(None, None)
            .resolve(&env(None, Some(&home)), not_in_cluster)
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("--kubeconfig, $KUBECONFIG nor --master"),
            "{text}"
        );
        assert!(text.contains("in-cluster"), "{text}");
        assert!(text.contains(home.to_str().unwrap()), "{text}");
    }

    /// The process's own environment: `$KUBECONFIG` and `$HOME` really set. Environment
    /// variables are process-wide, so this holds the lock every such test takes.
    #[tokio::test]
    async fn the_process_environment_is_read_from_kubeconfig_and_home() {
        let _env = crate::cmd::common::ENV_LOCK.lock().await;
        let f = files();
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".kube")).unwrap();
        std::fs::copy(&f.home, home.path().join(".kube").join("config")).unwrap();
        let saved = (std::env::var_os("KUBECONFIG"), std::env::var_os("HOME"));
        // SAFETY: every test that reads or writes the environment holds ENV_LOCK.
        unsafe {
            std::env::set_var("KUBECONFIG", joined(&[&f.env_b, &f.env_a]));
            std::env::set_var("HOME", home.path());
        }
        let with_env = Environment::from_process();
        // SAFETY: as above.
        unsafe { std::env::remove_var("KUBECONFIG") };
        let without_env = Environment::from_process();
        // SAFETY: as above.
        unsafe {
            match saved.0 {
                Some(v) => std::env::set_var("KUBECONFIG", v),
                None => std::env::remove_var("KUBECONFIG"),
            }
            match saved.1 {
                Some(v) => std::env::set_var("HOME", v),
                None => std::env::remove_var("HOME"),
            }
        }

        let (config, _) = args(None, None)
            .resolve(&with_env, not_in_cluster)
            .await
            .unwrap();
        assert_eq!(config.cluster_url, "https://env-b:6443/");
        let (config, source) = args(None, None)
            .resolve(&without_env, not_in_cluster)
            .await
            .unwrap();
        assert_eq!(
            source,
            ConfigSource::Home(home.path().join(".kube").join("config"))
        );
        assert_eq!(config.cluster_url, "https://home:6443/");
    }
}
