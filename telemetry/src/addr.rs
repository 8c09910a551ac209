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
    /// newest first: what `vramscope top` tries when it is given no address. Empty when the
    /// folder fails the check of [`TelemetryAddr::discover_checked`].
    pub fn discover() -> Vec<TelemetryAddr> {
        TelemetryAddr::discover_checked().unwrap_or_default()
    }

    /// [`TelemetryAddr::discover`], saying why a folder was skipped: where
    /// `$XDG_RUNTIME_DIR` is unset the default folder lies in the shared temporary directory
    /// (`$TMPDIR/vramscope-$USER`), and its sockets are trusted only if the folder passes the
    /// check the publisher makes before binding there (a directory, owned by this user, with
    /// no permission for group or others). Otherwise another user could show this user's
    /// dashboard their program. A folder that does not exist finds nothing.
    pub fn discover_checked() -> Result<Vec<TelemetryAddr>, TelemetryError> {
        let dir = TelemetryAddr::default_dir();
        let shared = dir == TelemetryAddr::temp_default_dir();
        discover_in(&dir, shared)
    }
}

/// The publisher sockets in `dir`, newest first; `shared`: the folder lies in a place other
/// users can write to, and is checked like the publisher checks it before it is read.
fn discover_in(dir: &Path, shared: bool) -> Result<Vec<TelemetryAddr>, TelemetryError> {
    if !dir.exists() && std::fs::symlink_metadata(dir).is_err() {
        return Ok(Vec::new());
    }
    if shared {
        crate::serve::check_private_dir(dir)?;
    }
    let mut found: Vec<(SystemTime, PathBuf)> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
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
    Ok(found
        .into_iter()
        .map(|(_, p)| TelemetryAddr::Unix(p))
        .collect())
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

    /// A fresh folder under the temporary directory for one test, with `mode`.
    fn folder(name: &str, mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            std::env::temp_dir().join(format!("vramscope-addr-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
        std::fs::write(dir.join("vramscope-1.sock"), b"").unwrap();
        dir
    }

    /// Issue 33: a shared folder open to others, or another user's, is skipped with the
    /// publisher's reason; a private one of this user's is read; a folder outside the shared
    /// place is read as it is.
    #[test]
    fn discovery_checks_a_shared_folder_as_the_publisher_does() {
        use std::os::unix::fs::MetadataExt;
        let open = folder("open", 0o777);
        let err = discover_in(&open, true).unwrap_err().to_string();
        assert!(err.contains("open to other users"), "{err}");
        let readable = folder("readable", 0o750);
        let err = discover_in(&readable, true).unwrap_err().to_string();
        assert!(err.contains("open to other users"), "{err}");
        assert_eq!(discover_in(&open, false).unwrap().len(), 1);
        let private = folder("private", 0o700);
        assert_eq!(
            discover_in(&private, true).unwrap(),
            vec![TelemetryAddr::Unix(private.join("vramscope-1.sock"))]
        );
        // Another user's folder: made so where this test may change owners (as root),
        // else the first private folder of another user's found on this machine.
        let me = std::fs::metadata(&private).unwrap().uid();
        let theirs = if me == 0 {
            let theirs = folder("theirs", 0o700);
            let path = std::ffi::CString::new(theirs.as_os_str().as_encoded_bytes()).unwrap();
            extern "C" {
                fn chown(path: *const std::ffi::c_char, owner: u32, group: u32) -> i32;
            }
            // SAFETY: `path` is a NUL-terminated string that outlives the call.
            assert_eq!(unsafe { chown(path.as_ptr(), 65534, 65534) }, 0);
            Some(theirs)
        } else {
            ["/root", "/var/lib/private", "/var/cache/private"]
                .iter()
                .map(PathBuf::from)
                .find(|p| {
                    std::fs::symlink_metadata(p).is_ok_and(|m| {
                        use std::os::unix::fs::PermissionsExt;
                        m.is_dir() && m.uid() != me && m.permissions().mode() & 0o077 == 0
                    })
                })
        };
        if let Some(theirs) = &theirs {
            let err = discover_in(theirs, true).unwrap_err().to_string();
            assert!(err.contains("owned by another user"), "{err}");
        }
        let missing = private.join("missing");
        assert!(discover_in(&missing, true).unwrap().is_empty());
        for dir in [open, readable, private]
            .into_iter()
            .chain(theirs.filter(|_| me == 0))
        {
            std::fs::remove_dir_all(dir).ok();
        }
    }
}
