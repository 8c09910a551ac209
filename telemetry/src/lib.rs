//! vramscope-telemetry: the wire format of vramscope's live telemetry, the one publisher loop
//! that writes it, and the client that dashboards read it with.
//!
//! A program that uses vramscope's caching allocator publishes its events with
//! `vramscope_allocator::Telemetry`, and the Python package publishes PyTorch's own allocator
//! with its `LivePublisher`; both are a [`publish::Source`] served by the same loop
//! ([`publish::Publisher`]: one background thread; the program never waits for a dashboard).
//! This crate is what all ends share: the frames and their checked encoding ([`wire`]), the
//! addresses publishers listen on ([`TelemetryAddr`]), the listener and bounded per-client
//! queue ([`serve`]), the publisher loop ([`publish`]), and, with the `client` feature,
//! [`TelemetryClient`], the reading side that `vramscope top` and `vramscope view` use. It
//! depends on the data model alone: a program links the publisher and the wire format, never
//! the client; a dashboard links the client and the wire format, never a publisher's source.
//!

//! # Wire format (protocol version 1)
//!
//! A connection is a sequence of frames. Each frame is an 8-byte header followed by a payload:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic `b"VS"` |
//! | 2 | 1 | protocol version, [`PROTOCOL_VERSION`](wire::PROTOCOL_VERSION) |
//! | 3 | 1 | frame kind ([`FrameKind`]) |
//! | 4 | 4 | payload length in bytes, little-endian `u32`, at most [`MAX_FRAME_BYTES`](wire::MAX_FRAME_BYTES) |
//!
//! Payloads by kind:
//!
//! - `Hello` (1), JSON [`Hello`]: the first frame of every connection.
//! - `SnapshotPart` (2) and `SnapshotEnd` (3): the pieces of one JSON document
//!   `{"next_seq": S, "history": H, "snapshot": Snapshot}`, split so that no frame exceeds the
//!   limit (the whole document is limited to [`MAX_SNAPSHOT_BYTES`](wire::MAX_SNAPSHOT_BYTES)). The snapshot's `events`
//!   are empty in the JSON; the `H` events that precede sequence number `S` follow in `Events`
//!   frames and belong to the snapshot. Sent after `Hello`, and again whenever the client has
//!   lost events.
//! - `Events` (4), binary: a little-endian `u32` count, then that many records of
//!   [`EVENT_RECORD_BYTES`](wire::EVENT_RECORD_BYTES) bytes each: `seq`, `time_ns`, `addr`, `size`, `requested`, `stream`,
//!   `step` (each `u64`), `site`, `tag`, `scope` (each `u32`, `u32::MAX` for none), `thread`,
//!   `device` (each `u32`), the kind (`u8`, see the `EventKind` codes in [`wire`]), the transfer
//!   direction (`u8`) and two bytes of padding. An `oom` has no block: its `addr` slot carries
//!   the event's `device_free`.
//! - `Tables` (5), JSON [`TablesFrame`]: call sites, tags and scopes added since the client's
//!   snapshot, sent before the first event that refers to them. Each list that adds entries
//!   starts at the next index of its table (the snapshot's length, plus the additions since):
//!   a gap or an overlap is a protocol error.
//! - `Stats` (6), JSON [`StatsFrame`]: the statistics, ten times a second.
//! - `Bye` (7), empty: the publisher is shutting down.
//! - `Refused` (8), JSON `{"reason": "..."}`: the publisher turned this client away (too many
//!   dashboards attached); the only frame of such a connection, after `Hello`.
//!
//! A reader rejects a frame with the wrong magic, another protocol version, a payload over the
//! limit, or a payload that does not parse; it skips frames of unknown kinds, so that later
//! versions may add kinds without breaking older dashboards. It also rejects table additions
//! that do not follow on, and a connection that would make it hold more than
//! [`CLIENT_BUFFER_BYTES`](wire::CLIENT_BUFFER_BYTES) for one snapshot: the document, the
//! history it announces (counted when announced, before any event of it arrives) and the
//! table additions after it, together.

mod addr;
#[cfg(feature = "client")]
mod client;
pub mod publish;
pub mod serve;
pub mod wire;

pub use addr::{TelemetryAddr, ENV_ALLOW_REMOTE, ENV_LISTEN};
#[cfg(feature = "client")]
pub use client::TelemetryClient;
pub use wire::{
    Frame, FrameKind, FrameReader, Hello, KnownTables, StatsFrame, TablesFrame, TelemetryError,
};
