//! Free loopback ports.

use std::net::{Ipv4Addr, TcpListener};

use super::TestEnvError;

/// A port on 127.0.0.1 that was free a moment ago. Another process could take it before the
/// component binds it; on loopback in a test run that is rare enough, and start-up then fails
/// with the component's own "address in use" message in the error.
pub fn free_port() -> Result<u16, TestEnvError> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|source| TestEnvError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })?;
    let port = listener
        .local_addr()
        .map_err(|source| TestEnvError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })?
        .port();
    Ok(port)
}
