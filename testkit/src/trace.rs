//! [`Trace`], a builder of synthetic snapshots, and [`event`], a builder of single events.
//!
//! A `Trace` writes events the way vramscope's allocator records them (alloc, free requested
//! and completed, transfers, syncs, segment events, step marks) without running an allocator,
//! so each test states its scenario in a few lines; the detector, model-view and explorer
//! tests are written with it. [`event`] is for a test that needs one event exactly as stated
//! (the importers', exporters' and dashboard's tests), with every field it does not name zero.

use vramscope_model::{
    Block, BlockState, CallSite, DeviceInfo, Event, EventKind, Id, Pool, Segment, SiteId, Snapshot,
    SnapshotSource, StepMark, TransferDirection,
};

/// A synthetic trace under construction.
pub struct Trace {
    /// The snapshot being built.
    pub snap: Snapshot,
    step: u32,
    next_addr: u64,
}

impl Default for Trace {
    fn default() -> Self {
        Trace::new()
    }
}

impl Trace {
    /// An empty trace on a simulated device of unknown capacity.
    pub fn new() -> Trace {
        let device = DeviceInfo {
            index: 0,
            name: "sim (test)".to_string(),
            backend: "sim".to_string(),
            capacity: 0,
        };
        Trace {
            snap: Snapshot::empty(SnapshotSource::Vramscope, device),
            step: 0,
            next_addr: 0x7f00_0000_0000,
        }
    }

    /// Sets the device capacity.
    pub fn capacity(mut self, bytes: u64) -> Trace {
        self.snap.device.capacity = bytes;
        self
    }

    /// Adds a call site and returns its id.
    pub fn site(&mut self, file: &str, line: u32, function: &str) -> SiteId {
        self.snap.sites.push(CallSite {
            file: file.to_string(),
            line,
            column: 0,
            function: function.to_string(),
            frames: Vec::new(),
        });
        (self.snap.sites.len() - 1) as SiteId
    }

    /// The current step number.
    pub fn current_step(&self) -> u64 {
        u64::from(self.step)
    }

    fn push(&mut self, kind: EventKind, addr: u64, size: u64, site: Option<SiteId>) {
        let seq = self.snap.events.len() as u64;
        self.snap.events.push(Event {
            seq,
            time_ns: seq * 1000,
            kind,
            device: 0,
            stream: 0,
            addr,
            size,
            requested: if kind == EventKind::Alloc { size } else { 0 },
            site: Id::pack(site),
            tag: None,
            scope: None,
            step: self.step,
            thread: 0,
            device_free: 0,
        });
    }

    /// Starts the next step (`mark_step`).
    pub fn step(&mut self) {
        self.step += 1;
        let seq = self.snap.events.len() as u64;
        self.snap.steps.push(StepMark {
            step: u64::from(self.step),
            seq,
            time_ns: seq * 1000,
            label: "mark_step".to_string(),
        });
        self.push(EventKind::Step, 0, 0, None);
    }

    /// The sequence number the next event gets (a test's "since" mark).
    pub fn next_seq(&self) -> u64 {
        self.snap.events.len() as u64
    }

    /// Allocates `size` bytes at a fresh address and returns the address.
    pub fn alloc(&mut self, site: SiteId, size: u64) -> u64 {
        let addr = self.next_addr;
        self.next_addr += size.max(512).next_multiple_of(512);
        self.alloc_at(site, addr, size);
        addr
    }

    /// Allocates `size` bytes at `addr` (to model address reuse).
    pub fn alloc_at(&mut self, site: SiteId, addr: u64, size: u64) {
        self.push(EventKind::Alloc, addr, size, Some(site));
    }

    /// Frees the block at `addr` (free requested, then completed).
    pub fn free(&mut self, addr: u64, size: u64) {
        self.push(EventKind::FreeRequested, addr, size, None);
        self.push(EventKind::FreeCompleted, addr, size, None);
    }

    /// Requests the free of the block at `addr` without its completion (the block waits for
    /// its stream's work, or the trace repeats or loses the request).
    pub fn free_requested(&mut self, addr: u64, size: u64) {
        self.push(EventKind::FreeRequested, addr, size, None);
    }

    /// Completes the free of the block at `addr` without a request before it (a trace that
    /// records frees once, or lost the request).
    pub fn free_completed(&mut self, addr: u64, size: u64) {
        self.push(EventKind::FreeCompleted, addr, size, None);
    }

    /// Records a copy of `size` bytes in `direction`.
    pub fn transfer(&mut self, site: SiteId, direction: TransferDirection, size: u64) {
        self.push(EventKind::Transfer(direction), 0, size, Some(site));
    }

    /// Records an explicit sync.
    pub fn sync(&mut self, site: SiteId) {
        self.push(EventKind::Sync, 0, 0, Some(site));
    }

    /// Records a raw device allocation of `size` bytes at a fresh address.
    pub fn segment_alloc(&mut self, site: Option<SiteId>, size: u64) -> u64 {
        let addr = self.next_addr;
        self.next_addr += size.next_multiple_of(2 << 20);
        self.push(EventKind::SegmentAlloc, addr, size, site);
        addr
    }

    /// Records a raw device free.
    pub fn segment_free(&mut self, addr: u64, size: u64) {
        self.push(EventKind::SegmentFree, addr, size, None);
    }

    /// Records an `empty_cache()` call that released `released` bytes.
    pub fn empty_cache(&mut self, site: SiteId, released: u64) {
        self.push(EventKind::EmptyCache, 0, released, Some(site));
    }

    /// Records a failed allocation of `request` bytes with `device_free` bytes free.
    pub fn oom(&mut self, site: SiteId, request: u64, device_free: u64) {
        self.push(EventKind::Oom, 0, request, Some(site));
        if let Some(event) = self.snap.events.last_mut() {
            event.device_free = device_free;
        }
    }

    /// Adds a segment of `total` bytes at `addr` with the given blocks, as
    /// `(offset, size, allocated)`, the remainder being one free block each.
    pub fn add_segment(&mut self, addr: u64, blocks: &[(u64, u64, bool)], total: u64) {
        let mut list = Vec::new();
        for &(offset, size, allocated) in blocks {
            list.push(Block {
                address: addr + offset,
                size,
                requested_size: if allocated { size } else { 0 },
                state: if allocated {
                    BlockState::ActiveAllocated
                } else {
                    BlockState::Inactive
                },
                site: None,
                tag: None,
                scope: None,
                step: 0,
                thread: 0,
            });
        }
        self.snap.segments.push(Segment {
            device: 0,
            address: addr,
            total_size: total,
            stream: 0,
            pool: Pool::Large,
            expandable: false,
            blocks: list,
        });
    }

    /// The finished snapshot.
    pub fn finish(self) -> Snapshot {
        self.snap
    }
}

/// One MiB.
pub const MIB: u64 = 1 << 20;

/// A clean training loop: weights and optimizer state allocated once, a batch uploaded and
/// activations allocated and freed every step, the loss read once per step with a tiny copy,
/// and a buffer replaced every step (the previous one freed).
pub fn clean_loop(steps: u64) -> Trace {
    let mut t = Trace::new().capacity(16 << 30);
    let weights = t.site("model.py", 10, "Model.__init__");
    let optim = t.site("optim.py", 40, "Adam.step");
    let batch = t.site("train.py", 20, "train");
    let act = t.site("model.py", 55, "Model.forward");
    let loss = t.site("train.py", 31, "train");
    let ema = t.site("train.py", 35, "train");
    t.segment_alloc(None, 64 * MIB);
    for _ in 0..4 {
        t.alloc(weights, 8 * MIB);
    }
    let mut previous_ema: Option<u64> = None;
    for step in 0..steps {
        t.step();
        t.transfer(batch, TransferDirection::HostToDevice, MIB);
        let input = t.alloc(batch, MIB);
        let mut acts = Vec::new();
        for _ in 0..6 {
            acts.push(t.alloc(act, 2 * MIB));
        }
        let l = t.alloc(loss, 512);
        t.transfer(loss, TransferDirection::DeviceToHost, 4);
        for a in acts {
            t.free(a, 2 * MIB);
        }
        if step == 0 {
            t.alloc(optim, 16 * MIB);
        }
        let e = t.alloc(ema, 4096);
        if let Some(p) = previous_ema.replace(e) {
            t.free(p, 4096);
        }
        t.free(l, 512);
        t.free(input, MIB);
    }
    t
}

/// An event of `kind` with every other field zero (or none), to be set with the builder's
/// methods and turned into an [`Event`] with [`EventBuilder::build`] (or `Event::from`).
///
/// ```
/// use vramscope_model::EventKind;
/// use vramscope_testkit::event;
///
/// let e = event(EventKind::Alloc).seq(3).addr(0x1000).size(512).site(0).build();
/// assert_eq!((e.seq, e.addr, e.size, e.site()), (3, 0x1000, 512, Some(0)));
/// assert_eq!(e.requested, 512, "the request is the size unless one is given");
/// ```
pub fn event(kind: EventKind) -> EventBuilder {
    EventBuilder {
        event: Event {
            seq: 0,
            time_ns: 0,
            kind,
            device: 0,
            stream: 0,
            addr: 0,
            size: 0,
            requested: 0,
            site: None,
            tag: None,
            scope: None,
            step: 0,
            thread: 0,
            device_free: 0,
        },
        requested_set: false,
    }
}

/// An [`Event`] under construction; see [`event`].
#[derive(Clone, Copy, Debug)]
pub struct EventBuilder {
    event: Event,
    requested_set: bool,
}

impl EventBuilder {
    /// Sets the sequence number.
    pub fn seq(mut self, seq: u64) -> Self {
        self.event.seq = seq;
        self
    }

    /// Sets the time in nanoseconds since the snapshot's epoch.
    pub fn time_ns(mut self, time_ns: u64) -> Self {
        self.event.time_ns = time_ns;
        self
    }

    /// Sets the device ordinal.
    pub fn device(mut self, device: u16) -> Self {
        self.event.device = device;
        self
    }

    /// Sets the stream handle.
    pub fn stream(mut self, stream: u64) -> Self {
        self.event.stream = stream;
        self
    }

    /// Sets the device address.
    pub fn addr(mut self, addr: u64) -> Self {
        self.event.addr = addr;
        self
    }

    /// Sets the size in bytes (and the request, unless [`EventBuilder::requested`] sets it).
    pub fn size(mut self, size: u64) -> Self {
        self.event.size = size;
        self
    }

    /// Sets the bytes the program asked for.
    pub fn requested(mut self, requested: u64) -> Self {
        self.event.requested = requested;
        self.requested_set = true;
        self
    }

    /// Sets the call site (a `SiteId`, or an `Option` of one).
    pub fn site(mut self, site: impl Into<Option<SiteId>>) -> Self {
        self.event.site = Id::pack(site.into());
        self
    }

    /// Sets the tag.
    pub fn tag(mut self, tag: u32) -> Self {
        self.event.tag = Id::new(tag);
        self
    }

    /// Sets the innermost scope.
    pub fn scope(mut self, scope: u32) -> Self {
        self.event.scope = Id::new(scope);
        self
    }

    /// Sets the step number.
    pub fn step(mut self, step: u32) -> Self {
        self.event.step = step;
        self
    }

    /// Sets the thread number.
    pub fn thread(mut self, thread: u32) -> Self {
        self.event.thread = thread;
        self
    }

    /// Sets an `oom`'s free device memory.
    pub fn device_free(mut self, device_free: u64) -> Self {
        self.event.device_free = device_free;
        self
    }

    /// The event.
    pub fn build(self) -> Event {
        let mut event = self.event;
        if !self.requested_set && matches!(event.kind, EventKind::Alloc) {
            event.requested = event.size;
        }
        event
    }
}

impl From<EventBuilder> for Event {
    fn from(builder: EventBuilder) -> Event {
        builder.build()
    }
}
