//! `kubeloop trace`: prints one object's journey through a running controller, read from that
//! controller's ops server (`/debug/trace`). The controller must have been started with
//! `--trace namespace/name`, `--metrics-bind-address` and `--metrics-secure=false` (this command
//! speaks plain HTTP; against a secure server, `curl -k -H "Authorization: Bearer $TOKEN"
//! https://ADDR/debug/trace?key=ns/name` reads the same table); see `kubeloop::trace`.

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The object's key, namespace/name (name alone for a cluster-scoped object).
    key: String,
    /// The controller's metrics address (its --metrics-bind-address), host:port or :port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    ops_address: String,
    /// Show the informer steps of this kind only (e.g. vm, Foo, Deployment); queue and
    /// reconcile steps are always shown.
    #[arg(long)]
    kind: Option<String>,
    /// Print the recorded steps as JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub async fn run(args: Args) -> anyhow::Result<()> {
    let address = match args.ops_address.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}"),
        None => args.ops_address.clone(),
    };
    let path = format!(
        "/debug/trace?key={}&format=json",
        args.key.replace('/', "%2F")
    );
    let (status, body) = get(&address, &path)
        .await
        .with_context(|| format!("reading the trace of {} from {address}", args.key))?;
    if status != 200 {
        bail!(
            "{address} answered {status} for the trace of {}: {}",
            args.key,
            body.trim()
        );
    }
    let mut steps: Vec<kubeloop::trace::Step> = serde_json::from_str(&body)
        .with_context(|| format!("{address} sent a trace that is not kubeloop's JSON"))?;
    if let Some(kind) = &args.kind {
        let wanted = canonical_kind(kind);
        steps.retain(|s| s.kind.is_empty() || s.kind.eq_ignore_ascii_case(&wanted));
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&steps)?);
    } else {
        print!("{}", kubeloop::trace::render(&args.key, &steps));
    }
    Ok(())
}

/// kubectl's short names for the two controllers' kinds.
fn canonical_kind(kind: &str) -> String {
    match kind.to_ascii_lowercase().as_str() {
        "vm" | "vms" | "virtualmachine" | "virtualmachines" => "VirtualMachine".into(),
        "foo" | "foos" => "Foo".into(),
        "deploy" | "deployment" | "deployments" => "Deployment".into(),
        _ => kind.to_string(),
    }
}

/// One HTTP/1.1 GET with `Connection: close`; the ops server answers with a length-delimited
/// body, so reading to the end is the whole response.
async fn get(address: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .with_context(|| format!("connecting to {address} (is the controller running with --metrics-bind-address {address} --metrics-secure=false?)"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await?;
    if !response.starts_with(b"HTTP/") {
        bail!(
            "{address} does not answer plain HTTP (it serves HTTPS: start the controller with \
             --metrics-secure=false to use `kubeloop trace`)"
        );
    }
    let response = String::from_utf8_lossy(&response);
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("the response has no header end")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("the response has no status code")?;
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_names_map_to_kinds() {
        assert_eq!(canonical_kind("vm"), "VirtualMachine");
        assert_eq!(canonical_kind("Foos"), "Foo");
        assert_eq!(canonical_kind("ConfigMap"), "ConfigMap");
    }
}
