//! The one publisher loop of live telemetry, shared by every publisher: the allocator's
//! (`vramscope_allocator::Telemetry`, over a `CachingAllocator`'s event ring) and the Python
//! package's (`LivePublisher`, over PyTorch's own allocator as Python feeds it).
//!
//! A publisher is a [`Source`] (what to publish: who is talking, an attach snapshot, the events
//! newer than a sequence number, the table entries they need, the statistics) served by
//! [`Publisher::start`] on a [`Listener`] from [`serve`](crate::serve). One background thread
//! accepts dashboards, sends each `Hello` and a snapshot with its history, then `Tables` before
//! the events that need them, `Events` in batches pulled from the source by sequence number,
//! `Stats` every [`ServeOptions::stats_interval`], and `Bye` at the end; a dashboard past
//! [`ServeOptions::max_clients`] is sent `Refused`. The source's threads never wait for a
//! dashboard: each client has a bounded queue ([`Outbox`], every byte counted, the attach
//! snapshot's too: its history is cut to fit) and a non-blocking socket, and events a slow or
//! absent dashboard cannot take are counted as dropped for that client, which is then
//! re-synchronised with a fresh snapshot once its queue has drained; a client that takes
//! nothing for a second while its queue is half full is stalled and counted the same way.
//! Snapshots are rate limited ([`ServeOptions::attach_interval`],
//! [`ServeOptions::resync_interval`]): clients that connect meanwhile share the next one. A
//! client that reads nothing for [`ServeOptions::idle_timeout`] while bytes wait for it is
//! closed ([`IdleWatch`]), and one that has read nothing for a second gives up its place to a
//! dashboard that connects while every place is taken. The protocol is read-only: the
//! publisher never reads what a client sends.

use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use vramscope_model::{AllocatorConfig, DeviceInfo, Event, MemoryStats, Snapshot};

use crate::serve::{Listener, Outbox};
use crate::wire::{
    encode_events, encode_frame, json_frame, refused_frame, serialized_len, snapshot_frames,
    EVENT_RECORD_BYTES, PROTOCOL_VERSION,
};
use crate::{FrameKind, Hello, KnownTables, StatsFrame, TablesFrame, TelemetryAddr};

/// What a publisher publishes: the one thing each publisher writes for itself. The serving
/// thread owns the source and calls it from that thread alone; each call should copy what it
/// needs under whatever lock the source keeps and return, since the source's own threads may
/// wait on that lock.
pub trait Source: Send + 'static {
    /// Who is talking: the `Hello` frame every connection starts with (see [`hello`] for the
    /// fields that are the process's). Asked once, when the serving thread starts; its
    /// `epoch_unix_ns` is the zero of the statistics' times.
    fn hello(&mut self) -> Hello;

    /// The state now, for a dashboard that attaches or lost events: the snapshot with, in its
    /// `events`, at most the newest `history` events of the source's history, oldest first, and
    /// the sequence number of the first event after it. The publisher cuts the history further
    /// to fit a client's queue.
    fn snapshot(&mut self, history: usize) -> Attach;

    /// At most `max` events from sequence number `seq` on, oldest first: those the source
    /// still holds, with how many it no longer holds.
    fn events_since(&mut self, seq: u64, max: usize) -> Batch;

    /// The call sites, tags and scopes added beyond `known`, as the `Tables` frame a client
    /// that knows `known` needs (each list starting at `known`'s length, as
    /// [`KnownTables::advance`] makes it).
    fn tables_since(&mut self, known: KnownTables) -> TablesFrame;

    /// The statistics and the step number now.
    fn stats(&mut self) -> Reading;

    /// A number that grows whenever the source has new history to show an attaching client;
    /// with [`ServeOptions::attach_wait`], an attaching client waits for it to change (0, the
    /// default: a source whose history is always current).
    fn generation(&self) -> u64 {
        0
    }

    /// Whether the source has ended: the publisher then says goodbye and stops, as if it had
    /// been closed (false, the default: only [`Publisher::close`] stops it).
    fn ended(&self) -> bool {
        false
    }
}

/// A snapshot for attaching clients ([`Source::snapshot`]).
#[derive(Clone, Debug)]
pub struct Attach {
    /// The state, with its history (the events before `next_seq`) in `events`.
    pub snapshot: Snapshot,
    /// The sequence number of the first event after the snapshot.
    pub next_seq: u64,
}

/// Events pulled from a source ([`Source::events_since`]).
#[derive(Clone, Debug, Default)]
pub struct Batch {
    /// The events, oldest first.
    pub events: Vec<Event>,
    /// The sequence number to ask for next.
    pub next_seq: u64,
    /// Events from the sequence number asked for on that the source no longer holds.
    pub missed: u64,
}

impl Attach {
    /// `snapshot` (its `events` replaced) with the newest `history` events of `ring`, a
    /// source's newest events in sequence order, the last of them numbered just before
    /// `next_seq`: what [`Source::snapshot`] answers for a source that keeps its history in a
    /// bounded queue.
    pub fn from_ring(
        mut snapshot: Snapshot,
        ring: &VecDeque<Event>,
        next_seq: u64,
        history: usize,
    ) -> Attach {
        let skip = ring.len().saturating_sub(history);
        snapshot.events = ring.range(skip..).copied().collect();
        Attach { snapshot, next_seq }
    }
}

impl Batch {
    /// At most `max` events from sequence number `seq` on out of `ring`, a source's newest
    /// events in sequence order, the last of them numbered just before `next_seq`: what
    /// [`Source::events_since`] answers for a source that keeps its history in a bounded queue,
    /// whose dropped front counts as missed.
    pub fn from_ring(ring: &VecDeque<Event>, next_seq: u64, seq: u64, max: usize) -> Batch {
        let first = ring.front().map_or(next_seq, |e| e.seq);
        let from = seq.max(first);
        let skip = usize::try_from(from - first).map_or(ring.len(), |n| n.min(ring.len()));
        let events: Vec<Event> = ring.range(skip..).take(max).copied().collect();
        Batch {
            next_seq: events.last().map_or(from, |e| e.seq + 1),
            missed: first.saturating_sub(seq),
            events,
        }
    }
}

/// What a `Stats` frame reports of a source ([`Source::stats`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Reading {
    /// The allocator's statistics.
    pub stats: MemoryStats,
    /// The current step number.
    pub step: u64,
}

/// The `Hello` of this process for `device`, whose event times count from `epoch_unix_ns`,
/// under `config`: the protocol version, the process id and the executable's file name filled
/// in.
pub fn hello(device: DeviceInfo, epoch_unix_ns: u64, config: AllocatorConfig) -> Hello {
    Hello {
        protocol: PROTOCOL_VERSION,
        pid: std::process::id(),
        program: std::env::current_exe()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_default(),
        device,
        epoch_unix_ns,
        config,
    }
}

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
    /// The most events pulled from the source at a time, one lock each (4096).
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
    /// source's whole history under its lock, so it must stay rare.
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
    /// How long an attaching client waits for the source's history to change
    /// ([`Source::generation`]) before it gets the snapshot there is (zero): for a source fed
    /// from outside, whose history is only as fresh as the last feeding.
    pub attach_wait: Duration,
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
            attach_wait: Duration::ZERO,
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
    /// Events read from the source: in batches, or taken into a snapshot while no client was
    /// streaming (the stream then jumps past them).
    pub events_read: u64,
    /// Event records queued for clients (summed over clients).
    pub events_sent: u64,
    /// Events clients missed, summed over clients: dropped from full queues, or gone from the
    /// source before the publisher read them.
    pub events_dropped: u64,
    /// Events gone from the source (overwritten in the ring) before the publisher read them.
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

impl Counters {
    fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }
}

struct Shared {
    stop: AtomicBool,
    counters: Counters,
}

/// A running publisher: one thread serving a [`Source`] to dashboards. Closing it
/// ([`Publisher::close`], or dropping it) says goodbye to the clients, stops the thread and
/// removes the Unix socket.
pub struct Publisher {
    addr: TelemetryAddr,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Publisher {
    /// Starts serving `source` to the dashboards that connect to `listener`, with `options`
    /// (whose `allow_remote` is the listener's business: see [`Listener::bind`]). A thread that
    /// cannot start drops the listener, which removes its socket.
    pub fn start<S: Source>(
        source: S,
        listener: Listener,
        options: ServeOptions,
    ) -> std::io::Result<Publisher> {
        let addr = listener.addr().clone();
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            counters: Counters::default(),
        });
        let mut server = Server {
            source,
            unix: matches!(addr, TelemetryAddr::Unix(_)),
            listener,
            options,
            shared: Arc::clone(&shared),
            clients: Vec::new(),
            next_seq: 0,
            hello: Vec::new(),
            epoch_unix_ns: 0,
            last_stats: None,
            last_snapshot: None,
            last_idle_check: Instant::now(),
        };
        let thread = std::thread::Builder::new()
            .name("vramscope-telemetry".to_string())
            .spawn(move || server.run())?;
        Ok(Publisher {
            addr,
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// The address clients connect to (for `tcp:127.0.0.1:0`, the port the system chose).
    pub fn addr(&self) -> &TelemetryAddr {
        &self.addr
    }

    /// The publisher's counters.
    pub fn stats(&self) -> PublisherStats {
        let c = &self.shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PublisherStats {
            clients: get(&c.clients),
            clients_total: get(&c.clients_total),
            events_read: get(&c.events_read),
            events_sent: get(&c.events_sent),
            events_dropped: get(&c.events_dropped),
            ring_missed: get(&c.ring_missed),
            snapshots: get(&c.snapshots),
            clients_refused: get(&c.clients_refused),
            clients_idle: get(&c.clients_idle),
            queued_bytes: get(&c.queued_bytes),
        }
    }

    /// Says goodbye to the clients, stops the serving thread and removes the socket; later
    /// calls do nothing.
    pub fn close(&self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        self.close();
    }
}

/// How long a client may take nothing while its queue is half full before it is stalled, and
/// how long one must have read nothing to give up its place to a new dashboard.
const STALLED_AFTER: Duration = Duration::from_secs(1);

/// How often the publisher looks at what each client has read (`Server::close_idle`).
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
    /// Set until the first snapshot is queued: the source's generation when the client
    /// connected, and when that was.
    fresh: Option<(u64, Instant)>,
    /// The table lengths the client knows: its snapshot's tables and the additions since.
    known: KnownTables,
    /// Whether it reads what it is sent.
    idle: IdleWatch,
}

impl Client {
    /// Whether the client waits for its first snapshot and may have it now: the source's
    /// history changed since it connected (now at `generation`), or it waited `wait`.
    fn ready(&self, generation: u64, wait: Duration) -> bool {
        self.fresh
            .is_some_and(|(seen, at)| generation > seen || at.elapsed() >= wait)
    }

    /// Whether the client streams events (it has had its first snapshot).
    fn streams(&self) -> bool {
        self.fresh.is_none()
    }

    /// Counts `n` events the client will never get.
    fn drop_events(&mut self, n: u64, counters: &Counters) {
        self.dropped += n;
        Counters::add(&counters.events_dropped, n);
    }
}

/// What one pull from the source found.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pulled {
    /// No events.
    Nothing,
    /// Some events, fewer than a batch: the source is drained.
    Some,
    /// A whole batch: the source may hold more.
    Full,
}

/// The serving thread's state.
struct Server<S: Source> {
    source: S,
    listener: Listener,
    options: ServeOptions,
    shared: Arc<Shared>,
    clients: Vec<Client>,
    /// The next sequence number to pull from the source.
    next_seq: u64,
    hello: Vec<u8>,
    /// The zero of the statistics' times, in nanoseconds since the Unix epoch.
    epoch_unix_ns: u64,
    last_stats: Option<Instant>,
    last_snapshot: Option<Instant>,
    /// Whether clients connect over a Unix socket, whose unread bytes the system reports.
    unix: bool,
    /// When `close_idle` last looked.
    last_idle_check: Instant,
}

impl<S: Source> Server<S> {
    fn run(&mut self) {
        let hello = self.source.hello();
        self.epoch_unix_ns = hello.epoch_unix_ns;
        self.hello = json_frame(FrameKind::Hello, &hello);
        let shortest = Duration::from_micros(500);
        let mut idle_sleep = shortest;
        while !self.shared.stop.load(Ordering::Relaxed) && !self.source.ended() {
            self.accept();
            let mut pulled = Pulled::Nothing;
            let mut waiting = false;
            if !self.clients.is_empty() {
                self.attach_and_resync();
                // The source is the buffer: read it only while some client has room, so that a
                // burst waits there instead of being dropped from a full queue. A client that
                // has taken nothing for a while is stalled: it loses its stream (and
                // re-synchronises once it reads again), and the source is read on so that what
                // it misses is counted, not silently overwritten.
                let room = self.options.client_queue_bytes / 2;
                for client in &mut self.clients {
                    if client.streams()
                        && client.out.queued_bytes >= room
                        && client.out.last_progress.elapsed() >= STALLED_AFTER
                    {
                        client.resync = true;
                    }
                }
                if self
                    .clients
                    .iter()
                    .any(|c| c.streams() && (c.resync || c.out.queued_bytes < room))
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
                // The source has more: go straight back for it.
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

    fn accept(&mut self) {
        // A failed accept (a client that went away at once) is not the program's problem.
        while let Ok(Some(conn)) = self.listener.accept() {
            if self.clients.len() >= self.options.max_clients && !self.make_room() {
                self.refuse(conn);
                continue;
            }
            let mut client = Client {
                out: Outbox::new(conn),
                upto: 0,
                dropped: 0,
                resync: false,
                fresh: Some((self.source.generation(), Instant::now())),
                known: KnownTables::default(),
                idle: IdleWatch::default(),
            };
            client.out.push(Arc::new(self.hello.clone()));
            self.clients.push(client);
            let c = &self.shared.counters;
            Counters::add(&c.clients_total, 1);
            self.count_clients();
        }
    }

    fn count_clients(&self) {
        self.shared
            .counters
            .clients
            .store(self.clients.len() as u64, Ordering::Relaxed);
    }

    /// Closes the client that has read nothing for longest, if that is a second or more, to
    /// make room for a new one; whether there is room now.
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
        Counters::add(&self.shared.counters.clients_idle, 1);
        self.count_clients();
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
        let checked = std::mem::replace(&mut self.last_idle_check, now);
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
        Counters::add(&self.shared.counters.clients_refused, 1);
    }

    /// Queues a snapshot for attaching clients that may have it and for clients that lost
    /// events and have drained.
    fn attach_and_resync(&mut self) {
        let since_last = self.last_snapshot.map(|t| t.elapsed());
        let generation = self.source.generation();
        let wait = self.options.attach_wait;
        let fresh = self.clients.iter().any(|c| c.ready(generation, wait))
            && since_last.is_none_or(|t| t >= self.options.attach_interval);
        let resync_due = since_last.is_none_or(|t| t >= self.options.resync_interval);
        let wants_resync = |c: &Client| c.streams() && c.resync && c.out.queue.is_empty();
        let resync = resync_due && self.clients.iter().any(wants_resync);
        if !fresh && !resync {
            return;
        }
        let had_stream = self.clients.iter().any(|c| c.streams() && !c.resync);
        // Take only the history some client will get: a client that lost events has its
        // history already, so resyncs want far less than a fresh attach, and the source holds
        // its lock while it copies it.
        let keep = if fresh {
            self.options.history_events
        } else {
            self.options.resync_history_events
        };
        let Attach {
            mut snapshot,
            next_seq,
        } = self.source.snapshot(keep.saturating_add(1));
        self.last_snapshot = Some(Instant::now());
        Counters::add(&self.shared.counters.snapshots, 1);
        let history = std::mem::take(&mut snapshot.events);
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
        let mut known = KnownTables::default();
        known.include(&snapshot);
        let frames = snapshot_frames(&snapshot, next_seq, history);
        let counters = &self.shared.counters;
        if !had_stream {
            // No client streams: the stream jumps to the snapshot, which took in the events the
            // publisher had not read yet. They count as read, so that every event a client
            // missed (counted as dropped below) was first counted as read.
            Counters::add(
                &counters.events_read,
                next_seq.saturating_sub(self.next_seq),
            );
            self.next_seq = self.next_seq.max(next_seq);
        }
        for client in &mut self.clients {
            let ready = client.ready(generation, wait);
            if !ready && !wants_resync(client) {
                continue;
            }
            for f in &frames {
                client.out.push(Arc::clone(f));
            }
            if !ready {
                // Events it lost while waiting for this snapshot, never read for it.
                client.drop_events(next_seq.saturating_sub(client.upto), counters);
            }
            client.fresh = None;
            client.resync = false;
            client.upto = client.upto.max(next_seq);
            client.known = known;
        }
    }

    /// Pulls one batch of events from the source and queues it, with the table additions it
    /// needs, for every streaming client.
    fn pull(&mut self) -> Pulled {
        let asked = self.next_seq;
        let batch = self
            .source
            .events_since(asked, self.options.batch_events.max(1));
        let counters = &self.shared.counters;
        if batch.missed > 0 {
            Counters::add(&counters.ring_missed, batch.missed);
            // The source lost the events from `asked` up to `oldest` before they were read.
            let oldest = asked + batch.missed;
            for client in &mut self.clients {
                let lost = oldest.saturating_sub(client.upto);
                if client.streams() && lost > 0 {
                    client.drop_events(lost, counters);
                    client.resync = true;
                    client.upto = oldest;
                }
            }
        }
        self.next_seq = batch.next_seq;
        if batch.events.is_empty() {
            return Pulled::Nothing;
        }
        Counters::add(&counters.events_read, batch.events.len() as u64);
        let full = if batch.events.len() >= self.options.batch_events {
            Pulled::Full
        } else {
            Pulled::Some
        };
        let shared_frame = Arc::new(encode_events(&batch.events));
        let first_seq = batch.events[0].seq;
        // The `Tables` frames made for this batch, by what their clients knew before them.
        let mut tables: Vec<(KnownTables, Arc<Vec<u8>>, KnownTables)> = Vec::new();
        for client in &mut self.clients {
            if !client.streams() {
                continue;
            }
            // Only the events not yet accounted for (those after the client's snapshot).
            let skip = client.upto.saturating_sub(first_seq) as usize;
            if skip >= batch.events.len() {
                continue;
            }
            let events = &batch.events[skip..];
            let n = events.len() as u64;
            client.upto = batch.next_seq;
            if client.resync {
                client.drop_events(n, counters);
                continue;
            }
            let frame = if skip == 0 {
                Arc::clone(&shared_frame)
            } else {
                Arc::new(encode_events(events))
            };
            // Table additions go before the first event that refers to them.
            let addition = if client.known.lacks_any(events) {
                let made = tables.iter().find(|(before, _, _)| *before == client.known);
                Some(match made {
                    Some((_, frame, after)) => (Arc::clone(frame), *after),
                    None => {
                        let added = self.source.tables_since(client.known);
                        let after = added.follows(&client.known).unwrap_or(client.known);
                        let frame = Arc::new(json_frame(FrameKind::Tables, &added));
                        tables.push((client.known, Arc::clone(&frame), after));
                        (frame, after)
                    }
                })
            } else {
                None
            };
            let bytes = frame.len() + addition.as_ref().map_or(0, |(t, _)| t.len());
            if client.out.queued_bytes + bytes > self.options.client_queue_bytes {
                client.drop_events(n, counters);
                client.resync = true;
                continue;
            }
            if let Some((tables, after)) = addition {
                client.out.push(tables);
                client.known = after;
            }
            client.out.push(frame);
            Counters::add(&counters.events_sent, n);
        }
        full
    }

    fn send_stats(&mut self) {
        if self
            .last_stats
            .is_some_and(|t| t.elapsed() < self.options.stats_interval)
        {
            return;
        }
        self.last_stats = Some(Instant::now());
        let reading = self.source.stats();
        let time_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            .saturating_sub(self.epoch_unix_ns);
        for client in &mut self.clients {
            if !client.streams() || client.out.queued_bytes >= self.options.client_queue_bytes {
                continue;
            }
            let frame = StatsFrame {
                stats: reading.stats,
                step: reading.step,
                next_seq: self.next_seq,
                dropped_events: client.dropped,
                time_ns,
            };
            client
                .out
                .push(Arc::new(json_frame(FrameKind::Stats, &frame)));
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
            self.count_clients();
        }
    }

    /// Sends `Bye` and gives each client up to 200 ms to take what is queued.
    fn say_goodbye(&mut self) {
        let bye = Arc::new(encode_frame(FrameKind::Bye, &[]));
        for client in &mut self.clients {
            client.out.push(Arc::clone(&bye));
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

/// Whether one client reads what it is sent: how the publisher finds a connection that reads
/// nothing. The publisher looks ([`IdleWatch::look`]) every few tens of milliseconds; a client
/// has read something when the bytes it has not read from its Unix socket went down or to
/// nothing (the system reports them), or when the publisher's queue for it drained some while
/// full. Over TCP, whose unread bytes the system does not report, a client with nothing queued
/// counts as reading, so there an idle client is found once the system's socket buffers have
/// filled.
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
/// `SIOCOUTQ`), where the system says; `None` elsewhere, where only the publisher's own queue
/// tells an idle client.
fn unread_bytes(conn: &TcpStream) -> Option<usize> {
    use std::os::fd::AsRawFd;
    extern "C" {
        fn ioctl(fd: std::ffi::c_int, request: std::ffi::c_ulong, ...) -> std::ffi::c_int;
    }
    /// Whether `SIOCOUTQ` (`TIOCOUTQ`) is [`SIOCOUTQ`] here: Linux on these architectures.
    const KNOWN: bool = cfg!(all(
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
    ));
    const SIOCOUTQ: std::ffi::c_ulong = 0x5411;
    if !KNOWN {
        return None;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::FrameReader;
    use crate::{Frame, TelemetryError};
    use std::net::TcpStream;
    use vramscope_model::{CallSite, EventKind, Id, SnapshotSource};

    /// A source fed by the test: a ring of at most `ring` events, call sites, statistics.
    struct FakeState {
        events: VecDeque<Event>,
        ring: usize,
        next_seq: u64,
        sites: Vec<CallSite>,
        step: u64,
        generation: u64,
        ended: bool,
    }

    #[derive(Clone)]
    struct Fake(Arc<Mutex<FakeState>>);

    impl Fake {
        fn new(ring: usize) -> Fake {
            Fake(Arc::new(Mutex::new(FakeState {
                events: VecDeque::new(),
                ring,
                next_seq: 0,
                sites: Vec::new(),
                step: 0,
                generation: 0,
                ended: false,
            })))
        }

        fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
            self.0.lock().unwrap()
        }

        /// Records `n` allocations at call site `site`, all at once.
        fn record(&self, n: u64, site: u32) {
            let mut s = self.state();
            while s.sites.len() <= site as usize {
                let line = s.sites.len() as u32 + 1;
                s.sites.push(CallSite {
                    file: "train.py".to_string(),
                    line,
                    column: 0,
                    function: "step".to_string(),
                    frames: Vec::new(),
                });
            }
            for _ in 0..n {
                let seq = s.next_seq;
                s.next_seq += 1;
                s.events.push_back(Event {
                    seq,
                    time_ns: seq,
                    kind: EventKind::Alloc,
                    device: 0,
                    stream: 0,
                    addr: 0x1000 + seq * 512,
                    size: 512,
                    requested: 512,
                    site: Id::new(site),
                    tag: None,
                    scope: None,
                    step: 0,
                    thread: 1,
                    device_free: 0,
                });
                if s.events.len() > s.ring {
                    s.events.pop_front();
                }
            }
        }
    }

    impl Source for Fake {
        fn hello(&mut self) -> Hello {
            hello(DeviceInfo::default(), 0, AllocatorConfig::default())
        }

        fn snapshot(&mut self, history: usize) -> Attach {
            let s = self.state();
            let mut snapshot = Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default());
            snapshot.sites = s.sites.clone();
            Attach::from_ring(snapshot, &s.events, s.next_seq, history)
        }

        fn events_since(&mut self, seq: u64, max: usize) -> Batch {
            let s = self.state();
            Batch::from_ring(&s.events, s.next_seq, seq, max)
        }

        fn tables_since(&mut self, mut known: KnownTables) -> TablesFrame {
            let sites = self.state().sites[known.sites..].to_vec();
            known.advance(sites, Vec::new(), Vec::new())
        }

        fn stats(&mut self) -> Reading {
            Reading {
                stats: MemoryStats::default(),
                step: self.state().step,
            }
        }

        fn generation(&self) -> u64 {
            self.0.lock().unwrap().generation
        }

        fn ended(&self) -> bool {
            self.0.lock().unwrap().ended
        }
    }

    fn start(source: &Fake, options: ServeOptions) -> Publisher {
        let addr = TelemetryAddr::parse("tcp:127.0.0.1:0").unwrap();
        let listener = Listener::bind(&addr, false).unwrap();
        Publisher::start(source.clone(), listener, options).unwrap()
    }

    fn connect(publisher: &Publisher) -> FrameReader<TcpStream> {
        let TelemetryAddr::Tcp(addr) = publisher.addr() else {
            unreachable!("the tests listen on TCP")
        };
        let conn = TcpStream::connect(addr).unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        FrameReader::new(conn)
    }

    /// Reads frames until one that `want` takes, failing on an error.
    fn until(reader: &mut FrameReader<TcpStream>, mut want: impl FnMut(&Frame) -> bool) -> Frame {
        loop {
            let frame = reader.next_frame().unwrap();
            if want(&frame) {
                return frame;
            }
        }
    }

    fn snapshot_of(frame: Frame) -> (u64, Box<Snapshot>) {
        match frame {
            Frame::Snapshot { next_seq, snapshot } => (next_seq, snapshot),
            other => panic!("expected a snapshot, got {other:?}"),
        }
    }

    fn is_snapshot(frame: &Frame) -> bool {
        matches!(frame, Frame::Snapshot { .. })
    }

    #[test]
    fn a_client_gets_hello_history_tables_events_stats_and_bye() {
        let source = Fake::new(1000);
        source.record(3, 0);
        let publisher = start(&source, ServeOptions::default());
        let mut client = connect(&publisher);
        assert!(matches!(client.next_frame().unwrap(), Frame::Hello(_)));
        let (next_seq, snapshot) = snapshot_of(client.next_frame().unwrap());
        assert_eq!(next_seq, 3);
        assert_eq!(snapshot.events.len(), 3);
        assert_eq!(snapshot.sites.len(), 1);
        // Events at a new call site come after the table entry they need.
        source.record(2, 1);
        let tables = until(&mut client, |f| matches!(f, Frame::Tables(_)));
        let Frame::Tables(tables) = tables else {
            unreachable!()
        };
        assert_eq!((tables.sites_from, tables.sites.len()), (1, 1));
        let mut seqs = Vec::new();
        while seqs.len() < 2 {
            if let Frame::Events(batch) = client.next_frame().unwrap() {
                seqs.extend(batch.iter().map(|e| e.seq));
            }
        }
        assert_eq!(seqs, [3, 4]);
        source.state().step = 7;
        let stats = until(&mut client, |f| matches!(f, Frame::Stats(s) if s.step == 7));
        let Frame::Stats(stats) = stats else {
            unreachable!()
        };
        assert_eq!((stats.next_seq, stats.dropped_events), (5, 0));
        // A source that ends ends the publisher, with a goodbye.
        source.state().ended = true;
        until(&mut client, |f| matches!(f, Frame::Bye));
        publisher.close();
        let counters = publisher.stats();
        assert_eq!(counters.events_sent, 2);
        assert_eq!(counters.snapshots, 1);
        assert_eq!(counters.clients, 0);
    }

    /// Attaches a client to a publisher of `source` that re-synchronises every 10 ms and may
    /// queue `queue_bytes` for a client, records a burst of `burst` events at once, and reads
    /// the client's next snapshot: the publisher, the client, the snapshot's next sequence
    /// number and the snapshot.
    fn resync_after_burst(
        source: &Fake,
        queue_bytes: usize,
        burst: u64,
    ) -> (Publisher, FrameReader<TcpStream>, u64, Box<Snapshot>) {
        let options = ServeOptions {
            client_queue_bytes: queue_bytes,
            resync_interval: Duration::from_millis(10),
            ..ServeOptions::default()
        };
        let publisher = start(source, options);
        let mut client = connect(&publisher);
        snapshot_of(until(&mut client, is_snapshot));
        source.record(burst, 0);
        let (next_seq, snapshot) = snapshot_of(until(&mut client, is_snapshot));
        (publisher, client, next_seq, snapshot)
    }

    #[test]
    fn a_client_that_lost_events_is_resynchronised_and_told_how_many() {
        let source = Fake::new(100);
        source.record(10, 0);
        // A burst that overwrites the ring before the publisher can read it: 900 events are
        // gone, and the client gets the 100 the ring still holds in a fresh snapshot.
        let (publisher, mut client, next_seq, snapshot) =
            resync_after_burst(&source, 32 << 20, 1000);
        assert_eq!(next_seq, 1010);
        assert_eq!(snapshot.events.len(), 100);
        let stats = until(&mut client, |f| matches!(f, Frame::Stats(_)));
        let Frame::Stats(stats) = stats else {
            unreachable!()
        };
        assert_eq!(stats.dropped_events, 1000);
        let counters = publisher.stats();
        assert_eq!(counters.ring_missed, 900);
        assert_eq!(counters.events_dropped, 1000);
        assert_eq!(counters.snapshots, 2);
    }

    #[test]
    fn a_batch_past_a_clients_bound_is_dropped_and_the_snapshot_cut_to_fit() {
        let source = Fake::new(1 << 20);
        // One batch of 4096 events is 320 KiB, more than the client's queue may hold.
        let (publisher, _client, next_seq, snapshot) = resync_after_burst(&source, 64 << 10, 4096);
        assert_eq!(next_seq, 4096);
        let fits = (64 << 10) / EVENT_RECORD_BYTES;
        assert!(
            !snapshot.events.is_empty() && snapshot.events.len() < fits,
            "{} events of history",
            snapshot.events.len()
        );
        assert_eq!(snapshot.events.last().map(|e| e.seq), Some(4095));
        let counters = publisher.stats();
        assert_eq!(counters.events_dropped, 4096);
        assert_eq!(counters.events_sent, 0);
    }

    #[test]
    fn a_client_past_max_clients_is_refused() {
        let source = Fake::new(100);
        let options = ServeOptions {
            max_clients: 1,
            ..ServeOptions::default()
        };
        let publisher = start(&source, options);
        let mut first = connect(&publisher);
        snapshot_of(until(&mut first, is_snapshot));
        let mut second = connect(&publisher);
        assert!(matches!(second.next_frame().unwrap(), Frame::Hello(_)));
        match second.next_frame() {
            Err(TelemetryError::Refused(reason)) => assert!(reason.contains('1'), "{reason}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while publisher.stats().clients_refused == 0 {
            assert!(Instant::now() < deadline, "the refusal was not counted");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(publisher.stats().clients, 1);
    }

    #[test]
    fn an_attaching_client_waits_for_fresh_history() {
        let source = Fake::new(100);
        let options = ServeOptions {
            attach_wait: Duration::from_secs(30),
            ..ServeOptions::default()
        };
        let publisher = start(&source, options);
        let mut client = connect(&publisher);
        assert!(matches!(client.next_frame().unwrap(), Frame::Hello(_)));
        client
            .get_ref()
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(
            client.next_frame().is_err(),
            "a snapshot came before its history"
        );
        client
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        source.record(5, 0);
        source.state().generation += 1;
        let (next_seq, snapshot) = snapshot_of(until(&mut client, is_snapshot));
        assert_eq!((next_seq, snapshot.events.len()), (5, 5));
        drop(publisher);
    }
}
