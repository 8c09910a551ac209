//! Live telemetry: a publisher that streams an allocator's events to dashboards over a local
//! socket, and the client that reads them.
//!
//! [`Telemetry::serve`] (or [`Telemetry::from_env`] with `VRAMSCOPE_LISTEN`) starts one
//! background thread for a [`CachingAllocator`]. That thread accepts dashboards on a Unix socket
//! (mode 0600) or a loopback TCP port, pulls events from the allocator's ring by sequence number
//! with [`CachingAllocator::events_since`], and sends them in batches to every attached client,
//! with a statistics frame ten times a second. The application's threads never wait for it:
//! each client has a bounded queue (every byte counted, the attach snapshot's too: its history
//! is cut to fit) and a non-blocking socket, and events a slow or absent dashboard cannot take
//! are counted as dropped for that client, which is then re-synchronised with a fresh snapshot
//! once its queue has drained; a client that takes nothing for a second is stalled and counted
//! the same way. Snapshots, which hold the allocator's lock while they are taken, are rate
//! limited (`ServeOptions::attach_interval`, `ServeOptions::resync_interval`): clients that
//! connect meanwhile share the next one. A client past `ServeOptions::max_clients` is told why
//! in a `Refused` frame before the connection closes. The protocol is read-only: the publisher
//! never reads what a client sends. [`TelemetryClient`] is the reading side that the dashboard
//! (`vramscope-tui`) uses; it reassembles snapshots and checks every frame.
//!
//! # Wire format (protocol version 1)
//!
//! A connection is a sequence of frames. Each frame is an 8-byte header followed by a payload:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic `b"VS"` |
//! | 2 | 1 | protocol version, [`PROTOCOL_VERSION`] |
//! | 3 | 1 | frame kind ([`FrameKind`]) |
//! | 4 | 4 | payload length in bytes, little-endian `u32`, at most [`MAX_FRAME_BYTES`] |
//!
//! Payloads by kind:
//!
//! - `Hello` (1), JSON [`Hello`]: the first frame of every connection.
//! - `SnapshotPart` (2) and `SnapshotEnd` (3): the pieces of one JSON document
//!   `{"next_seq": S, "history": H, "snapshot": Snapshot}`, split so that no frame exceeds the
//!   limit (the whole document is limited to [`MAX_SNAPSHOT_BYTES`]). The snapshot's `events`
//!   are empty in the JSON; the `H` events that precede sequence number `S` follow in `Events`
//!   frames and belong to the snapshot. Sent after `Hello`, and again whenever the client has
//!   lost events.
//! - `Events` (4), binary: a little-endian `u32` count, then that many records of
//!   [`EVENT_RECORD_BYTES`] bytes each: `seq`, `time_ns`, `addr`, `size`, `requested`, `stream`,
//!   `step` (each `u64`), `site`, `tag`, `scope` (each `u32`, `u32::MAX` for none), `thread`,
//!   `device` (each `u32`), the kind (`u8`, see [`EventKind`] codes in this module), the transfer
//!   direction (`u8`) and two bytes of padding.
//! - `Tables` (5), JSON [`TablesFrame`]: call sites, tags and scopes added since the client's
//!   snapshot, sent before the first event that refers to them.
//! - `Stats` (6), JSON [`StatsFrame`]: the statistics, ten times a second.
//! - `Bye` (7), empty: the publisher is shutting down.
//! - `Refused` (8), JSON `{"reason": "..."}`: the publisher turned this client away (too many
//!   dashboards attached); the only frame of such a connection, after `Hello`.
//!
//! A reader rejects a frame with the wrong magic, another protocol version, a payload over the
//! limit, or a payload that does not parse; it skips frames of unknown kinds, so that later
//! versions may add kinds without breaking older dashboards.

use std::collections::VecDeque;
use std::fmt;
use std::io::{self, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::backend::Backend;
use crate::caching::CachingAllocator;
use vramscope_model::AllocatorConfig;
use vramscope_model::MemoryStats;
use vramscope_model::{CallSite, DeviceInfo, Event, EventKind, Snapshot, TransferDirection};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;
/// The first two bytes of every frame.
pub const MAGIC: [u8; 2] = *b"VS";
/// Bytes in a frame header.
pub const HEADER_BYTES: usize = 8;
/// The largest payload a frame may carry (16 MiB).
pub const MAX_FRAME_BYTES: usize = 16 << 20;
/// The largest snapshot document a client reassembles from its parts (256 MiB).
pub const MAX_SNAPSHOT_BYTES: usize = 256 << 20;
/// Bytes per event record in an `Events` frame.
pub const EVENT_RECORD_BYTES: usize = 80;
/// The environment variable [`Telemetry::from_env`] reads: `unix:PATH`, `unix` (the default
/// socket), `tcp:HOST:PORT`, or a bare path.
pub const ENV_LISTEN: &str = "VRAMSCOPE_LISTEN";
/// Set to `1` to let [`Telemetry::from_env`] listen on a TCP address other than loopback.
pub const ENV_ALLOW_REMOTE: &str = "VRAMSCOPE_LISTEN_ALLOW_REMOTE";

/// Events per `Events` frame in the history that follows a snapshot.
const HISTORY_CHUNK: usize = 65_536;
/// The most events that fit in one frame.
const MAX_EVENTS_PER_FRAME: usize = (MAX_FRAME_BYTES - 4) / EVENT_RECORD_BYTES;
const NO_ID: u32 = u32::MAX;
const _: () = assert!(4 + MAX_EVENTS_PER_FRAME * EVENT_RECORD_BYTES <= MAX_FRAME_BYTES);

/// The kind of a frame: the fourth byte of its header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Who is talking: process, device, settings.
    Hello = 1,
    /// A piece of a snapshot document; more follow.
    SnapshotPart = 2,
    /// The last piece of a snapshot document.
    SnapshotEnd = 3,
    /// A batch of events in binary records.
    Events = 4,
    /// Additions to the call-site, tag and scope tables.
    Tables = 5,
    /// Statistics.
    Stats = 6,
    /// The publisher is going away.
    Bye = 7,
    /// The publisher turned this client away, and says why.
    Refused = 8,
}

impl FrameKind {
    /// The kind with code `code`, if this version knows it.
    pub fn from_code(code: u8) -> Option<FrameKind> {
        Some(match code {
            1 => FrameKind::Hello,
            2 => FrameKind::SnapshotPart,
            3 => FrameKind::SnapshotEnd,
            4 => FrameKind::Events,
            5 => FrameKind::Tables,
            6 => FrameKind::Stats,
            7 => FrameKind::Bye,
            8 => FrameKind::Refused,
            _ => return None,
        })
    }
}

/// Why telemetry could not be served or read.
#[derive(Debug)]
#[non_exhaustive]
pub enum TelemetryError {
    /// A socket operation failed.
    Io(io::Error),
    /// The peer closed the connection between two frames.
    Closed,
    /// The peer closed the connection in the middle of a frame.
    Truncated {
        /// Bytes the frame still needed.
        expected: usize,
        /// Bytes that arrived.
        got: usize,
    },
    /// A frame did not start with [`MAGIC`].
    BadMagic([u8; 2]),
    /// A frame of another protocol version.
    Version(u8),
    /// A frame (or a snapshot document) larger than the limit.
    Oversized {
        /// The announced size in bytes.
        len: usize,
        /// The limit in bytes.
        limit: usize,
    },
    /// A payload that does not parse.
    Malformed {
        /// The kind of the frame.
        kind: FrameKind,
        /// What is wrong.
        message: String,
    },
    /// The publisher turned this client away; the reason it gave.
    Refused(String),
    /// An address that is not `unix:PATH` or `tcp:HOST:PORT`.
    BadAddress(String),
    /// A TCP address off the loopback interface, without permission to use it.
    NotLoopback(SocketAddr),
    /// Another live publisher already listens on this Unix socket.
    InUse(PathBuf),
}

impl fmt::Display for TelemetryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TelemetryError::Io(e) => write!(f, "telemetry I/O error: {e}"),
            TelemetryError::Closed => f.write_str("the telemetry connection was closed"),
            TelemetryError::Truncated { expected, got } => write!(
                f,
                "the telemetry connection was closed in the middle of a frame ({got} of {expected} bytes)"
            ),
            TelemetryError::BadMagic(m) => write!(
                f,
                "not a vramscope telemetry stream (frame starts with {:02x} {:02x})",
                m[0], m[1]
            ),
            TelemetryError::Version(v) => write!(
                f,
                "telemetry protocol version {v} is not the version this build speaks ({PROTOCOL_VERSION})"
            ),
            TelemetryError::Oversized { len, limit } => write!(
                f,
                "telemetry frame of {len} bytes is over the limit of {limit} bytes"
            ),
            TelemetryError::Malformed { kind, message } => {
                write!(f, "malformed telemetry {kind:?} frame: {message}")
            }
            TelemetryError::Refused(reason) => {
                write!(f, "the program's telemetry publisher refused this dashboard: {reason}")
            }
            TelemetryError::BadAddress(a) => write!(
                f,
                "bad telemetry address `{a}` (expected unix:PATH or tcp:HOST:PORT)"
            ),
            TelemetryError::NotLoopback(a) => write!(
                f,
                "telemetry address {a} is not on the loopback interface (set {ENV_ALLOW_REMOTE}=1 or ServeOptions::allow_remote to allow it)"
            ),
            TelemetryError::InUse(p) => write!(
                f,
                "another vramscope publisher is listening on {}",
                p.display()
            ),
        }
    }
}

impl std::error::Error for TelemetryError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TelemetryError::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for TelemetryError {
    fn from(e: io::Error) -> TelemetryError {
        TelemetryError::Io(e)
    }
}

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
            _ => std::env::temp_dir().join(format!("vramscope-{}", current_user_tag())),
        }
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

/// The first frame of a connection: who is talking.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTOCOL_VERSION`].
    pub protocol: u8,
    /// Process id of the program.
    pub pid: u32,
    /// The program's name (its executable's file name).
    pub program: String,
    /// The device the allocator serves.
    pub device: DeviceInfo,
    /// Wall-clock time of event time zero, in nanoseconds since the Unix epoch.
    pub epoch_unix_ns: u64,
    /// The allocator's settings.
    pub config: AllocatorConfig,
}

/// Statistics, sent ten times a second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsFrame {
    /// The allocator's statistics.
    pub stats: MemoryStats,
    /// The current step number.
    pub step: u64,
    /// The sequence number of the next event the publisher will read.
    pub next_seq: u64,
    /// Events this client did not receive so far: overwritten in the ring before the publisher
    /// read them, or dropped because the client did not keep up.
    pub dropped_events: u64,
    /// Nanoseconds since the allocator's epoch when the frame was made.
    pub time_ns: u64,
}

/// Additions to the tables that events index: entries from `*_from` on.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TablesFrame {
    /// Index of the first entry of `sites`.
    pub sites_from: u32,
    /// Call sites.
    pub sites: Vec<CallSite>,
    /// Index of the first entry of `tags`.
    pub tags_from: u32,
    /// Tags.
    pub tags: Vec<String>,
    /// Index of the first entry of `scopes`.
    pub scopes_from: u32,
    /// Scope paths.
    pub scopes: Vec<String>,
}

/// How many call sites, tags and scopes a consumer of events already knows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KnownTables {
    /// Call sites known.
    pub sites: usize,
    /// Tags known.
    pub tags: usize,
    /// Scopes known.
    pub scopes: usize,
}

impl KnownTables {
    /// Whether one of `events` refers to a table entry not known yet.
    pub fn lacks_any(&self, events: &[Event]) -> bool {
        let new = |id: Option<u32>, known: usize| id.is_some_and(|i| i as usize >= known);
        events
            .iter()
            .any(|e| new(e.site, self.sites) || new(e.tag, self.tags) || new(e.scope, self.scopes))
    }

    /// The table additions `alloc` has beyond what is known, which then become known. Only the
    /// additions are copied under the allocator's lock, and they are symbolized outside it
    /// ([`CachingAllocator::site_tables_since`]).
    pub fn pull<B: Backend>(&mut self, alloc: &CachingAllocator<B>) -> TablesFrame {
        let added = alloc.site_tables_since(self.sites, self.tags, self.scopes);
        let frame = TablesFrame {
            sites_from: self.sites as u32,
            tags_from: self.tags as u32,
            scopes_from: self.scopes as u32,
            ..TablesFrame::default()
        };
        self.sites += added.sites.len();
        self.tags += added.tags.len();
        self.scopes += added.scopes.len();
        TablesFrame {
            sites: added.sites,
            tags: added.tags,
            scopes: added.scopes,
            ..frame
        }
    }

    /// At least what `snapshot`'s tables hold.
    pub fn include(&mut self, snapshot: &Snapshot) {
        self.sites = self.sites.max(snapshot.sites.len());
        self.tags = self.tags.max(snapshot.tags.len());
        self.scopes = self.scopes.max(snapshot.scopes.len());
    }
}

impl TablesFrame {
    /// Writes the entries into `snapshot`'s tables, replacing entries at the same index and
    /// filling any gap with placeholders.
    pub fn apply_to(&self, snapshot: &mut Snapshot) {
        fn put<T: Clone>(table: &mut Vec<T>, from: u32, items: &[T], filler: impl Fn() -> T) {
            for (i, item) in items.iter().enumerate() {
                let at = from as usize + i;
                while table.len() < at {
                    table.push(filler());
                }
                if at < table.len() {
                    table[at] = item.clone();
                } else {
                    table.push(item.clone());
                }
            }
        }
        put(&mut snapshot.sites, self.sites_from, &self.sites, || {
            CallSite {
                file: "??".to_string(),
                line: 0,
                column: 0,
                function: String::new(),
                frames: Vec::new(),
            }
        });
        put(&mut snapshot.tags, self.tags_from, &self.tags, String::new);
        put(
            &mut snapshot.scopes,
            self.scopes_from,
            &self.scopes,
            String::new,
        );
    }
}

/// One decoded frame, as [`TelemetryClient::next_frame`] returns it.
#[derive(Clone, Debug, PartialEq)]
pub enum Frame {
    /// Who is talking.
    Hello(Hello),
    /// The allocator's state, with the events that precede `next_seq` in `snapshot.events`.
    Snapshot {
        /// The sequence number of the first event after the snapshot.
        next_seq: u64,
        /// The state.
        snapshot: Box<Snapshot>,
    },
    /// Events, oldest first.
    Events(Vec<Event>),
    /// Table additions.
    Tables(TablesFrame),
    /// Statistics.
    Stats(Box<StatsFrame>),
    /// The publisher is shutting down.
    Bye,
}

#[derive(Serialize, Deserialize)]
struct SnapshotDoc {
    next_seq: u64,
    history: u64,
    snapshot: Snapshot,
}

/// Encodes one frame: header and payload.
pub fn encode_frame(kind: FrameKind, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
    write_header(&mut out, kind, payload.len());
    out.extend_from_slice(payload);
    out
}

fn write_header(out: &mut Vec<u8>, kind: FrameKind, len: usize) {
    out.extend_from_slice(&MAGIC);
    out.push(PROTOCOL_VERSION);
    out.push(kind as u8);
    out.extend_from_slice(&(len as u32).to_le_bytes());
}

/// The length of `value` as JSON, counted without keeping the text.
fn serialized_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl Write for Count {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Serializing plain data cannot fail.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

fn json_frame<T: Serialize>(kind: FrameKind, value: &T) -> Vec<u8> {
    // Serializing plain data into memory cannot fail.
    let payload = serde_json::to_vec(value).unwrap_or_default();
    encode_frame(kind, &payload)
}

fn kind_code(kind: EventKind) -> (u8, u8) {
    match kind {
        EventKind::Alloc => (0, 0),
        EventKind::FreeRequested => (1, 0),
        EventKind::FreeCompleted => (2, 0),
        EventKind::SegmentAlloc => (3, 0),
        EventKind::SegmentFree => (4, 0),
        EventKind::SegmentMap => (5, 0),
        EventKind::SegmentUnmap => (6, 0),
        EventKind::EmptyCache => (7, 0),
        EventKind::Oom => (8, 0),
        EventKind::Transfer(TransferDirection::HostToDevice) => (9, 0),
        EventKind::Transfer(TransferDirection::DeviceToHost) => (9, 1),
        EventKind::Transfer(TransferDirection::DeviceToDevice) => (9, 2),
        EventKind::Sync => (10, 0),
        EventKind::Step => (11, 0),
        EventKind::Snapshot => (12, 0),
    }
}

fn kind_from_code(code: u8, direction: u8) -> Option<EventKind> {
    Some(match code {
        0 => EventKind::Alloc,
        1 => EventKind::FreeRequested,
        2 => EventKind::FreeCompleted,
        3 => EventKind::SegmentAlloc,
        4 => EventKind::SegmentFree,
        5 => EventKind::SegmentMap,
        6 => EventKind::SegmentUnmap,
        7 => EventKind::EmptyCache,
        8 => EventKind::Oom,
        9 => EventKind::Transfer(match direction {
            0 => TransferDirection::HostToDevice,
            1 => TransferDirection::DeviceToHost,
            2 => TransferDirection::DeviceToDevice,
            _ => return None,
        }),
        10 => EventKind::Sync,
        11 => EventKind::Step,
        12 => EventKind::Snapshot,
        _ => return None,
    })
}

/// Appends one event's binary record to `out`.
fn put_event(out: &mut Vec<u8>, e: &Event) {
    let mut r = [0u8; EVENT_RECORD_BYTES];
    let words = [
        e.seq,
        e.time_ns,
        e.addr,
        e.size,
        e.requested,
        e.stream,
        e.step,
    ];
    for (i, v) in words.iter().enumerate() {
        r[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    let ids = [
        e.site.unwrap_or(NO_ID),
        e.tag.unwrap_or(NO_ID),
        e.scope.unwrap_or(NO_ID),
        e.thread,
        e.device,
    ];
    for (i, v) in ids.iter().enumerate() {
        r[56 + i * 4..60 + i * 4].copy_from_slice(&v.to_le_bytes());
    }
    let (code, direction) = kind_code(e.kind);
    r[76] = code;
    r[77] = direction;
    out.extend_from_slice(&r);
}

/// Encodes events into one `Events` frame (at most [`MAX_FRAME_BYTES`] of payload; callers
/// pass at most that many events).
pub fn encode_events(events: &[Event]) -> Vec<u8> {
    let len = 4 + events.len() * EVENT_RECORD_BYTES;
    let mut out = Vec::with_capacity(HEADER_BYTES + len);
    write_header(&mut out, FrameKind::Events, len);
    out.extend_from_slice(&(events.len() as u32).to_le_bytes());
    for e in events {
        put_event(&mut out, e);
    }
    out
}

/// Decodes the payload of an `Events` frame.
pub fn decode_events(payload: &[u8]) -> Result<Vec<Event>, TelemetryError> {
    let malformed = |message: String| TelemetryError::Malformed {
        kind: FrameKind::Events,
        message,
    };
    if payload.len() < 4 {
        return Err(malformed(format!(
            "{} bytes, fewer than the count",
            payload.len()
        )));
    }
    let count = u32::from_le_bytes([payload[0], payload[1], payload[2], payload[3]]) as usize;
    let body = &payload[4..];
    if count.checked_mul(EVENT_RECORD_BYTES) != Some(body.len()) {
        return Err(malformed(format!(
            "{count} events announced but {} bytes of records",
            body.len()
        )));
    }
    let mut events = Vec::with_capacity(count);
    for (i, r) in body.chunks_exact(EVENT_RECORD_BYTES).enumerate() {
        let u64_at = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&r[o..o + 8]);
            u64::from_le_bytes(b)
        };
        let u32_at = |o: usize| {
            let mut b = [0u8; 4];
            b.copy_from_slice(&r[o..o + 4]);
            u32::from_le_bytes(b)
        };
        let id = |o: usize| Some(u32_at(o)).filter(|&v| v != NO_ID);
        let kind = kind_from_code(r[76], r[77]).ok_or_else(|| {
            malformed(format!("event {i} has unknown kind {} / {}", r[76], r[77]))
        })?;
        events.push(Event {
            seq: u64_at(0),
            time_ns: u64_at(8),
            addr: u64_at(16),
            size: u64_at(24),
            requested: u64_at(32),
            stream: u64_at(40),
            step: u64_at(48),
            site: id(56),
            tag: id(60),
            scope: id(64),
            thread: u32_at(68),
            device: u32_at(72),
            kind,
        });
    }
    Ok(events)
}

/// Reads and checks frames from any byte stream; [`TelemetryClient`] wraps one around a socket.
pub struct FrameReader<R: Read> {
    reader: R,
    snapshot: Vec<u8>,
    pending: Option<(u64, u64, Box<Snapshot>)>,
}

impl<R: Read> FrameReader<R> {
    /// A reader of frames from `reader`.
    pub fn new(reader: R) -> FrameReader<R> {
        FrameReader {
            reader,
            snapshot: Vec::new(),
            pending: None,
        }
    }

    /// The underlying stream.
    pub fn get_ref(&self) -> &R {
        &self.reader
    }

    /// Reads exactly `buf.len()` bytes; `at_boundary` says whether a clean end is allowed.
    fn fill(
        &mut self,
        buf: &mut [u8],
        at_boundary: bool,
        frame_len: usize,
    ) -> Result<(), TelemetryError> {
        let mut got = 0;
        while got < buf.len() {
            match self.reader.read(&mut buf[got..]) {
                Ok(0) => {
                    return Err(if at_boundary && got == 0 {
                        TelemetryError::Closed
                    } else {
                        TelemetryError::Truncated {
                            expected: frame_len,
                            got: if at_boundary { got } else { HEADER_BYTES + got },
                        }
                    })
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(TelemetryError::Io(e)),
            }
        }
        Ok(())
    }

    /// Reads one raw frame: its kind code and payload, checked against the header rules.
    pub fn next_raw(&mut self) -> Result<(u8, Vec<u8>), TelemetryError> {
        let mut header = [0u8; HEADER_BYTES];
        self.fill(&mut header, true, HEADER_BYTES)?;
        if header[0..2] != MAGIC {
            return Err(TelemetryError::BadMagic([header[0], header[1]]));
        }
        if header[2] != PROTOCOL_VERSION {
            return Err(TelemetryError::Version(header[2]));
        }
        let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        if len > MAX_FRAME_BYTES {
            return Err(TelemetryError::Oversized {
                len,
                limit: MAX_FRAME_BYTES,
            });
        }
        let mut payload = vec![0u8; len];
        self.fill(&mut payload, false, HEADER_BYTES + len)?;
        Ok((header[3], payload))
    }

    /// Reads the next complete frame. Snapshot parts are reassembled and the snapshot's history
    /// events collected before it is returned; frames of unknown kinds are skipped.
    pub fn next_frame(&mut self) -> Result<Frame, TelemetryError> {
        loop {
            let (code, payload) = self.next_raw()?;
            let Some(kind) = FrameKind::from_code(code) else {
                continue;
            };
            let malformed = |message: String| TelemetryError::Malformed { kind, message };
            if self.pending.is_some() && kind != FrameKind::Events {
                self.pending = None;
                return Err(malformed(
                    "a snapshot's history was interrupted by another frame".to_string(),
                ));
            }
            match kind {
                FrameKind::Hello => {
                    let hello: Hello =
                        serde_json::from_slice(&payload).map_err(|e| malformed(e.to_string()))?;
                    return Ok(Frame::Hello(hello));
                }
                FrameKind::SnapshotPart | FrameKind::SnapshotEnd => {
                    if self.snapshot.len() + payload.len() > MAX_SNAPSHOT_BYTES {
                        let len = self.snapshot.len() + payload.len();
                        self.snapshot = Vec::new();
                        return Err(TelemetryError::Oversized {
                            len,
                            limit: MAX_SNAPSHOT_BYTES,
                        });
                    }
                    self.snapshot.extend_from_slice(&payload);
                    if kind == FrameKind::SnapshotPart {
                        continue;
                    }
                    let doc = std::mem::take(&mut self.snapshot);
                    let doc: SnapshotDoc =
                        serde_json::from_slice(&doc).map_err(|e| malformed(e.to_string()))?;
                    let mut snapshot = Box::new(doc.snapshot);
                    snapshot.events.clear();
                    if doc.history == 0 {
                        return Ok(Frame::Snapshot {
                            next_seq: doc.next_seq,
                            snapshot,
                        });
                    }
                    self.pending = Some((doc.next_seq, doc.history, snapshot));
                }
                FrameKind::Events => {
                    let events = decode_events(&payload)?;
                    let Some((next_seq, history, mut snapshot)) = self.pending.take() else {
                        return Ok(Frame::Events(events));
                    };
                    let wanted = history as usize - snapshot.events.len();
                    if events.len() > wanted {
                        return Err(malformed(format!(
                            "{} history events where {wanted} were left",
                            events.len()
                        )));
                    }
                    snapshot.events.extend(events);
                    if snapshot.events.len() as u64 == history {
                        return Ok(Frame::Snapshot { next_seq, snapshot });
                    }
                    self.pending = Some((next_seq, history, snapshot));
                }
                FrameKind::Tables => {
                    let tables: TablesFrame =
                        serde_json::from_slice(&payload).map_err(|e| malformed(e.to_string()))?;
                    return Ok(Frame::Tables(tables));
                }
                FrameKind::Stats => {
                    let stats: StatsFrame =
                        serde_json::from_slice(&payload).map_err(|e| malformed(e.to_string()))?;
                    return Ok(Frame::Stats(Box::new(stats)));
                }
                FrameKind::Bye => return Ok(Frame::Bye),
                FrameKind::Refused => {
                    let refused: Refusal =
                        serde_json::from_slice(&payload).map_err(|e| malformed(e.to_string()))?;
                    return Err(TelemetryError::Refused(refused.reason));
                }
            }
        }
    }
}

/// The socket of a client connection.
enum ClientConn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Read for ClientConn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientConn::Unix(s) => s.read(buf),
            ClientConn::Tcp(s) => s.read(buf),
        }
    }
}

/// The dashboard's side of a connection: connects to a publisher and reads checked frames.
pub struct TelemetryClient {
    addr: TelemetryAddr,
    frames: FrameReader<BufReader<ClientConn>>,
}

impl TelemetryClient {
    /// Connects to the publisher at `addr`. Reads time out after ten seconds without a byte (a
    /// live publisher sends statistics ten times a second).
    pub fn connect(addr: &TelemetryAddr) -> Result<TelemetryClient, TelemetryError> {
        let timeout = Some(Duration::from_secs(10));
        let conn = match addr {
            TelemetryAddr::Unix(path) => {
                let s = UnixStream::connect(path)?;
                s.set_read_timeout(timeout)?;
                ClientConn::Unix(s)
            }
            TelemetryAddr::Tcp(a) => {
                let s = TcpStream::connect_timeout(a, Duration::from_secs(5))?;
                s.set_read_timeout(timeout)?;
                s.set_nodelay(true)?;
                ClientConn::Tcp(s)
            }
        };
        Ok(TelemetryClient {
            addr: addr.clone(),
            frames: FrameReader::new(BufReader::with_capacity(1 << 20, conn)),
        })
    }

    /// The address this client is connected to.
    pub fn addr(&self) -> &TelemetryAddr {
        &self.addr
    }

    /// Changes how long a read may wait for the next byte (`None`: forever).
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> io::Result<()> {
        match self.frames.get_ref().get_ref() {
            ClientConn::Unix(s) => s.set_read_timeout(timeout),
            ClientConn::Tcp(s) => s.set_read_timeout(timeout),
        }
    }

    /// Reads the next frame. Any error ends the connection's usefulness: reconnect.
    pub fn next_frame(&mut self) -> Result<Frame, TelemetryError> {
        self.frames.next_frame()
    }
}

/// The payload of a `Refused` frame.
#[derive(Serialize, Deserialize)]
struct Refusal {
    reason: String,
}

/// Settings of a publisher.
#[derive(Clone, Debug, PartialEq)]
pub struct ServeOptions {
    /// Allow TCP addresses off the loopback interface (false).
    pub allow_remote: bool,
    /// The most bytes of frames waiting for one client, every frame counted (the attach
    /// snapshot too, whose history is cut to fit); events beyond are dropped and counted, and
    /// the client re-synchronises once it has read what it has (32 MiB).
    pub client_queue_bytes: usize,
    /// The most events pulled from the ring at a time, one lock each (4096).
    pub batch_events: usize,
    /// How often statistics are sent (100 ms).
    pub stats_interval: Duration,
    /// The most events of history sent with a snapshot (1,048,576).
    pub history_events: usize,
    /// The most events of history sent with a re-synchronising snapshot (65,536).
    pub resync_history_events: usize,
    /// The most clients attached at once; more are turned away (16).
    pub max_clients: usize,
    /// The least time between two re-synchronising snapshots (1 s): a snapshot converts the
    /// whole ring under the allocator's lock, so it must stay rare.
    pub resync_interval: Duration,
    /// The least time between two snapshots for attaching clients (250 ms): clients that
    /// connect meanwhile wait and share the next one, so that connection churn costs the
    /// program at most four snapshots a second, however many clients come and go.
    pub attach_interval: Duration,
}

impl Default for ServeOptions {
    fn default() -> ServeOptions {
        ServeOptions {
            allow_remote: false,
            client_queue_bytes: 32 << 20,
            batch_events: 4096,
            stats_interval: Duration::from_millis(100),
            history_events: 1 << 20,
            resync_history_events: 1 << 16,
            max_clients: 16,
            resync_interval: Duration::from_secs(1),
            attach_interval: Duration::from_millis(250),
        }
    }
}

/// Counters of a running publisher.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Clients attached now.
    pub clients: u64,
    /// Clients attached since the start.
    pub clients_total: u64,
    /// Events read from the ring.
    pub events_read: u64,
    /// Event records queued for clients (summed over clients).
    pub events_sent: u64,
    /// Events clients missed, summed over clients: dropped from full queues, or overwritten in
    /// the ring before the publisher read them.
    pub events_dropped: u64,
    /// Events overwritten in the ring before the publisher read them.
    pub ring_missed: u64,
    /// Snapshots sent (first attach and re-synchronisation).
    pub snapshots: u64,
    /// Clients turned away (too many attached).
    pub clients_refused: u64,
    /// Bytes of frames waiting in the clients' queues now, summed over clients.
    pub queued_bytes: u64,
}

#[derive(Default)]
struct Counters {
    clients: AtomicU64,
    clients_total: AtomicU64,
    events_read: AtomicU64,
    events_sent: AtomicU64,
    events_dropped: AtomicU64,
    ring_missed: AtomicU64,
    snapshots: AtomicU64,
    clients_refused: AtomicU64,
    queued_bytes: AtomicU64,
}

struct PublisherShared {
    stop: AtomicBool,
    counters: Counters,
}

/// A running publisher. Dropping it (or [`Telemetry::shutdown`]) says goodbye to the clients,
/// stops the thread and removes the Unix socket.
pub struct Telemetry {
    addr: TelemetryAddr,
    shared: Arc<PublisherShared>,
    thread: Option<JoinHandle<()>>,
    socket_path: Option<PathBuf>,
}

enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listener {
    /// Accepts one pending connection as a non-blocking stream, if there is one.
    fn accept(&self) -> io::Result<Option<TcpStream>> {
        let stream = match self {
            Listener::Unix(l) => match l.accept() {
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
            Listener::Tcp(l) => match l.accept() {
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

impl Telemetry {
    /// Starts publishing `alloc`'s events on `addr` with default settings.
    pub fn serve<B: Backend>(
        alloc: &CachingAllocator<B>,
        addr: &TelemetryAddr,
    ) -> Result<Telemetry, TelemetryError> {
        Telemetry::serve_with(alloc, addr, ServeOptions::default())
    }

    /// Starts publishing from `VRAMSCOPE_LISTEN` when it is set (and not `0`/`off`); `Ok(None)`
    /// when it is not. `VRAMSCOPE_LISTEN_ALLOW_REMOTE=1` allows non-loopback TCP addresses.
    pub fn from_env<B: Backend>(
        alloc: &CachingAllocator<B>,
    ) -> Result<Option<Telemetry>, TelemetryError> {
        let Ok(value) = std::env::var(ENV_LISTEN) else {
            return Ok(None);
        };
        let value = value.trim();
        if value.is_empty() || value == "0" || value.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let addr = if value == "1" || value.eq_ignore_ascii_case("on") {
            TelemetryAddr::default_unix()
        } else {
            TelemetryAddr::parse(value)?
        };
        let options = ServeOptions {
            allow_remote: std::env::var(ENV_ALLOW_REMOTE).is_ok_and(|v| v.trim() == "1"),
            ..ServeOptions::default()
        };
        Telemetry::serve_with(alloc, &addr, options).map(Some)
    }

    /// Starts publishing `alloc`'s events on `addr` with `options`.
    pub fn serve_with<B: Backend>(
        alloc: &CachingAllocator<B>,
        addr: &TelemetryAddr,
        options: ServeOptions,
    ) -> Result<Telemetry, TelemetryError> {
        let (listener, bound, socket_path) = match addr {
            TelemetryAddr::Unix(path) => {
                let listener = bind_unix(path)?;
                (
                    Listener::Unix(listener),
                    TelemetryAddr::Unix(path.clone()),
                    Some(path.clone()),
                )
            }
            TelemetryAddr::Tcp(a) => {
                if !a.ip().is_loopback() && !options.allow_remote {
                    return Err(TelemetryError::NotLoopback(*a));
                }
                let listener = TcpListener::bind(a)?;
                let local = listener.local_addr()?;
                (Listener::Tcp(listener), TelemetryAddr::Tcp(local), None)
            }
        };
        let set_nonblocking = match &listener {
            Listener::Unix(l) => l.set_nonblocking(true),
            Listener::Tcp(l) => l.set_nonblocking(true),
        };
        if let Err(e) = set_nonblocking {
            if let Some(p) = &socket_path {
                let _ = std::fs::remove_file(p);
            }
            return Err(e.into());
        }
        let shared = Arc::new(PublisherShared {
            stop: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let mut publisher = Publisher {
            alloc: alloc.clone(),
            listener,
            options,
            shared: Arc::clone(&shared),
            clients: Vec::new(),
            next_seq: 0,
            known: KnownTables::default(),
            hello: Vec::new(),
            last_stats: None,
            last_snapshot: None,
        };
        let thread = std::thread::Builder::new()
            .name("vramscope-telemetry".to_string())
            .spawn(move || publisher.run());
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                if let Some(p) = &socket_path {
                    let _ = std::fs::remove_file(p);
                }
                return Err(e.into());
            }
        };
        Ok(Telemetry {
            addr: bound,
            shared,
            thread: Some(thread),
            socket_path,
        })
    }

    /// The address clients connect to (for `tcp:127.0.0.1:0`, the port the system chose).
    pub fn addr(&self) -> &TelemetryAddr {
        &self.addr
    }

    /// The publisher's counters.
    pub fn stats(&self) -> PublisherStats {
        let c = &self.shared.counters;
        PublisherStats {
            clients: c.clients.load(Ordering::Relaxed),
            clients_total: c.clients_total.load(Ordering::Relaxed),
            events_read: c.events_read.load(Ordering::Relaxed),
            events_sent: c.events_sent.load(Ordering::Relaxed),
            events_dropped: c.events_dropped.load(Ordering::Relaxed),
            ring_missed: c.ring_missed.load(Ordering::Relaxed),
            snapshots: c.snapshots.load(Ordering::Relaxed),
            clients_refused: c.clients_refused.load(Ordering::Relaxed),
            queued_bytes: c.queued_bytes.load(Ordering::Relaxed),
        }
    }

    /// Says goodbye to the clients, stops the publisher thread and removes the socket.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(path) = self.socket_path.take() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
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
    let temp_default = std::env::temp_dir().join(format!("vramscope-{}", current_user_tag()));
    path.parent() == Some(temp_default.as_path())
}

/// Checks that a folder in a shared place is a real directory, owned by this process's user and
/// closed to everyone else, so that nobody else can swap the socket.
fn check_private_dir(dir: &Path) -> Result<(), TelemetryError> {
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
    if let Ok(me) = std::fs::metadata("/proc/self") {
        if me.uid() != meta.uid() {
            return refuse("owned by another user");
        }
    }
    Ok(())
}

/// How long a client may take nothing while its queue is full before it is stalled.
const STALLED_AFTER: Duration = Duration::from_secs(1);

/// One attached dashboard.
struct Client {
    conn: TcpStream,
    queue: VecDeque<Arc<Vec<u8>>>,
    /// Bytes of the front frame already written.
    written: usize,
    queued_bytes: usize,
    /// Every event before this sequence number is accounted for: in the client's snapshot,
    /// queued for it, or counted as dropped.
    upto: u64,
    dropped: u64,
    /// Set when the client lost events: it gets a fresh snapshot once its queue has drained.
    resync: bool,
    /// Set until the first snapshot is queued.
    fresh: bool,
    dead: bool,
    /// When the client last took bytes (or had nothing waiting).
    last_progress: Instant,
}

impl Client {
    fn push(&mut self, frame: Arc<Vec<u8>>) {
        self.queued_bytes += frame.len();
        self.queue.push_back(frame);
    }

    /// Writes as much as the socket takes without blocking.
    fn flush(&mut self) {
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

/// What one pull from the ring found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pulled {
    /// No events.
    Nothing,
    /// Some events, fewer than a batch: the ring is drained.
    Some,
    /// A whole batch: the ring may hold more.
    Full,
}

struct Publisher<B: Backend> {
    alloc: CachingAllocator<B>,
    listener: Listener,
    options: ServeOptions,
    shared: Arc<PublisherShared>,
    clients: Vec<Client>,
    /// The next sequence number to pull from the ring.
    next_seq: u64,
    /// Lengths of the site, tag and scope tables that clients know.
    known: KnownTables,
    hello: Vec<u8>,
    last_stats: Option<Instant>,
    last_snapshot: Option<Instant>,
}

impl<B: Backend> Publisher<B> {
    fn run(&mut self) {
        self.hello = json_frame(FrameKind::Hello, &self.make_hello());
        let shortest = Duration::from_micros(500);
        let mut idle_sleep = shortest;
        while !self.shared.stop.load(Ordering::Relaxed) {
            self.accept();
            let mut pulled = Pulled::Nothing;
            let mut waiting = false;
            if !self.clients.is_empty() {
                self.attach_and_resync();
                // The ring is the buffer: read it only while some client has room, so that a
                // burst waits there instead of being dropped from a full queue. A client that
                // has taken nothing for a while is stalled: it loses its stream (and
                // re-synchronises once it reads again), and the ring is read on so that what it
                // misses is counted, not silently overwritten.
                let room = self.options.client_queue_bytes / 2;
                for client in &mut self.clients {
                    if !client.fresh
                        && client.queued_bytes >= room
                        && client.last_progress.elapsed() >= STALLED_AFTER
                    {
                        client.resync = true;
                    }
                }
                if self
                    .clients
                    .iter()
                    .any(|c| !c.fresh && (c.resync || c.queued_bytes < room))
                {
                    pulled = self.pull();
                }
                self.send_stats();
                for client in &mut self.clients {
                    client.flush();
                    waiting |= !client.queue.is_empty();
                }
                self.reap();
            }
            match pulled {
                // The ring has more: go straight back for it.
                Pulled::Full => idle_sleep = shortest,
                Pulled::Some => {
                    idle_sleep = shortest;
                    std::thread::sleep(idle_sleep);
                }
                Pulled::Nothing => {
                    std::thread::sleep(idle_sleep);
                    if !waiting {
                        idle_sleep = (idle_sleep * 2).min(Duration::from_millis(10));
                    }
                }
            }
        }
        self.say_goodbye();
    }

    fn make_hello(&self) -> Hello {
        let backend = self.alloc.backend();
        Hello {
            protocol: PROTOCOL_VERSION,
            pid: std::process::id(),
            program: std::env::current_exe()
                .ok()
                .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_default(),
            device: DeviceInfo {
                index: self.alloc.device(),
                name: backend.name(),
                backend: backend.kind().to_string(),
                capacity: backend.mem_info().total,
            },
            epoch_unix_ns: self.alloc.epoch_unix_ns(),
            config: self.alloc.config().clone(),
        }
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok(Some(conn)) => {
                    if self.clients.len() >= self.options.max_clients {
                        self.refuse(conn);
                        continue;
                    }
                    let mut client = Client {
                        conn,
                        queue: VecDeque::new(),
                        written: 0,
                        queued_bytes: 0,
                        upto: 0,
                        dropped: 0,
                        resync: false,
                        fresh: true,
                        dead: false,
                        last_progress: Instant::now(),
                    };
                    client.push(Arc::new(self.hello.clone()));
                    self.clients.push(client);
                    let c = &self.shared.counters;
                    c.clients_total.fetch_add(1, Ordering::Relaxed);
                    c.clients
                        .store(self.clients.len() as u64, Ordering::Relaxed);
                }
                Ok(None) => return,
                // A failed accept (a client that went away at once) is not the app's problem.
                Err(_) => return,
            }
        }
    }

    /// Tells a client that there is no room for it, best effort (a small frame on a fresh
    /// socket, without waiting), and closes the connection.
    fn refuse(&self, mut conn: TcpStream) {
        let reason = format!(
            "{} dashboards are attached already, the most this program allows (ServeOptions::max_clients)",
            self.options.max_clients
        );
        let mut bytes = self.hello.clone();
        bytes.extend(json_frame(FrameKind::Refused, &Refusal { reason }));
        let _ = conn.write(&bytes);
        self.shared
            .counters
            .clients_refused
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Queues a snapshot for new clients and for clients that lost events and have drained.
    fn attach_and_resync(&mut self) {
        let since_last = self.last_snapshot.map(|t| t.elapsed());
        let fresh = self.clients.iter().any(|c| c.fresh)
            && since_last.is_none_or(|t| t >= self.options.attach_interval);
        let resync_due = since_last.is_none_or(|t| t >= self.options.resync_interval);
        let resync = resync_due && self.clients.iter().any(|c| c.resync && c.queue.is_empty());
        if !fresh && !resync {
            return;
        }
        let had_stream = self.clients.iter().any(|c| !c.fresh && !c.resync);
        // Convert only the history some client will get: resyncs want far less than a fresh
        // attach, and the conversion holds the allocator's lock.
        let wanted = if fresh {
            self.options.history_events
        } else {
            self.options.resync_history_events
        };
        let mut snapshot = self.alloc.snapshot_with_history(wanted.saturating_add(1));
        self.last_snapshot = Some(Instant::now());
        self.shared
            .counters
            .snapshots
            .fetch_add(1, Ordering::Relaxed);
        let next_seq = snapshot
            .events
            .last()
            .map(|e| e.seq + 1)
            .unwrap_or(self.next_seq);
        let history = std::mem::take(&mut snapshot.events);
        // A client that lost events has its history already; a fresh one gets all of it.
        let keep = if fresh {
            self.options.history_events
        } else {
            self.options.resync_history_events
        };
        // Every byte queued counts against a client's bound, the snapshot's too: the history
        // is cut to what fits beside the snapshot document.
        let room = self
            .options
            .client_queue_bytes
            .saturating_sub(serialized_len(&snapshot))
            / EVENT_RECORD_BYTES;
        let skip = history.len().saturating_sub(keep.min(room));
        let history = &history[skip..];
        // The snapshot carries the tables as they are now; later additions go out as deltas.
        self.known.include(&snapshot);
        let frames = snapshot_frames(snapshot, next_seq, history);
        if !had_stream {
            self.next_seq = next_seq;
        }
        for client in &mut self.clients {
            if client.fresh || (client.resync && client.queue.is_empty()) {
                for f in &frames {
                    client.push(Arc::clone(f));
                }
                if !client.fresh {
                    // Events it lost while waiting for this snapshot, never read for it.
                    let lost = next_seq.saturating_sub(client.upto);
                    client.dropped += lost;
                    self.shared
                        .counters
                        .events_dropped
                        .fetch_add(lost, Ordering::Relaxed);
                }
                client.fresh = false;
                client.resync = false;
                client.upto = client.upto.max(next_seq);
            }
        }
    }

    /// Pulls one batch of events from the ring and queues it for every client.
    fn pull(&mut self) -> Pulled {
        let asked = self.next_seq;
        let batch = self
            .alloc
            .events_since(asked, self.options.batch_events.max(1));
        let shared = Arc::clone(&self.shared);
        let counters = &shared.counters;
        if batch.missed > 0 {
            counters
                .ring_missed
                .fetch_add(batch.missed, Ordering::Relaxed);
            // The ring overwrote the events from `asked` up to `oldest` before they were read.
            let oldest = asked + batch.missed;
            for client in &mut self.clients {
                let lost = oldest.saturating_sub(client.upto);
                if !client.fresh && lost > 0 {
                    client.dropped += lost;
                    counters.events_dropped.fetch_add(lost, Ordering::Relaxed);
                    client.resync = true;
                    client.upto = oldest;
                }
            }
        }
        self.next_seq = batch.next_seq;
        if batch.events.is_empty() {
            return Pulled::Nothing;
        }
        counters
            .events_read
            .fetch_add(batch.events.len() as u64, Ordering::Relaxed);
        self.send_tables(&batch.events);
        let full = if batch.events.len() >= self.options.batch_events {
            Pulled::Full
        } else {
            Pulled::Some
        };
        let shared_frame = Arc::new(encode_events(&batch.events));
        let first_seq = batch.events[0].seq;
        for client in &mut self.clients {
            if client.fresh {
                continue;
            }
            // Only the events not yet accounted for (those after the client's snapshot).
            let skip = client.upto.saturating_sub(first_seq) as usize;
            if skip >= batch.events.len() {
                continue;
            }
            let n = (batch.events.len() - skip) as u64;
            client.upto = batch.next_seq;
            if client.resync {
                client.dropped += n;
                counters.events_dropped.fetch_add(n, Ordering::Relaxed);
                continue;
            }
            let frame = if skip == 0 {
                Arc::clone(&shared_frame)
            } else {
                Arc::new(encode_events(&batch.events[skip..]))
            };
            if client.queued_bytes + frame.len() > self.options.client_queue_bytes {
                client.dropped += n;
                counters.events_dropped.fetch_add(n, Ordering::Relaxed);
                client.resync = true;
                continue;
            }
            client.push(frame);
            counters.events_sent.fetch_add(n, Ordering::Relaxed);
        }
        full
    }

    /// Sends table additions before events that refer to entries clients do not know.
    fn send_tables(&mut self, events: &[Event]) {
        if !self.known.lacks_any(events) {
            return;
        }
        let frame = Arc::new(json_frame(FrameKind::Tables, &self.known.pull(&self.alloc)));
        for client in &mut self.clients {
            if !client.fresh {
                client.push(Arc::clone(&frame));
            }
        }
    }

    fn send_stats(&mut self) {
        if self
            .last_stats
            .is_some_and(|t| t.elapsed() < self.options.stats_interval)
        {
            return;
        }
        self.last_stats = Some(Instant::now());
        let batch = self.alloc.events_since(u64::MAX, 0);
        let now_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            .saturating_sub(self.alloc.epoch_unix_ns());
        for client in &mut self.clients {
            if client.fresh || client.queued_bytes >= self.options.client_queue_bytes {
                continue;
            }
            let frame = StatsFrame {
                stats: batch.stats,
                step: batch.step,
                next_seq: self.next_seq,
                dropped_events: client.dropped,
                time_ns: now_ns,
            };
            client.push(Arc::new(json_frame(FrameKind::Stats, &frame)));
        }
    }

    fn reap(&mut self) {
        let queued: usize = self.clients.iter().map(|c| c.queued_bytes).sum();
        self.shared
            .counters
            .queued_bytes
            .store(queued as u64, Ordering::Relaxed);
        let before = self.clients.len();
        self.clients.retain(|c| !c.dead);
        if self.clients.len() != before {
            self.shared
                .counters
                .clients
                .store(self.clients.len() as u64, Ordering::Relaxed);
        }
    }

    /// Sends `Bye` and gives each client up to 200 ms to take what is queued.
    fn say_goodbye(&mut self) {
        let bye = Arc::new(encode_frame(FrameKind::Bye, &[]));
        for client in &mut self.clients {
            client.push(Arc::clone(&bye));
        }
        let deadline = Instant::now() + Duration::from_millis(200);
        while Instant::now() < deadline && self.clients.iter().any(|c| !c.queue.is_empty()) {
            for client in &mut self.clients {
                client.flush();
            }
            self.clients.retain(|c| !c.dead);
            std::thread::sleep(Duration::from_millis(1));
        }
        for client in &self.clients {
            let _ = client.conn.shutdown(std::net::Shutdown::Both);
        }
        self.clients.clear();
        self.shared.counters.clients.store(0, Ordering::Relaxed);
    }
}

/// The frames that carry one snapshot: its JSON document in parts, then its history events.
fn snapshot_frames(snapshot: Snapshot, next_seq: u64, history: &[Event]) -> Vec<Arc<Vec<u8>>> {
    let doc = SnapshotDoc {
        next_seq,
        history: history.len() as u64,
        snapshot,
    };
    let json = serde_json::to_vec(&doc).unwrap_or_default();
    let mut frames = Vec::new();
    let mut parts = json.chunks(MAX_FRAME_BYTES).peekable();
    if parts.peek().is_none() {
        frames.push(Arc::new(encode_frame(FrameKind::SnapshotEnd, &[])));
    }
    while let Some(part) = parts.next() {
        let kind = if parts.peek().is_some() {
            FrameKind::SnapshotPart
        } else {
            FrameKind::SnapshotEnd
        };
        frames.push(Arc::new(encode_frame(kind, part)));
    }
    for chunk in history.chunks(HISTORY_CHUNK.min(MAX_EVENTS_PER_FRAME)) {
        frames.push(Arc::new(encode_events(chunk)));
    }
    frames
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, kind: EventKind) -> Event {
        Event {
            seq,
            time_ns: seq * 10,
            kind,
            device: 1,
            stream: 7,
            addr: 0x1000 + seq,
            size: 512 * seq,
            requested: 500,
            site: Some(3),
            tag: None,
            scope: Some(2),
            step: 4,
            thread: 9,
        }
    }

    #[test]
    fn event_records_round_trip_every_kind() {
        let kinds = [
            EventKind::Alloc,
            EventKind::FreeRequested,
            EventKind::FreeCompleted,
            EventKind::SegmentAlloc,
            EventKind::SegmentFree,
            EventKind::SegmentMap,
            EventKind::SegmentUnmap,
            EventKind::EmptyCache,
            EventKind::Oom,
            EventKind::Transfer(TransferDirection::HostToDevice),
            EventKind::Transfer(TransferDirection::DeviceToHost),
            EventKind::Transfer(TransferDirection::DeviceToDevice),
            EventKind::Sync,
            EventKind::Step,
            EventKind::Snapshot,
        ];
        let events: Vec<Event> = kinds
            .iter()
            .enumerate()
            .map(|(i, &k)| event(i as u64, k))
            .collect();
        let frame = encode_events(&events);
        assert_eq!(
            frame.len(),
            HEADER_BYTES + 4 + events.len() * EVENT_RECORD_BYTES
        );
        let mut reader = FrameReader::new(&frame[..]);
        assert_eq!(reader.next_frame().unwrap(), Frame::Events(events));
        assert!(matches!(reader.next_frame(), Err(TelemetryError::Closed)));
    }

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
