//! The publisher's side of a connection, shared by every publisher (the allocator's and the
//! Python package's for PyTorch's own allocator): binding an address the way telemetry promises
//! (a Unix socket created with mode 0600 in a folder closed to others, or a loopback TCP port)
//! and accepting dashboards as non-blocking streams ([`Listener`]), and the bounded queue of
//! frames each dashboard is sent through without the publisher ever waiting for it
//! ([`Outbox`]). What to send, and when a client is too slow, is the publisher loop's
//! ([`publish`](crate::publish)), which serves every publisher's source over these two.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::{TelemetryAddr, TelemetryError};

/// A bound publisher address that accepts dashboards. The socket file of a Unix address is
/// removed when the listener is dropped.
pub struct Listener {
    kind: ListenerKind,
    addr: TelemetryAddr,
    socket_path: Option<PathBuf>,
}

impl Listener {
    /// Binds `addr` non-blocking: a Unix socket only its owner may use (replacing a stale one
    /// nobody listens on), or a TCP port, which must be on the loopback interface unless
    /// `allow_remote`.
    pub fn bind(addr: &TelemetryAddr, allow_remote: bool) -> Result<Listener, TelemetryError> {
        let (kind, bound, socket_path) = match addr {
            TelemetryAddr::Unix(path) => (
                ListenerKind::Unix(bind_unix(path)?),
                TelemetryAddr::Unix(path.clone()),
                Some(path.clone()),
            ),
            TelemetryAddr::Tcp(a) => {
                if !a.ip().is_loopback() && !allow_remote {
                    return Err(TelemetryError::NotLoopback(*a));
                }
                let listener = TcpListener::bind(a)?;
                let local = listener.local_addr()?;
                (ListenerKind::Tcp(listener), TelemetryAddr::Tcp(local), None)
            }
        };
        let listener = Listener {
            kind,
            addr: bound,
            socket_path,
        };
        match &listener.kind {
            ListenerKind::Unix(l) => l.set_nonblocking(true)?,
            ListenerKind::Tcp(l) => l.set_nonblocking(true)?,
        }
        Ok(listener)
    }

    /// The address bound (a TCP address with the port the system chose for port 0).
    pub fn addr(&self) -> &TelemetryAddr {
        &self.addr
    }

    /// Accepts one pending connection as a non-blocking stream, if there is one.
    pub fn accept(&self) -> io::Result<Option<TcpStream>> {
        self.kind.accept()
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(path) = &self.socket_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

enum ListenerKind {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl ListenerKind {
    /// Accepts one pending connection as a non-blocking stream, if there is one.
    fn accept(&self) -> io::Result<Option<TcpStream>> {
        let stream = match self {
            ListenerKind::Unix(l) => match l.accept() {
                Ok((s, _)) => {
                    // SAFETY: `into_raw_fd` hands over the open, owned descriptor of a connected
                    // stream socket. `TcpStream` owns it from here on and only uses socket calls
                    // that work on any stream socket (`send` with MSG_NOSIGNAL, `recv`, `ioctl`,
                    // `shutdown`, `close`); writing through it cannot raise SIGPIPE in a host
                    // process that did not ignore that signal, which a plain `UnixStream` can.
                    unsafe { TcpStream::from_raw_fd(s.into_raw_fd()) }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            },
            ListenerKind::Tcp(l) => match l.accept() {
                Ok((s, _)) => {
                    let _ = s.set_nodelay(true);
                    s
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        stream.set_nonblocking(true)?;
        Ok(Some(stream))
    }
}

/// The frames waiting for one dashboard, written as far as its socket takes them without
/// blocking. Every byte queued counts in `queued_bytes`, which each publisher holds against
/// its bound.
pub struct Outbox {
    /// The connection (a Unix socket is held as a `TcpStream`; see [`Listener::accept`]).
    pub conn: TcpStream,
    /// Frames not yet written whole, oldest first.
    pub queue: VecDeque<Arc<Vec<u8>>>,
    /// Bytes of the front frame already written.
    pub written: usize,
    /// Bytes of every frame in `queue`.
    pub queued_bytes: usize,
    /// Set once the connection failed or closed.
    pub dead: bool,
    /// When the client last took bytes (or had nothing waiting).
    pub last_progress: Instant,
}

impl Outbox {
    /// An empty queue for `conn`.
    pub fn new(conn: TcpStream) -> Outbox {
        Outbox {
            conn,
            queue: VecDeque::new(),
            written: 0,
            queued_bytes: 0,
            dead: false,
            last_progress: Instant::now(),
        }
    }

    /// Queues `frame`.
    pub fn push(&mut self, frame: Arc<Vec<u8>>) {
        self.queued_bytes += frame.len();
        self.queue.push_back(frame);
    }

    /// Writes as much as the socket takes without blocking.
    pub fn flush(&mut self) {
        if self.queue.is_empty() {
            self.last_progress = Instant::now();
        }
        while let Some(front) = self.queue.front() {
            match self.conn.write(&front[self.written..]) {
                Ok(0) => {
                    self.dead = true;
                    return;
                }
                Ok(n) => {
                    self.last_progress = Instant::now();
                    self.written += n;
                    if self.written == front.len() {
                        self.queued_bytes -= front.len();
                        self.queue.pop_front();
                        self.written = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.dead = true;
                    return;
                }
            }
        }
    }
}

/// Binds a Unix socket at `path` readable and writable by the owner only, creating a private
/// parent directory when it is missing and replacing a stale socket left by a dead process.
fn bind_unix(path: &Path) -> Result<UnixListener, TelemetryError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        if !parent.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)?;
        }
    }
    if parent_is_default_temp(path) {
        check_private_dir(path.parent().unwrap_or(Path::new("/")))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(TelemetryError::Io(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            )));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(TelemetryError::InUse(path.to_path_buf()));
        }
        // A socket nobody listens on: left behind by a process that died.
        std::fs::remove_file(path)?;
    }
    // The socket is created with mode 0600 (the process's file-creation mask is narrowed
    // around `bind`), so there is no moment at which another user could connect; the explicit
    // `chmod` after it only repeats that.
    let listener = {
        let _mask = PrivateFileMask::new();
        UnixListener::bind(path)?
    };
    if let Err(e) = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)) {
        let _ = std::fs::remove_file(path);
        return Err(e.into());
    }
    Ok(listener)
}

extern "C" {
    fn umask(mask: u32) -> u32;
    fn geteuid() -> u32;
}

/// The process's file-creation mask set to 0177 (new files readable and writable by the
/// owner only) while it lives, and restored when it is dropped. The mask is process-wide: a
/// file another thread creates meanwhile is private too, which errs on the safe side.
struct PrivateFileMask {
    previous: u32,
}

impl PrivateFileMask {
    fn new() -> PrivateFileMask {
        // SAFETY: umask(2) only sets the process's file-creation mask and cannot fail.
        let previous = unsafe { umask(0o177) };
        PrivateFileMask { previous }
    }
}

impl Drop for PrivateFileMask {
    fn drop(&mut self) {
        // SAFETY: as in `new`: restores the mask found there.
        unsafe { umask(self.previous) };
    }
}

/// Whether `path` lies directly in the shared temporary directory's vramscope folder.
fn parent_is_default_temp(path: &Path) -> bool {
    let temp_default = TelemetryAddr::temp_default_dir();
    path.parent() == Some(temp_default.as_path())
}

/// Checks that a folder in a shared place is a real directory (not a link), owned by this
/// process's effective user and closed to everyone else (no group or other permission bits),
/// so that nobody else can swap the socket. The publisher checks the folder it binds in, and
/// discovery (`TelemetryAddr::discover_checked`) the folder it reads, with this one function.
pub(crate) fn check_private_dir(dir: &Path) -> Result<(), TelemetryError> {
    let meta = std::fs::symlink_metadata(dir)?;
    let refuse = |why: &str| {
        Err(TelemetryError::Io(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{}: {why}", dir.display()),
        )))
    };
    if !meta.file_type().is_dir() {
        return refuse("not a directory");
    }
    if meta.permissions().mode() & 0o077 != 0 {
        return refuse("open to other users (expected mode 0700)");
    }
    // SAFETY: geteuid(2) only reads the process's effective user id and cannot fail.
    let me = unsafe { geteuid() };
    if me != meta.uid() {
        return refuse("owned by another user");
    }
    Ok(())
}
