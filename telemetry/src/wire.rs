//! The frames of the telemetry protocol: their kinds and limits, the JSON and binary payloads,
//! encoding for the publisher, and [`FrameReader`], which checks every frame a client reads.
//! The crate documentation describes the format byte by byte; this module is its one
//! implementation, shared by the publisher (`vramscope_allocator::telemetry`) and the client
//! ([`crate::TelemetryClient`]).

use std::fmt;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::ENV_ALLOW_REMOTE;
use vramscope_model::{
    device_refusal, event_device, event_step, step_refusal, AllocatorConfig, CallSite, DeviceInfo,
    Event, EventKind, Id, MemoryStats, Snapshot, TransferDirection,
};

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
/// The most a client holds for one connection's snapshot (256 MiB): the snapshot document while
/// it is reassembled, the history events it announces (each counted at
/// [`EVENT_RECORD_BYTES`], before any of them arrives) and every table addition after it (each
/// `Tables` frame at its payload's bytes), together. A publisher that would make a client hold
/// more breaks the protocol: [`FrameReader`] refuses with [`TelemetryError::OverLimit`] and
/// nothing past the limit is ever reserved. A new snapshot starts the count again (the
/// dashboard replaces the old one with it). Events that stream after the snapshot are not
/// counted here: the dashboard keeps a bounded number of them (it drops its oldest).
pub const CLIENT_BUFFER_BYTES: usize = 256 << 20;
/// Bytes per event record in an `Events` frame.
pub const EVENT_RECORD_BYTES: usize = 80;
/// Events per `Events` frame in the history that follows a snapshot.
const HISTORY_CHUNK: usize = 65_536;
/// The most events that fit in one frame.
const MAX_EVENTS_PER_FRAME: usize = (MAX_FRAME_BYTES - 4) / EVENT_RECORD_BYTES;
/// An absent id on the wire: the one index an [`Id`] cannot hold.
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
    /// The publisher would make this client hold more than its limit
    /// ([`CLIENT_BUFFER_BYTES`], or the one given to [`FrameReader::with_limit`]).
    OverLimit {
        /// What would be held: "a snapshot's history of 4611686018427387904 events", ….
        what: String,
        /// The bytes the client would hold with it.
        bytes: u64,
        /// The limit in bytes.
        limit: usize,
    },
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
            TelemetryError::OverLimit { what, bytes, limit } => write!(
                f,
                "the telemetry publisher sent more than a dashboard holds: {what} would make it hold {bytes} bytes, over the limit of {limit} bytes"
            ),
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
        events.iter().any(|e| {
            new(e.site(), self.sites) || new(e.tag(), self.tags) || new(e.scope(), self.scopes)
        })
    }

    /// Records table additions that follow what is known (call sites, tags and scopes, each
    /// starting at the index this record knows), which then become known, and returns them as
    /// the frame that carries them. The publisher takes the additions from the allocator
    /// (`vramscope_allocator::pull_tables`).
    pub fn advance(
        &mut self,
        sites: Vec<CallSite>,
        tags: Vec<String>,
        scopes: Vec<String>,
    ) -> TablesFrame {
        let frame = TablesFrame {
            sites_from: self.sites as u32,
            tags_from: self.tags as u32,
            scopes_from: self.scopes as u32,
            sites,
            tags,
            scopes,
        };
        self.sites += frame.sites.len();
        self.tags += frame.tags.len();
        self.scopes += frame.scopes.len();
        frame
    }

    /// At least what `snapshot`'s tables hold.
    pub fn include(&mut self, snapshot: &Snapshot) {
        self.sites = self.sites.max(snapshot.sites.len());
        self.tags = self.tags.max(snapshot.tags.len());
        self.scopes = self.scopes.max(snapshot.scopes.len());
    }
}

impl TablesFrame {
    /// Checks that every list that adds entries starts at the next index of its table, as
    /// `known` counts them (an empty list's offset says nothing and is not checked), and
    /// returns the counts with the additions. A gap or an overlap is the publisher's error:
    /// the message names the table, the offset and the index expected.
    pub fn follows(&self, known: &KnownTables) -> Result<KnownTables, String> {
        let check = |name: &str, from: u32, added: usize, known: usize| {
            if added == 0 || from as usize == known {
                Ok(known + added)
            } else {
                Err(format!(
                    "{name}_from is {from} but the next {name} index is {known}: tables only grow by their next entries"
                ))
            }
        };
        Ok(KnownTables {
            sites: check("sites", self.sites_from, self.sites.len(), known.sites)?,
            tags: check("tags", self.tags_from, self.tags.len(), known.tags)?,
            scopes: check("scopes", self.scopes_from, self.scopes.len(), known.scopes)?,
        })
    }

    /// Appends the entries to `snapshot`'s tables. A list that does not start at the next
    /// index of its table (see [`TablesFrame::follows`], which [`FrameReader`] holds every
    /// frame to) is left out whole: no gap is ever filled and no entry replaced, so the work
    /// and memory are those of the frame's own entries.
    pub fn apply_to(&self, snapshot: &mut Snapshot) {
        fn put<T: Clone>(table: &mut Vec<T>, from: u32, items: &[T]) {
            if from as usize == table.len() {
                table.extend_from_slice(items);
            }
        }
        put(&mut snapshot.sites, self.sites_from, &self.sites);
        put(&mut snapshot.tags, self.tags_from, &self.tags);
        put(&mut snapshot.scopes, self.scopes_from, &self.scopes);
    }
}

/// One decoded frame, as `TelemetryClient::next_frame` (feature `client`) returns it.
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

/// The JSON document a snapshot's `SnapshotPart`/`SnapshotEnd` frames carry.
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
pub fn serialized_len<T: Serialize>(value: &T) -> usize {
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

/// Encodes one frame whose payload is `value` as JSON.
pub fn json_frame<T: Serialize>(kind: FrameKind, value: &T) -> Vec<u8> {
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
    // An `oom` has no block: its address slot carries the device's free memory.
    let addr = if e.kind == EventKind::Oom {
        e.device_free
    } else {
        e.addr
    };
    let words = [
        e.seq,
        e.time_ns,
        addr,
        e.size,
        e.requested,
        e.stream,
        u64::from(e.step),
    ];
    for (i, v) in words.iter().enumerate() {
        r[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
    }
    let ids = [
        e.site().unwrap_or(NO_ID),
        e.tag().unwrap_or(NO_ID),
        e.scope().unwrap_or(NO_ID),
        e.thread,
        u32::from(e.device),
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
        let id = |o: usize| Id::new(u32_at(o));
        let kind = kind_from_code(r[76], r[77]).ok_or_else(|| {
            malformed(format!("event {i} has unknown kind {} / {}", r[76], r[77]))
        })?;
        let oom = kind == EventKind::Oom;
        let device = u64::from(u32_at(72));
        let device = event_device(device)
            .ok_or_else(|| malformed(format!("event {i}: {}", device_refusal(device))))?;
        let step = u64_at(48);
        let step = event_step(step)
            .ok_or_else(|| malformed(format!("event {i}: {}", step_refusal(step))))?;
        events.push(Event {
            seq: u64_at(0),
            time_ns: u64_at(8),
            addr: if oom { 0 } else { u64_at(16) },
            size: u64_at(24),
            requested: u64_at(32),
            stream: u64_at(40),
            step,
            site: id(56),
            tag: id(60),
            scope: id(64),
            thread: u32_at(68),
            device,
            kind,
            device_free: if oom { u64_at(16) } else { 0 },
        });
    }
    Ok(events)
}

/// Reads and checks frames from any byte stream; `TelemetryClient` (feature `client`) wraps one
/// around a socket.
///
/// Besides each frame's own checks it holds the connection to the protocol's promises: the
/// table additions after a snapshot follow on from its tables without gaps
/// ([`TablesFrame::follows`]), and what the client holds for one snapshot (its document, its
/// announced history, the table additions after it) stays within one limit
/// ([`CLIENT_BUFFER_BYTES`]). What is announced is checked before anything is reserved for it.
pub struct FrameReader<R: Read> {
    reader: R,
    snapshot: Vec<u8>,
    pending: Option<(u64, u64, Box<Snapshot>)>,
    /// The table lengths the client knows: the last snapshot's and the additions since.
    known: KnownTables,
    /// Bytes counted against `limit` since the last snapshot began.
    held: u64,
    limit: usize,
}

impl<R: Read> FrameReader<R> {
    /// A reader of frames from `reader`, holding at most [`CLIENT_BUFFER_BYTES`].
    pub fn new(reader: R) -> FrameReader<R> {
        FrameReader::with_limit(reader, CLIENT_BUFFER_BYTES)
    }

    /// A reader of frames from `reader` that holds at most `limit` bytes for one snapshot,
    /// its history and the table additions after it (see [`CLIENT_BUFFER_BYTES`]).
    pub fn with_limit(reader: R, limit: usize) -> FrameReader<R> {
        FrameReader {
            reader,
            snapshot: Vec::new(),
            pending: None,
            known: KnownTables::default(),
            held: 0,
            limit,
        }
    }

    /// The bytes counted against the limit now: those of the snapshot being reassembled or
    /// last read, its history, and the table additions since.
    pub fn held_bytes(&self) -> u64 {
        self.held
    }

    /// The table lengths the client knows now: the last snapshot's tables and the additions
    /// read since.
    pub fn known_tables(&self) -> KnownTables {
        self.known
    }

    /// Counts `bytes` more against the limit, or refuses them naming `what`.
    fn hold(&mut self, what: impl FnOnce() -> String, bytes: u64) -> Result<(), TelemetryError> {
        let total = self.held.saturating_add(bytes);
        if total > self.limit as u64 {
            return Err(TelemetryError::OverLimit {
                what: what(),
                bytes: total,
                limit: self.limit,
            });
        }
        self.held = total;
        Ok(())
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
    /// events collected before it is returned; frames of unknown kinds are skipped. A frame
    /// that breaks the protocol (table additions that leave a gap, more than the limit held)
    /// is an error: the connection is of no more use.
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
                    if self.snapshot.is_empty() {
                        // A new snapshot: the dashboard replaces what it held with it.
                        self.held = 0;
                    }
                    if self.snapshot.len() + payload.len() > MAX_SNAPSHOT_BYTES {
                        let len = self.snapshot.len() + payload.len();
                        self.snapshot = Vec::new();
                        return Err(TelemetryError::Oversized {
                            len,
                            limit: MAX_SNAPSHOT_BYTES,
                        });
                    }
                    let len = self.snapshot.len() + payload.len();
                    if let Err(e) = self.hold(
                        || format!("a snapshot document of {len} bytes"),
                        payload.len() as u64,
                    ) {
                        self.snapshot = Vec::new();
                        return Err(e);
                    }
                    self.snapshot.extend_from_slice(&payload);
                    if kind == FrameKind::SnapshotPart {
                        continue;
                    }
                    let doc = std::mem::take(&mut self.snapshot);
                    let doc: SnapshotDoc =
                        serde_json::from_slice(&doc).map_err(|e| malformed(e.to_string()))?;
                    // The history is counted as announced, before any of it arrives: a
                    // publisher cannot make the client wait for, or reserve, more than fits.
                    let history = doc.history;
                    self.hold(
                        || format!("a snapshot's history of {history} events"),
                        history.saturating_mul(EVENT_RECORD_BYTES as u64),
                    )?;
                    let mut snapshot = Box::new(doc.snapshot);
                    snapshot.events.clear();
                    self.known = KnownTables {
                        sites: snapshot.sites.len(),
                        tags: snapshot.tags.len(),
                        scopes: snapshot.scopes.len(),
                    };
                    if history == 0 {
                        return Ok(Frame::Snapshot {
                            next_seq: doc.next_seq,
                            snapshot,
                        });
                    }
                    self.pending = Some((doc.next_seq, history, snapshot));
                }
                FrameKind::Events => {
                    let events = decode_events(&payload)?;
                    let Some((next_seq, history, mut snapshot)) = self.pending.take() else {
                        return Ok(Frame::Events(events));
                    };
                    // At most the limit's worth of events (checked when announced) fits.
                    let wanted = history - snapshot.events.len() as u64;
                    if events.len() as u64 > wanted {
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
                    let known = tables.follows(&self.known).map_err(malformed)?;
                    let (sites, tags, scopes) =
                        (tables.sites.len(), tables.tags.len(), tables.scopes.len());
                    self.hold(
                        || {
                            format!(
                                "table additions ({sites} call sites, {tags} tags, {scopes} scopes in a frame of {} bytes)",
                                payload.len()
                            )
                        },
                        payload.len() as u64,
                    )?;
                    self.known = known;
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

/// The payload of a `Refused` frame.
#[derive(Serialize, Deserialize)]
struct Refusal {
    reason: String,
}

/// Encodes the `Refused` frame that tells a client why the publisher turned it away.
pub fn refused_frame(reason: String) -> Vec<u8> {
    json_frame(FrameKind::Refused, &Refusal { reason })
}

/// The frames that carry one snapshot: its JSON document in parts, then its history events.
pub fn snapshot_frames(snapshot: &Snapshot, next_seq: u64, history: &[Event]) -> Vec<Arc<Vec<u8>>> {
    /// [`SnapshotDoc`] as written: the snapshot borrowed.
    #[derive(Serialize)]
    struct Written<'a> {
        next_seq: u64,
        history: u64,
        snapshot: &'a Snapshot,
    }
    let doc = Written {
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
        let oom = kind == EventKind::Oom;
        Event {
            seq,
            time_ns: seq * 10,
            kind,
            device: 1,
            stream: 7,
            addr: if oom { 0 } else { 0x1000 + seq },
            size: 512 * seq,
            requested: 500,
            site: Id::new(3),
            tag: None,
            scope: Id::new(2),
            step: 4,
            thread: 9,
            device_free: if oom { 0x1000 + seq } else { 0 },
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

    /// A record's device past the devices a snapshot may name is refused in the words every
    /// reader uses, not cut to two bytes.
    #[test]
    fn a_device_past_the_limit_is_malformed() {
        let mut payload = two_events_payload();
        let device = 4 + EVENT_RECORD_BYTES + 72;
        for bad in [300u32, 70_000] {
            payload[device..device + 4].copy_from_slice(&bad.to_le_bytes());
            let message = decode_events(&payload).unwrap_err().to_string();
            assert!(
                message.contains(&format!("event 1: device {bad} is out of range")),
                "{message}"
            );
        }
        payload[device..device + 4].copy_from_slice(&255u32.to_le_bytes());
        assert_eq!(decode_events(&payload).unwrap()[1].device, 255);
    }

    /// The payload of an `Events` frame of two allocations, to corrupt the second's record
    /// (which starts at `4 + EVENT_RECORD_BYTES`).
    fn two_events_payload() -> Vec<u8> {
        let events = [event(1, EventKind::Alloc), event(2, EventKind::Alloc)];
        encode_events(&events)[HEADER_BYTES..].to_vec()
    }

    /// The wire carries a step in eight bytes and an event holds it in four: a frame with a
    /// step past them is malformed, in `step_refusal`'s words, and the largest that fits
    /// comes through.
    #[test]
    fn a_step_past_four_bytes_is_malformed() {
        let mut payload = two_events_payload();
        let step = 4 + EVENT_RECORD_BYTES + 48;
        for bad in [1u64 << 32, u64::MAX] {
            payload[step..step + 8].copy_from_slice(&bad.to_le_bytes());
            let message = decode_events(&payload).unwrap_err().to_string();
            assert!(
                message.contains(&format!("event 1: step {bad} is out of range")),
                "{message}"
            );
        }
        payload[step..step + 8].copy_from_slice(&u64::from(u32::MAX).to_le_bytes());
        assert_eq!(decode_events(&payload).unwrap()[1].step, u32::MAX);
    }

    /// The bytes of a snapshot document announcing `history` events, over an empty snapshot
    /// with `sites` call sites, as one `SnapshotEnd` frame.
    fn snapshot_end(history: u64, sites: usize) -> Vec<u8> {
        let mut snapshot = Snapshot::empty(Default::default(), Default::default());
        snapshot.sites = (0..sites).map(|i| site(&format!("s{i}.py"))).collect();
        let doc = format!(
            r#"{{"next_seq":0,"history":{history},"snapshot":{}}}"#,
            serde_json::to_string(&snapshot).unwrap()
        );
        encode_frame(FrameKind::SnapshotEnd, doc.as_bytes())
    }

    fn site(file: &str) -> CallSite {
        CallSite {
            file: file.to_string(),
            line: 1,
            column: 0,
            function: String::new(),
            frames: Vec::new(),
        }
    }

    /// A `Tables` frame written out as JSON text, as a hostile publisher would.
    fn tables_frame(json: &str) -> Vec<u8> {
        encode_frame(FrameKind::Tables, json.as_bytes())
    }

    /// Issue 33: a 150-byte `Tables` frame whose offset leaves a gap of 10^8 call sites (or
    /// 2^32 - 1 tags) used to make the dashboard fill the gap with placeholders (10 GB). It is
    /// a protocol error naming the table and the index expected, and nothing is held for it.
    #[test]
    fn a_tables_frame_with_a_gap_is_a_protocol_error() {
        let gaps = [
            (
                r#"{"sites_from":100000000,"sites":[{"file":"x.py","line":1}],"tags_from":0,"tags":[],"scopes_from":0,"scopes":[]}"#,
                "sites_from is 100000000 but the next sites index is 0",
            ),
            (
                r#"{"sites_from":0,"sites":[],"tags_from":4294967295,"tags":["t"],"scopes_from":0,"scopes":[]}"#,
                "tags_from is 4294967295 but the next tags index is 0",
            ),
            (
                r#"{"sites_from":0,"sites":[],"tags_from":0,"tags":[],"scopes_from":7,"scopes":["a/b"]}"#,
                "scopes_from is 7 but the next scopes index is 0",
            ),
        ];
        for (json, words) in gaps {
            let frame = tables_frame(json);
            assert!(frame.len() < 160, "{} bytes", frame.len());
            let mut reader = FrameReader::new(&frame[..]);
            let err = reader.next_frame().unwrap_err();
            assert!(
                matches!(
                    err,
                    TelemetryError::Malformed {
                        kind: FrameKind::Tables,
                        ..
                    }
                ),
                "{err:?}"
            );
            assert!(err.to_string().contains(words), "{err}");
            assert_eq!(reader.held_bytes(), 0);
            assert_eq!(reader.known_tables(), KnownTables::default());
        }
        // Applied directly, such a frame adds nothing either.
        let gap: TablesFrame = serde_json::from_str(gaps[0].0).unwrap();
        let mut snapshot = Snapshot::empty(Default::default(), Default::default());
        gap.apply_to(&mut snapshot);
        assert!(snapshot.sites.is_empty());
    }

    /// After a snapshot of two call sites the next addition starts at index 2: one that does
    /// is read (the tables then count 3), one that overlaps is refused, and an empty list's
    /// offset (the Python publisher leaves `tags_from` at 0) says nothing.
    #[test]
    fn table_additions_follow_on_from_the_snapshot() {
        let mut stream = snapshot_end(0, 2);
        stream.extend(tables_frame(
            r#"{"sites_from":2,"sites":[{"file":"c.py","line":3}],"tags_from":0,"tags":[],"scopes_from":9,"scopes":[]}"#,
        ));
        stream.extend(tables_frame(
            r#"{"sites_from":1,"sites":[{"file":"d.py","line":4}],"tags_from":0,"tags":[],"scopes_from":0,"scopes":[]}"#,
        ));
        let mut reader = FrameReader::new(&stream[..]);
        let Frame::Snapshot { mut snapshot, .. } = reader.next_frame().unwrap() else {
            panic!("a snapshot first")
        };
        assert_eq!(reader.known_tables().sites, 2);
        let Frame::Tables(tables) = reader.next_frame().unwrap() else {
            panic!("the additions")
        };
        tables.apply_to(&mut snapshot);
        assert_eq!(snapshot.sites.len(), 3);
        assert_eq!(snapshot.sites[2].file, "c.py");
        assert_eq!(reader.known_tables().sites, 3);
        let err = reader.next_frame().unwrap_err().to_string();
        assert!(
            err.contains("sites_from is 1 but the next sites index is 3"),
            "{err}"
        );
    }

    /// Issue 33: a snapshot announcing 2^62 history events, followed by events, used to grow
    /// the reader's pending history at wire speed. The announcement alone is refused, before
    /// any event is read or anything reserved for them; a history that fits is read.
    #[test]
    fn an_announced_history_past_the_limit_is_refused_before_any_event() {
        for history in [
            1u64 << 62,
            u64::MAX,
            (CLIENT_BUFFER_BYTES / EVENT_RECORD_BYTES) as u64,
        ] {
            let mut stream = snapshot_end(history, 0);
            stream.extend(encode_events(&[event(0, EventKind::Alloc)]));
            let mut reader = FrameReader::new(&stream[..]);
            let err = reader.next_frame().unwrap_err();
            let TelemetryError::OverLimit { bytes, limit, .. } = &err else {
                panic!("{err:?}")
            };
            assert!(*bytes > *limit as u64);
            assert_eq!(*limit, CLIENT_BUFFER_BYTES);
            let text = err.to_string();
            assert!(
                text.contains(&format!("a snapshot's history of {history} events")),
                "{text}"
            );
            assert!(reader.held_bytes() <= CLIENT_BUFFER_BYTES as u64);
        }
        let mut stream = snapshot_end(2, 0);
        stream.extend(encode_events(&[event(0, EventKind::Alloc)]));
        stream.extend(encode_events(&[event(1, EventKind::Alloc)]));
        let mut reader = FrameReader::new(&stream[..]);
        let Frame::Snapshot { snapshot, .. } = reader.next_frame().unwrap() else {
            panic!("a snapshot")
        };
        assert_eq!(snapshot.events.len(), 2);
    }

    /// The snapshot document, its history and the table additions after it count against
    /// one limit: additions past it are refused with the figures, the count never passes the
    /// limit, and a new snapshot starts the count again.
    #[test]
    fn everything_held_counts_against_one_limit() {
        let limit = 64 << 10;
        let addition = |from: usize| {
            let sites: Vec<CallSite> = (0..50)
                .map(|i| site(&format!("f{}.py", from + i)))
                .collect();
            json_frame(
                FrameKind::Tables,
                &TablesFrame {
                    sites_from: from as u32,
                    sites,
                    ..TablesFrame::default()
                },
            )
        };
        let mut stream = snapshot_end(3, 0);
        for seq in 0..3 {
            stream.extend(encode_events(&[event(seq, EventKind::Alloc)]));
        }
        for k in 0..100 {
            stream.extend(addition(k * 50));
        }
        let mut reader = FrameReader::with_limit(&stream[..], limit);
        assert!(matches!(reader.next_frame(), Ok(Frame::Snapshot { .. })));
        let mut additions = 0;
        let err = loop {
            match reader.next_frame() {
                Ok(Frame::Tables(_)) => additions += 1,
                Ok(other) => panic!("{other:?}"),
                Err(e) => break e,
            }
            assert!(reader.held_bytes() <= limit as u64);
        };
        assert!(additions > 5 && additions < 100, "{additions} additions");
        assert!(matches!(err, TelemetryError::OverLimit { limit: l, .. } if l == limit));
        assert!(
            err.to_string().contains("table additions (50 call sites"),
            "{err}"
        );
        // A new snapshot replaces what was held.
        let mut stream = snapshot_end(0, 0);
        for k in 0..5 {
            stream.extend(addition(k * 50));
        }
        stream.extend(snapshot_end(0, 0));
        stream.extend(addition(0));
        let mut reader = FrameReader::with_limit(&stream[..], limit);
        for _ in 0..6 {
            reader.next_frame().unwrap();
        }
        let held = reader.held_bytes();
        assert!(matches!(reader.next_frame(), Ok(Frame::Snapshot { .. })));
        assert!(reader.held_bytes() < held);
        assert!(matches!(reader.next_frame(), Ok(Frame::Tables(_))));
    }
}
