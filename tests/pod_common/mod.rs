//! What the tests that run the image as a pod share (`tests/image.rs` under podman,
//! `tests/node.rs` on a real kubelet node): scraping a pod's secure metrics endpoint.

use std::process::Command;

/// `curl` of `https://<addr>/metrics` (the self-signed certificate made at start, so `-k`),
/// with `token` as a Bearer token if given: the HTTP status (0 if none came back).
pub fn scrape(addr: &str, token: Option<&str>) -> u16 {
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
        .unwrap();
    String::from_utf8_lossy(&out.stdout).parse().unwrap_or(0)
}
