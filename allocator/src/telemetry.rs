//! The publisher of live telemetry: streams an allocator's events to dashboards over a local
//! socket.
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
//! in a `Refused` frame before the connection closes, unless a client that has read nothing
//! for a second or more gives up its place; a client that reads nothing for
//! `ServeOptions::idle_timeout` while bytes wait for it is closed, so that connections that
//! never read cannot keep a dashboard out. The protocol is read-only: the publisher never reads
//! what a client sends.
//!
//! The loop that does all this is the `vramscope-telemetry` crate's
//! ([`vramscope_telemetry::publish`]), shared with the Python package's publisher for
//! PyTorch's own allocator; this module is its [`Source`] over a [`CachingAllocator`] (the
//! ring, the allocator's snapshot, its call-site tables and statistics) and the [`Telemetry`]
//! handle around it. The frames, and the client that dashboards read them with, are that
//! crate's too ([`vramscope_telemetry::wire`]).

use vramscope_model::DeviceInfo;
use vramscope_telemetry::publish::{hello, Attach, Batch, Publisher, Reading, Source};
use vramscope_telemetry::serve::Listener;
use vramscope_telemetry::{
    Hello, KnownTables, TablesFrame, TelemetryAddr, TelemetryError, ENV_ALLOW_REMOTE, ENV_LISTEN,
};

use vramscope_caching::Backend;
use vramscope_caching::CachingAllocator;

pub use vramscope_telemetry::publish::{IdleWatch, PublisherStats, ServeOptions};

/// A running publisher. Dropping it (or [`Telemetry::shutdown`]) says goodbye to the clients,
/// stops the thread and removes the Unix socket.
pub struct Telemetry {
    publisher: Publisher,
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
        let mut options = ServeOptions::default();
        options.allow_remote = std::env::var(ENV_ALLOW_REMOTE).is_ok_and(|v| v.trim() == "1");
        Telemetry::serve_with(alloc, &addr, options).map(Some)
    }

    /// Starts publishing `alloc`'s events on `addr` with `options`.
    pub fn serve_with<B: Backend>(
        alloc: &CachingAllocator<B>,
        addr: &TelemetryAddr,
        options: ServeOptions,
    ) -> Result<Telemetry, TelemetryError> {
        let listener = Listener::bind(addr, options.allow_remote)?;
        let source = AllocatorSource {
            alloc: alloc.clone(),
            next_seq: 0,
        };
        let publisher = Publisher::start(source, listener, options)?;
        Ok(Telemetry { publisher })
    }

    /// The address clients connect to (for `tcp:127.0.0.1:0`, the port the system chose).
    pub fn addr(&self) -> &TelemetryAddr {
        self.publisher.addr()
    }

    /// The publisher's counters.
    pub fn stats(&self) -> PublisherStats {
        self.publisher.stats()
    }

    /// Says goodbye to the clients, stops the publisher thread and removes the socket.
    pub fn shutdown(self) {
        self.publisher.close();
    }
}

/// A [`CachingAllocator`] as the publisher loop reads it: the ring by sequence number, the
/// snapshot with its history, the call-site tables, the statistics.
struct AllocatorSource<B: Backend> {
    alloc: CachingAllocator<B>,
    /// The sequence number the last pull said to ask for next: a snapshot without history
    /// (events not recorded) follows it.
    next_seq: u64,
}

impl<B: Backend> Source for AllocatorSource<B> {
    fn hello(&mut self) -> Hello {
        let backend = self.alloc.backend();
        let device = DeviceInfo {
            index: self.alloc.device(),
            name: backend.name(),
            backend: backend.kind().to_string(),
            capacity: backend.mem_info().total,
        };
        hello(
            device,
            self.alloc.epoch_unix_ns(),
            self.alloc.config().clone(),
        )
    }

    fn snapshot(&mut self, history: usize) -> Attach {
        let snapshot = self.alloc.snapshot_with_history(history);
        let next_seq = snapshot.events.last().map_or(self.next_seq, |e| e.seq + 1);
        Attach { snapshot, next_seq }
    }

    fn events_since(&mut self, seq: u64, max: usize) -> Batch {
        let batch = self.alloc.events_since(seq, max);
        self.next_seq = batch.next_seq;
        Batch {
            events: batch.events,
            next_seq: batch.next_seq,
            missed: batch.missed,
        }
    }

    fn tables_since(&mut self, known: KnownTables) -> TablesFrame {
        pull_tables(&mut { known }, &self.alloc)
    }

    fn stats(&mut self) -> Reading {
        let batch = self.alloc.events_since(u64::MAX, 0);
        Reading {
            stats: batch.stats,
            step: batch.step,
        }
    }
}

/// The call-site, tag and scope table additions `alloc` has beyond what `known` holds, which
/// then become known: the `Tables` frame a dashboard needs before events that refer to them.
/// Only the additions are copied under the allocator's lock, and they are symbolized outside
/// it ([`CachingAllocator::site_tables_since`]).
pub fn pull_tables<B: Backend>(
    known: &mut KnownTables,
    alloc: &CachingAllocator<B>,
) -> TablesFrame {
    let added = alloc.site_tables_since(known.sites, known.tags, known.scopes);
    known.advance(added.sites, added.tags, added.scopes)
}
