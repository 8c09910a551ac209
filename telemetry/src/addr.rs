//! Where a publisher listens and a client connects: Unix sockets (the default, one per process
//! in a private directory) and loopback TCP addresses, parsed from `unix:PATH`, `unix`,
//! `tcp:HOST:PORT` or a bare path, and the discovery of publishers' default sockets that
//! `vramscope top` uses when given no address.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::TelemetryError;

/// The environment variable the allocator's `Telemetry::from_env` reads: `unix:PATH`, `unix`
/// (the default socket), `tcp:HOST:PORT`, or a bare path.
pub const ENV_LISTEN: &str = "VRAMSCOPE_LISTEN";
/// Set to `1` to let the allocator's `Telemetry::from_env` listen on a TCP address other than
/// loopback.
pub const ENV_ALLOW_REMOTE: &str = "VRAMSCOPE_LISTEN_ALLOW_REMOTE";

/// Where a publisher listens and a client connects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TelemetryAddr {
    /// A Unix domain socket at this path.
    Unix(PathBuf),
    /// A TCP address.
    Tcp(SocketAddr),
}

impl TelemetryAddr {
    /// The directory default sockets live in: `$XDG_RUNTIME_DIR`, else `vramscope-UID`-like
    /// private folder `vramscope` in the temporary directory.
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(dir) if !dir.is_empty() && Path::new(&dir).is_dir() => PathBuf::from(dir),
            _ => TelemetryAddr::temp_default_dir(),
        }
    }

    /// The private folder default sockets use where `$XDG_RUNTIME_DIR` is unset:
    /// `vramscope-USER` in the temporary directory. A publisher creates it with mode 0700 and
    /// refuses it when another user owns it.
    pub fn temp_default_dir() -> PathBuf {
        std::env::temp_dir().join(format!("vramscope-{}", current_user_tag()))
    }

    /// The default socket of this process: `vramscope-PID.sock` in [`TelemetryAddr::default_dir`].
    pub fn default_unix() -> TelemetryAddr {
        TelemetryAddr::Unix(
            TelemetryAddr::default_dir().join(format!("vramscope-{}.sock", std::process::id())),
        )
    }

    /// Parses `unix:PATH`, `unix` (the default socket), `tcp:HOST:PORT`, or a bare path (a Unix
    /// socket).
    pub fn parse(text: &str) -> Result<TelemetryAddr, TelemetryError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(TelemetryError::BadAddress(text.to_string()));
        }
        if text == "unix" || text == "unix:" {
            return Ok(TelemetryAddr::default_unix());
        }
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(TelemetryAddr::Unix(PathBuf::from(path)));
        }
        if let Some(rest) = text.strip_prefix("tcp:") {
            let addr = rest
                .to_socket_addrs()
                .ok()
                .and_then(|mut a| a.next())
                .ok_or_else(|| TelemetryError::BadAddress(text.to_string()))?;
            return Ok(TelemetryAddr::Tcp(addr));
        }
        if text.contains(':') && !text.contains('/') {
            return Err(TelemetryError::BadAddress(text.to_string()));
        }
        Ok(TelemetryAddr::Unix(PathBuf::from(text)))
    }

    /// Unix sockets in [`TelemetryAddr::default_dir`] that look like vramscope publishers,
    /// newest first: what `vramscope top` tries when it is given no address.
    pub fn discover() -> Vec<TelemetryAddr> {
        let mut found: Vec<(SystemTime, PathBuf)> = Vec::new();
        if let Ok(entries) = std::fs::read_dir(TelemetryAddr::default_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with("vramscope-") && name.ends_with(".sock") {
                    let modified = entry
                        .metadata()
                        .and_then(|m| m.modified())
                        .unwrap_or(UNIX_EPOCH);
                    found.push((modified, entry.path()));
                }
            }
        }
        found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        found
            .into_iter()
            .map(|(_, p)| TelemetryAddr::Unix(p))
            .collect()
    }
}

impl FromStr for TelemetryAddr {
    type Err = TelemetryError;

    fn from_str(text: &str) -> Result<TelemetryAddr, TelemetryError> {
        TelemetryAddr::parse(text)
    }
}

impl fmt::Display for TelemetryAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TelemetryAddr::Unix(p) => write!(f, "unix:{}", p.display()),
            TelemetryAddr::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// A tag that tells users apart in the temporary directory, from `$USER` (or `user`).
fn current_user_tag() -> String {
    let user = std::env::var("USER").unwrap_or_default();
    let clean: String = user
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .collect();
    if clean.is_empty() {
        "user".to_string()
    } else {
        clean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print() {
        assert_eq!(
            TelemetryAddr::parse("unix:/tmp/x.sock").unwrap(),
            TelemetryAddr::Unix("/tmp/x.sock".into())
        );
        assert_eq!(
            TelemetryAddr::parse("/tmp/y.sock").unwrap().to_string(),
            "unix:/tmp/y.sock"
        );
        let tcp = TelemetryAddr::parse("tcp:127.0.0.1:7000").unwrap();
        assert_eq!(tcp.to_string(), "tcp:127.0.0.1:7000");
        assert!(TelemetryAddr::parse("bogus:thing").is_err());
        assert!(TelemetryAddr::parse("").is_err());
        assert!(matches!(
            TelemetryAddr::parse("unix").unwrap(),
            TelemetryAddr::Unix(_)
        ));
    }
}
