//! Free loopback ports.

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Mutex;

use super::TestEnvError;

/// A port on 127.0.0.1 that was free a moment ago, not handed out before in this process.
///
/// Taken below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`, 32768-60999 by
/// default) when there is room there: outgoing connections take their source ports from that
/// range, so a port from it (what binding port 0 gives) could be taken by one of the run's own
/// client connections before the component binds it, and the component would fail with
/// "address already in use" (seen on a quiet machine). Another listener could still take it;
/// start-up then fails with the component's own message in the error.
pub fn free_port() -> Result<u16, TestEnvError> {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let low = 10_000;
    let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|p| p.into_inner());
    let handed_out = handed_out.get_or_insert_with(HashSet::new);
    if ephemeral_low > low + 1000 {
        for _ in 0..1000 {
            let port = rand::random_range(low..ephemeral_low);
            if !handed_out.contains(&port) && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
            {
                handed_out.insert(port);
                return Ok(port);
            }
        }
    }
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .map_err(|source| TestEnvError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })?
        .port();
    handed_out.insert(port);
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        let distinct: HashSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len());
        for port in ports {
            assert!((10_000..32_768).contains(&port), "{port}");
            TcpListener::bind((Ipv4Addr::LOCALHOST, port)).unwrap();
        }
    }
}
