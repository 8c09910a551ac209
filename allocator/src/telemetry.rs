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
//! The frames themselves, and the client that dashboards read them with, are the
//! `vramscope-telemetry` crate's ([`vramscope_telemetry::wire`]); this module is the one
//! writer of them.

use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vramscope_model::{DeviceInfo, Event};
use vramscope_telemetry::serve::{Listener, Outbox};
use vramscope_telemetry::wire::{
    encode_events, encode_frame, json_frame, refused_frame, serialized_len, snapshot_frames,
    EVENT_RECORD_BYTES, PROTOCOL_VERSION,
};
use vramscope_telemetry::{
    FrameKind, Hello, KnownTables, StatsFrame, TablesFrame, TelemetryAddr, TelemetryError,
    ENV_ALLOW_REMOTE, ENV_LISTEN,
};

use vramscope_caching::Backend;
use vramscope_caching::CachingAllocator;

/// Settings of a publisher.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
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
    /// How long a client may read nothing while bytes wait for it before it is closed and its
    /// place freed (10 s), so that connections that never read cannot hold every place a
    /// dashboard could take. A dashboard reads each frame as it comes, so it never waits that
    /// long. On a Unix socket the bytes the client has not read from the socket count (the
    /// system says how many); over TCP only the publisher's own queue does, so there an idle
    /// client is found once the system's socket buffers have filled. A client that connects
    /// while every place is taken takes the place of one that has read nothing for a second or
    /// more, if there is one, instead of being turned away.
    pub idle_timeout: Duration,
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
            idle_timeout: Duration::from_secs(10),
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
    /// Events read from the ring: in batches, or taken into a snapshot while no client was
    /// streaming (the stream then jumps past them).
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
    /// Clients closed for reading nothing for `ServeOptions::idle_timeout`, or to make room
    /// for a new one while they read nothing.
    pub clients_idle: u64,
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
    clients_idle: AtomicU64,
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
        let listener = Listener::bind(addr, options.allow_remote)?;
        let bound = listener.addr().clone();
        let unix = matches!(bound, TelemetryAddr::Unix(_));
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
            unix,
            last_idle_check: Instant::now(),
        };
        let thread = std::thread::Builder::new()
            .name("vramscope-telemetry".to_string())
            .spawn(move || publisher.run());
        // A thread that cannot start drops the publisher, and with it the listener, which
        // removes its socket.
        let thread = thread?;
        Ok(Telemetry {
            addr: bound,
            shared,
            thread: Some(thread),
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
            clients_idle: c.clients_idle.load(Ordering::Relaxed),
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
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long a client may take nothing while its queue is full before it is stalled.
const STALLED_AFTER: Duration = Duration::from_secs(1);

/// How often the publisher looks at what each client has read (`Publisher::close_idle`).
const IDLE_CHECK: Duration = Duration::from_millis(50);

/// One attached dashboard.
struct Client {
    /// Its connection and the frames waiting for it.
    out: Outbox,
    /// Every event before this sequence number is accounted for: in the client's snapshot,
    /// queued for it, or counted as dropped.
    upto: u64,
    dropped: u64,
    /// Set when the client lost events: it gets a fresh snapshot once its queue has drained.
    resync: bool,
    /// Set until the first snapshot is queued.
    fresh: bool,
    /// Whether it reads what it is sent.
    idle: IdleWatch,
}

impl Client {
    fn push(&mut self, frame: Arc<Vec<u8>>) {
        self.out.push(frame);
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
    /// Whether clients connect over a Unix socket, whose unread bytes the system reports.
    unix: bool,
    /// When `close_idle` last looked.
    last_idle_check: Instant,
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
                        && client.out.queued_bytes >= room
                        && client.out.last_progress.elapsed() >= STALLED_AFTER
                    {
                        client.resync = true;
                    }
                }
                if self
                    .clients
                    .iter()
                    .any(|c| !c.fresh && (c.resync || c.out.queued_bytes < room))
                {
                    pulled = self.pull();
                }
                self.send_stats();
                for client in &mut self.clients {
                    client.out.flush();
                    waiting |= !client.out.queue.is_empty();
                }
                self.close_idle();
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
                    if self.clients.len() >= self.options.max_clients && !self.make_room() {
                        self.refuse(conn);
                        continue;
                    }
                    let mut client = Client {
                        out: Outbox::new(conn),
                        upto: 0,
                        dropped: 0,
                        resync: false,
                        fresh: true,
                        idle: IdleWatch::default(),
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

    /// Closes the client that has read nothing for longest, if that is a second or more, to
    /// make room for a new one; whether it did.
    fn make_room(&mut self) -> bool {
        self.close_idle_now();
        if self.clients.iter().filter(|c| !c.out.dead).count() < self.options.max_clients {
            return true;
        }
        let Some((at, idle)) = self
            .clients
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.out.dead)
            .map(|(at, c)| (at, c.idle.idle_for()))
            .max_by_key(|(_, idle)| *idle)
        else {
            return true;
        };
        if idle < STALLED_AFTER.min(self.options.idle_timeout) {
            return false;
        }
        self.close_for_idling(at);
        true
    }

    /// Closes client `at` for reading nothing, and counts it.
    fn close_for_idling(&mut self, at: usize) {
        let client = self.clients.remove(at);
        let _ = client.out.conn.shutdown(std::net::Shutdown::Both);
        let c = &self.shared.counters;
        c.clients_idle.fetch_add(1, Ordering::Relaxed);
        c.clients
            .store(self.clients.len() as u64, Ordering::Relaxed);
    }

    /// Looks, every [`IDLE_CHECK`], at what each client has read, and closes those that have
    /// read nothing for `ServeOptions::idle_timeout` while bytes waited for them.
    fn close_idle(&mut self) {
        if self.last_idle_check.elapsed() >= IDLE_CHECK {
            self.close_idle_now();
        }
    }

    fn close_idle_now(&mut self) {
        let now = Instant::now();
        let checked = self.last_idle_check;
        self.last_idle_check = now;
        let mut at = 0;
        while at < self.clients.len() {
            let client = &mut self.clients[at];
            if client.idle.look(&client.out, self.unix, checked, now) >= self.options.idle_timeout {
                self.close_for_idling(at);
                continue;
            }
            at += 1;
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
        bytes.extend(refused_frame(reason));
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
        let resync = resync_due
            && self
                .clients
                .iter()
                .any(|c| c.resync && c.out.queue.is_empty());
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
        let frames = snapshot_frames(&snapshot, next_seq, history);
        if !had_stream {
            // No client streams: the stream jumps to the snapshot, which took in the events the
            // publisher had not read yet. They count as read, so that every event a client
            // missed (counted as dropped below) was first counted as read.
            let skipped = next_seq.saturating_sub(self.next_seq);
            self.shared
                .counters
                .events_read
                .fetch_add(skipped, Ordering::Relaxed);
            self.next_seq = self.next_seq.max(next_seq);
        }
        for client in &mut self.clients {
            if client.fresh || (client.resync && client.out.queue.is_empty()) {
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
            if client.out.queued_bytes + frame.len() > self.options.client_queue_bytes {
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
        let frame = Arc::new(json_frame(
            FrameKind::Tables,
            &pull_tables(&mut self.known, &self.alloc),
        ));
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
            if client.fresh || client.out.queued_bytes >= self.options.client_queue_bytes {
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
        let queued: usize = self.clients.iter().map(|c| c.out.queued_bytes).sum();
        self.shared
            .counters
            .queued_bytes
            .store(queued as u64, Ordering::Relaxed);
        let before = self.clients.len();
        self.clients.retain(|c| !c.out.dead);
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
        while Instant::now() < deadline && self.clients.iter().any(|c| !c.out.queue.is_empty()) {
            for client in &mut self.clients {
                client.out.flush();
            }
            self.clients.retain(|c| !c.out.dead);
            std::thread::sleep(Duration::from_millis(1));
        }
        for client in &self.clients {
            let _ = client.out.conn.shutdown(std::net::Shutdown::Both);
        }
        self.clients.clear();
        self.shared.counters.clients.store(0, Ordering::Relaxed);
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

/// Whether one client reads what it is sent: how a publisher finds a connection that reads
/// nothing (the allocator's publisher, and the Python package's for PyTorch's allocator). The
/// publisher looks ([`IdleWatch::look`]) every few tens of milliseconds; a client has read
/// something when the bytes it has not read from its Unix socket went down or to nothing (the
/// system reports them), or when the publisher's queue for it drained some while full. Over
/// TCP, whose unread bytes the system does not report, a client with nothing queued counts as
/// reading, so there an idle client is found once the system's socket buffers have filled.
#[derive(Debug)]
pub struct IdleWatch {
    /// Since when the client has read nothing while bytes waited for it.
    since: Instant,
    /// The bytes it had not read from its socket at the last look (Unix sockets).
    unread: usize,
}

impl Default for IdleWatch {
    fn default() -> IdleWatch {
        IdleWatch {
            since: Instant::now(),
            unread: 0,
        }
    }
}

impl IdleWatch {
    /// Looks at what the client behind `out` has read since the previous look, made at
    /// `checked` (`unix`: its connection is a Unix socket); returns how long, as of `now`, it
    /// has read nothing while bytes waited for it.
    pub fn look(&mut self, out: &Outbox, unix: bool, checked: Instant, now: Instant) -> Duration {
        let backlog = !out.queue.is_empty();
        // With bytes left in the publisher's queue the socket was full: a write since the
        // previous look means the client took some.
        let wrote = backlog && out.last_progress > checked;
        let read = match unix.then(|| unread_bytes(&out.conn)).flatten() {
            Some(unread) => {
                let read = (unread == 0 && !backlog) || unread < self.unread || wrote;
                self.unread = unread;
                read
            }
            None => !backlog || wrote,
        };
        if read {
            self.since = now;
        }
        now.saturating_duration_since(self.since)
    }

    /// How long the client has read nothing, as of the last look.
    pub fn idle_for(&self) -> Duration {
        self.since.elapsed()
    }
}

/// The bytes written to the Unix socket `conn` that its peer has not read yet (Linux's
/// `SIOCOUTQ`), where the system says.
#[cfg(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "s390x",
        target_arch = "loongarch64"
    )
))]
fn unread_bytes(conn: &TcpStream) -> Option<usize> {
    use std::os::fd::AsRawFd;
    extern "C" {
        fn ioctl(fd: std::ffi::c_int, request: std::ffi::c_ulong, ...) -> std::ffi::c_int;
    }
    /// `SIOCOUTQ` (`TIOCOUTQ`) on these architectures.
    const SIOCOUTQ: std::ffi::c_ulong = 0x5411;
    let mut unread: std::ffi::c_int = 0;
    // SAFETY: `conn` owns an open socket descriptor for the whole call; SIOCOUTQ writes one
    // `int` through the pointer, which points to a live, aligned `c_int`.
    let rc = unsafe {
        ioctl(
            conn.as_raw_fd(),
            SIOCOUTQ,
            &mut unread as *mut std::ffi::c_int,
        )
    };
    (rc == 0).then(|| usize::try_from(unread).ok()).flatten()
}

/// Where the system does not say (another platform): `None`, and only the publisher's own
/// queue tells an idle client.
#[cfg(not(all(
    target_os = "linux",
    any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64",
        target_arch = "s390x",
        target_arch = "loongarch64"
    )
)))]
fn unread_bytes(_conn: &TcpStream) -> Option<usize> {
    None
}
