//! The one data model of vramscope: snapshots, segments, blocks, events, call sites and steps.
//!
//! Everything that describes device memory is defined here, once, where the data is born. The
//! caching allocator (`vramscope_allocator::caching`) fills these types when asked for a
//! [`Snapshot`]; the inspector's importers convert PyTorch pickles and Chrome traces *into* them,
//! and its detectors, reports and the dashboard read only these types. A snapshot is plain data: it
//! can be saved and loaded as JSON and carries a [`FORMAT_VERSION`].

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::AllocatorConfig;
use crate::Events;
use crate::MemoryStats;

/// The version of the JSON snapshot format written by [`Snapshot::save`].
pub const FORMAT_VERSION: u32 = 2;

/// The key of an event log's header that counts the event lines after it
/// ([`Snapshot::write_event_log`]); a snapshot read as JSON ignores it.
pub const EVENT_LOG_COUNT_KEY: &str = "event_log_events";

/// The format version whose `oom` events kept the device's free memory in `addr` (format 2
/// gave it [`Event::device_free`]); files of that version are upgraded as they are read.
pub const FORMAT_VERSION_OOM_IN_ADDR: u32 = 1;

/// Index into [`Snapshot::sites`].
pub type SiteId = u32;
/// Index into [`Snapshot::tags`].
pub type TagId = u32;
/// Index into [`Snapshot::scopes`].
pub type ScopeId = u32;

/// An index kept so that `Option<Id>` takes four bytes where `Option<u32>` takes eight: an
/// event's index into one of a snapshot's tables ([`SiteId`], [`TagId`], [`ScopeId`]), of
/// which a 10M-event trace keeps three per event, or an event or step index that a view keeps
/// for millions of blocks. It holds every index but `u32::MAX`, which no table, trace or step
/// count reaches (`u32::MAX` is also what the allocator and the wire write for none); a file
/// that names it as a table index is refused as it is read.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Id(std::num::NonZeroU32);

impl Id {
    /// The index `n`, or `None` for `u32::MAX`, which an `Id` cannot hold.
    pub const fn new(n: u32) -> Option<Id> {
        match std::num::NonZeroU32::new(!n) {
            Some(inverted) => Some(Id(inverted)),
            None => None,
        }
    }

    /// The index.
    pub const fn get(self) -> u32 {
        !self.0.get()
    }

    /// An optional index as an optional `Id`; `u32::MAX` becomes `None`.
    pub fn pack(n: Option<u32>) -> Option<Id> {
        n.and_then(Id::new)
    }
}

impl Ord for Id {
    fn cmp(&self, other: &Id) -> std::cmp::Ordering {
        self.get().cmp(&other.get())
    }
}

impl PartialOrd for Id {
    fn partial_cmp(&self, other: &Id) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.get(), f)
    }
}

impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u32(self.get())
    }
}

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Id, D::Error> {
        let n = u32::deserialize(deserializer)?;
        Id::new(n).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "the index {n} is past the largest a table can have ({})",
                u32::MAX - 1
            ))
        })
    }
}

/// Where a snapshot came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotSource {
    /// Written by vramscope's own caching allocator.
    #[default]
    Vramscope,
    /// Imported from `torch.cuda.memory._dump_snapshot()`.
    Pytorch,
    /// Imported from a torch.profiler Chrome trace with memory events.
    ChromeTrace,
}

impl fmt::Display for SnapshotSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SnapshotSource::Vramscope => "vramscope",
            SnapshotSource::Pytorch => "pytorch",
            SnapshotSource::ChromeTrace => "chrome-trace",
        })
    }
}

/// The device a snapshot describes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DeviceInfo {
    /// Device ordinal.
    pub index: u32,
    /// Human-readable name (`"sim (phantom)"`, `"NVIDIA H200"`).
    pub name: String,
    /// Backend kind: `"sim"` or `"cuda"`, or `"unknown"` for imported files.
    pub backend: String,
    /// Total device memory in bytes (0 when unknown).
    pub capacity: u64,
}

/// Which block pool a segment belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    /// Requests up to 1 MiB.
    Small,
    /// Requests over 1 MiB.
    #[default]
    Large,
}

/// The state of a block, as PyTorch names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BlockState {
    /// Handed out to the program.
    ActiveAllocated,
    /// Freed by the program, waiting for streams that used it.
    ActivePendingFree,
    /// Cached and free for reuse.
    Inactive,
}

impl BlockState {
    /// PyTorch's spelling of this state.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block inside a segment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Block {
    /// Device address of the block.
    pub address: u64,
    /// Size of the block in bytes (rounded, including split waste).
    pub size: u64,
    /// Bytes the program asked for (0 for free blocks).
    pub requested_size: u64,
    /// Allocation state.
    pub state: BlockState,
    /// Call site of the allocation that owns (or last owned) the block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteId>,
    /// Tag given with `alloc.tagged(..)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<TagId>,
    /// Innermost named scope that was open at allocation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<ScopeId>,
    /// Step number at allocation time.
    #[serde(default)]
    pub step: u64,
    /// Thread that allocated the block (vramscope's own small thread numbers).
    #[serde(default)]
    pub thread: u32,
}

/// A contiguous range of device memory obtained with one raw allocation (or one expandable
/// reservation), cut into blocks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    /// Device ordinal.
    pub device: u32,
    /// Base address.
    pub address: u64,
    /// Total size in bytes (mapped size for expandable segments).
    pub total_size: u64,
    /// Stream the segment serves.
    pub stream: u64,
    /// Pool of the segment.
    pub pool: Pool,
    /// Whether the segment is an expandable (virtual memory) segment.
    #[serde(default)]
    pub expandable: bool,
    /// The blocks, in address order, covering the segment exactly.
    pub blocks: Vec<Block>,
}

impl Segment {
    /// Bytes in blocks handed out to the program.
    pub fn allocated_bytes(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.size)
            .sum()
    }

    /// Bytes in blocks that are allocated or pending free.
    pub fn active_bytes(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state != BlockState::Inactive)
            .map(|b| b.size)
            .sum()
    }

    /// Bytes the program asked for in this segment's live blocks.
    pub fn requested_bytes(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::ActiveAllocated)
            .map(|b| b.requested_size)
            .sum()
    }

    /// The largest free block, in bytes.
    pub fn largest_free_block(&self) -> u64 {
        self.blocks
            .iter()
            .filter(|b| b.state == BlockState::Inactive)
            .map(|b| b.size)
            .max()
            .unwrap_or(0)
    }

    /// The first block (its index) that is out of place with why, for blocks in address
    /// order: one that lies outside the segment, or one that starts before the block ahead of
    /// it ends. `None` when every block lies inside the segment, apart from the others, as
    /// blocks a caching allocator cut from the segment do; blocks out of place would count
    /// the same bytes twice in every figure.
    pub fn misplaced_block(&self) -> Option<(usize, BlockPlacement)> {
        let end = self.address.saturating_add(self.total_size);
        let mut covered = self.address;
        for (i, block) in self.blocks.iter().enumerate() {
            let block_end = block.address.saturating_add(block.size);
            if block.address < self.address || block_end > end {
                return Some((i, BlockPlacement::OutsideSegment));
            }
            if block.address < covered {
                return Some((
                    i,
                    BlockPlacement::Overlaps {
                        previous_end: covered,
                    },
                ));
            }
            covered = block_end;
        }
        None
    }
}

/// How a block is out of place in its segment ([`Segment::misplaced_block`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockPlacement {
    /// The block starts before its segment or ends after it.
    OutsideSegment,
    /// The block starts before the block ahead of it, which ends at `previous_end`.
    Overlaps {
        /// Where the block ahead of it ends.
        previous_end: u64,
    },
}

/// The first segment (its index) that overlaps the one before it on the same device, for
/// segments sorted by device and address; `None` when they lie apart, as the segments of one
/// device's memory do.
pub fn overlapping_segment<S: std::borrow::Borrow<Segment>>(segments: &[S]) -> Option<usize> {
    segments
        .windows(2)
        .position(|pair| {
            let (before, after) = (pair[0].borrow(), pair[1].borrow());
            before.device == after.device
                && after.address < before.address.saturating_add(before.total_size)
        })
        .map(|i| i + 1)
}

/// Direction of a host/device copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransferDirection {
    /// Host memory to device memory.
    HostToDevice,
    /// Device memory to host memory (also a sync of the stream).
    DeviceToHost,
    /// Device memory to device memory.
    DeviceToDevice,
}

/// What an event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A block was handed out.
    Alloc,
    /// The program freed a block (it may still be pending on other streams).
    FreeRequested,
    /// A freed block returned to the cache.
    FreeCompleted,
    /// A raw device allocation (new segment).
    SegmentAlloc,
    /// A raw device free (segment released).
    SegmentFree,
    /// Physical pages mapped into an expandable segment.
    SegmentMap,
    /// Physical pages unmapped from an expandable segment.
    SegmentUnmap,
    /// `empty_cache()` was called; `size` holds the bytes released.
    EmptyCache,
    /// An allocation failed; `size` is the request, `device_free` the device's free memory.
    Oom,
    /// A host/device copy of `size` bytes.
    Transfer(TransferDirection),
    /// The host waited for a stream or the device.
    Sync,
    /// `mark_step()`: a new training step begins; `step` is the new step number.
    Step,
    /// A snapshot was taken.
    Snapshot,
}

impl EventKind {
    /// A short stable name for the kind (PyTorch's action names where they exist).
    pub fn name(self) -> &'static str {
        if let Some(action) = crate::pytorch::action_name(self) {
            return action;
        }
        match self {
            EventKind::EmptyCache => "empty_cache",
            EventKind::Transfer(TransferDirection::HostToDevice) => "transfer_h2d",
            EventKind::Transfer(TransferDirection::DeviceToHost) => "transfer_d2h",
            EventKind::Transfer(TransferDirection::DeviceToDevice) => "transfer_d2d",
            EventKind::Sync => "sync",
            EventKind::Step => "step",
            // PyTorch's actions, named above.
            _ => "",
        }
    }
}

/// One recorded allocator event.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// Sequence number, increasing by one per event recorded (gaps mean dropped events).
    pub seq: u64,
    /// Nanoseconds since [`Snapshot::epoch_unix_ns`].
    pub time_ns: u64,
    /// What happened.
    pub kind: EventKind,
    /// Device ordinal (two bytes: a snapshot holds devices below [`MAX_DEVICES`], and a
    /// 10M-event trace keeps 10M of these).
    #[serde(deserialize_with = "read_event_device")]
    pub device: u16,
    /// Stream handle.
    pub stream: u64,
    /// Device address (0 for an `oom`, which has no block).
    pub addr: u64,
    /// Size in bytes (block size, segment size, or bytes copied).
    pub size: u64,
    /// Bytes the program asked for (allocations only).
    #[serde(default)]
    pub requested: u64,
    /// Call site ([`Event::site`] reads it as a [`SiteId`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<Id>,
    /// Tag ([`Event::tag`] reads it as a [`TagId`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<Id>,
    /// Innermost named scope ([`Event::scope`] reads it as a [`ScopeId`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<Id>,
    /// Step number when the event happened (four bytes, as the allocator's ring keeps it: a
    /// run of more than 4 billion steps does not happen, and a file that names one is refused
    /// as it is read).
    #[serde(default, deserialize_with = "read_event_step")]
    pub step: u32,
    /// Thread number.
    #[serde(default)]
    pub thread: u32,
    /// For an `oom`: the device's free memory when the request failed, as PyTorch records it
    /// (`device_free` in its snapshots). For a `sync`: the nanoseconds the host waited, where
    /// the recording measured it (a profiler trace's runtime calls; [`Event::waited_ns`]), else
    /// 0. 0 for every other kind.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub device_free: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl Event {
    /// The call site, an index into [`Snapshot::sites`].
    #[inline]
    pub fn site(&self) -> Option<SiteId> {
        self.site.map(Id::get)
    }

    /// The tag, an index into [`Snapshot::tags`].
    #[inline]
    pub fn tag(&self) -> Option<TagId> {
        self.tag.map(Id::get)
    }

    /// The innermost named scope, an index into [`Snapshot::scopes`].
    #[inline]
    pub fn scope(&self) -> Option<ScopeId> {
        self.scope.map(Id::get)
    }

    /// For a `sync`, the nanoseconds the host waited, where the recording measured it (a
    /// profiler trace does; `None` otherwise and for every other kind).
    pub fn waited_ns(&self) -> Option<u64> {
        (self.kind == EventKind::Sync && self.device_free > 0).then_some(self.device_free)
    }

    /// Reads an event written in snapshot format `version` as this build's: an `oom` of
    /// format 1 kept the device's free memory in `addr`, which moves to `device_free`.
    pub fn upgrade_from(&mut self, version: u32) {
        if version <= FORMAT_VERSION_OOM_IN_ADDR && self.kind == EventKind::Oom {
            self.device_free = std::mem::take(&mut self.addr);
        }
    }
}

/// One frame of a stack.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Frame {
    /// Source file (`"??"` when unknown).
    pub file: String,
    /// Line number (0 when unknown).
    pub line: u32,
    /// Function name (may be empty).
    #[serde(default)]
    pub function: String,
}

/// A call site: where an allocation or transfer came from.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct CallSite {
    /// Source file of the primary location.
    pub file: String,
    /// Line of the primary location.
    pub line: u32,
    /// Column of the primary location (0 when unknown).
    #[serde(default)]
    pub column: u32,
    /// Function at the primary location, when known.
    #[serde(default)]
    pub function: String,
    /// The full stack, innermost frame first, when one was captured or imported.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub frames: Vec<Frame>,
}

impl CallSite {
    /// `file:line`, the form reports use.
    pub fn file_line(&self) -> String {
        format!("{}:{}", self.file, self.line)
    }
}

impl fmt::Display for CallSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.column > 0 {
            write!(f, "{}:{}:{}", self.file, self.line, self.column)
        } else {
            write!(f, "{}:{}", self.file, self.line)
        }
    }
}

/// The start of a training step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepMark {
    /// Step number (the first step is 1; allocations before it are step 0).
    pub step: u64,
    /// Sequence number of the first event that belongs to the step.
    pub seq: u64,
    /// Time of the mark, in nanoseconds since the epoch of the snapshot.
    pub time_ns: u64,
    /// Where the mark came from (`"mark_step"`, an annotation or profiler slice name).
    #[serde(default)]
    pub label: String,
}

/// A named annotation with a time, such as PyTorch's `external_annotations`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Annotation {
    /// Annotation name (`"Optimizer.step#AdamW.step"`).
    pub name: String,
    /// Stage (`"START"`, `"END"`), or empty.
    #[serde(default)]
    pub stage: String,
    /// Time in nanoseconds since the epoch of the snapshot.
    pub time_ns: u64,
    /// Device ordinal.
    #[serde(default)]
    pub device: u32,
}

/// What a debug check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// Freed memory was written before it was handed out again.
    UseAfterFree,
    /// The guard bytes after a block were overwritten.
    Overflow,
}

/// Who held a block: the allocation's call site, tag and step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// Call site of the allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<SiteId>,
    /// Tag of the allocation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<TagId>,
    /// Step of the allocation.
    pub step: u64,
}

/// A memory-safety violation found by the allocator's `debug` or `guard_bytes` checks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// What was found.
    pub kind: ViolationKind,
    /// First byte found changed.
    pub address: u64,
    /// Bytes found changed.
    pub bytes: u64,
    /// The block the bytes belong to (for a use after free, the block being handed out).
    pub block_address: u64,
    /// Size of that block.
    pub block_size: u64,
    /// For a use after free, the last owner of the written bytes; for an overflow, the owner of
    /// the overflowed block.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_owner: Option<Owner>,
    /// For a use after free, the allocation that found the damage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_owner: Option<Owner>,
}

/// Everything vramscope knows about one allocator (or one imported file) at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Format version, [`FORMAT_VERSION`] when written by this build.
    pub format_version: u32,
    /// Where the data came from.
    pub source: SnapshotSource,
    /// The device.
    pub device: DeviceInfo,
    /// The allocator settings in force.
    pub config: AllocatorConfig,
    /// Statistics at the time of the snapshot.
    pub stats: MemoryStats,
    /// Wall-clock time of event time zero, in nanoseconds since the Unix epoch.
    #[serde(default)]
    pub epoch_unix_ns: u64,
    /// Segments with their blocks, ordered by address.
    pub segments: Vec<Segment>,
    /// Recorded events, oldest first.
    pub events: Events,
    /// Events lost because the ring was full.
    #[serde(default)]
    pub dropped_events: u64,
    /// The call-site table that events and blocks index.
    pub sites: Vec<CallSite>,
    /// The tag table.
    #[serde(default)]
    pub tags: Vec<String>,
    /// The scope table (each entry a `/`-joined scope path).
    #[serde(default)]
    pub scopes: Vec<String>,
    /// Step starts.
    #[serde(default)]
    pub steps: Vec<StepMark>,
    /// Named, timed annotations.
    #[serde(default)]
    pub annotations: Vec<Annotation>,
    /// Use-after-free and overflow violations found by the debug checks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub violations: Vec<Violation>,
}

/// Why a snapshot could not be saved or loaded.
#[derive(Debug)]
#[non_exhaustive]
pub enum SnapshotError {
    /// Reading or writing the file failed.
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a valid vramscope snapshot.
    Format {
        /// The file.
        path: String,
        /// What is wrong, with line and column.
        message: String,
    },
    /// The file was written by a newer, incompatible version.
    Version {
        /// The file.
        path: String,
        /// The version found.
        found: u32,
    },
}

impl fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SnapshotError::Io { path, source } => write!(f, "{path}: {source}"),
            SnapshotError::Format { path, message } => {
                write!(f, "{path}: not a valid vramscope snapshot: {message}")
            }
            SnapshotError::Version { path, found } => write!(
                f,
                "{path}: snapshot format version {found} is newer than this build reads ({FORMAT_VERSION})"
            ),
        }
    }
}

impl std::error::Error for SnapshotError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SnapshotError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// How many devices a snapshot may name: device indices run from 0 to `MAX_DEVICES - 1`. A
/// process sees a few dozen GPUs at most; the bound keeps a device index read from a file from
/// sizing per-device tables and passes (a device 4,000,000,000 once made the PyTorch export
/// ask for 96 GB, and 40,000 devices made `report` take 28 s for a 200 KB file).
pub const MAX_DEVICES: u32 = 256;

/// Why device `device` is refused: past [`MAX_DEVICES`]. Every reader of device indices says
/// it in these words.
pub fn device_refusal(device: u64) -> String {
    format!(
        "device {device} is out of range: device indices run from 0 to {} (a process sees a few dozen GPUs at most)",
        MAX_DEVICES - 1
    )
}

/// `device` as an event holds it (in two bytes) when it is below [`MAX_DEVICES`], the devices
/// a snapshot may name; `None` past them, which every reader refuses in [`device_refusal`]'s
/// words.
pub fn event_device(device: u64) -> Option<u16> {
    u16::try_from(device)
        .ok()
        .filter(|&d| u32::from(d) < MAX_DEVICES)
}

/// Why step `step` is refused for an event, which keeps its step in four bytes. Every reader
/// of event steps says it in these words.
pub fn step_refusal(step: u64) -> String {
    format!(
        "step {step} is out of range: an event's step runs from 0 to {} (no run takes 4 billion steps)",
        u32::MAX
    )
}

/// `step` as an event holds it (in four bytes); `None` past `u32::MAX`, which every reader
/// refuses in [`step_refusal`]'s words.
pub fn event_step(step: u64) -> Option<u32> {
    u32::try_from(step).ok()
}

/// The step of an event after `starts` step starts: the count in four bytes. Steps counted
/// from a file's marks number fewer than its events, which four bytes hold, so the count
/// saturates only for a trace that no reader accepts.
pub fn step_after(starts: usize) -> u32 {
    u32::try_from(starts).unwrap_or(u32::MAX)
}

/// Reads an event's step from a file, refusing one that four bytes cannot hold
/// ([`event_step`]).
fn read_event_step<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u32, D::Error> {
    let step = u64::deserialize(deserializer)?;
    event_step(step).ok_or_else(|| serde::de::Error::custom(step_refusal(step)))
}

/// Reads an event's device index from a file, refusing one past [`MAX_DEVICES`]
/// ([`event_device`]): a larger one could not even be held.
fn read_event_device<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u16, D::Error> {
    let device = u64::deserialize(deserializer)?;
    event_device(device).ok_or_else(|| serde::de::Error::custom(device_refusal(device)))
}

impl Snapshot {
    /// The first device index at or past [`MAX_DEVICES`], with the path of its field
    /// (`events[17].device`); `None` when every device is in range.
    pub fn device_out_of_range(&self) -> Option<(String, u32)> {
        let bad = |d: u32| event_device(u64::from(d)).is_none();
        if bad(self.device.index) {
            return Some(("device.index".to_string(), self.device.index));
        }
        let first = |what: &str, devices: &mut dyn Iterator<Item = u32>| {
            devices
                .enumerate()
                .find(|&(_, d)| bad(d))
                .map(|(i, d)| (format!("{what}[{i}].device"), d))
        };
        first(
            "events",
            &mut self.events.iter().map(|e| u32::from(e.device)),
        )
        .or_else(|| first("segments", &mut self.segments.iter().map(|s| s.device)))
        .or_else(|| {
            first(
                "annotations",
                &mut self.annotations.iter().map(|a| a.device),
            )
        })
    }

    /// An empty snapshot of `source` for `device`, with default settings and zero statistics.
    pub fn empty(source: SnapshotSource, device: DeviceInfo) -> Snapshot {
        Snapshot {
            format_version: FORMAT_VERSION,
            source,
            device,
            config: AllocatorConfig::default(),
            stats: MemoryStats::default(),
            epoch_unix_ns: 0,
            segments: Vec::new(),
            events: Events::new(),
            dropped_events: 0,
            sites: Vec::new(),
            tags: Vec::new(),
            scopes: Vec::new(),
            steps: Vec::new(),
            annotations: Vec::new(),
            violations: Vec::new(),
        }
    }

    /// Writes the snapshot as JSON to `path`, as a new file renamed onto it
    /// ([`crate::files::NewFile`]): a link standing at the path is replaced, never written
    /// through.
    pub fn save(&self, path: impl AsRef<Path>) -> Result<(), SnapshotError> {
        let path = path.as_ref();
        let io = |source| SnapshotError::Io {
            path: path.display().to_string(),
            source,
        };
        // A new file renamed onto the path: never written through a link standing there.
        let mut writer = crate::files::NewFile::create(path).map_err(io)?;
        serde_json::to_writer(&mut writer, self).map_err(|e| SnapshotError::Format {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        writer.commit().map_err(io)
    }

    /// Reads a JSON snapshot written by [`Snapshot::save`].
    pub fn load(path: impl AsRef<Path>) -> Result<Snapshot, SnapshotError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| SnapshotError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Snapshot::from_json_bytes(&bytes, &path.display().to_string())
    }

    /// Parses a JSON snapshot from memory; `origin` names the data in errors.
    pub fn from_json_bytes(bytes: &[u8], origin: &str) -> Result<Snapshot, SnapshotError> {
        #[derive(Deserialize)]
        struct VersionProbe {
            format_version: u32,
        }
        let format = |e: serde_json::Error| SnapshotError::Format {
            path: origin.to_string(),
            message: e.to_string(),
        };
        let probe: VersionProbe = serde_json::from_slice(bytes).map_err(format)?;
        if probe.format_version > FORMAT_VERSION {
            return Err(SnapshotError::Version {
                path: origin.to_string(),
                found: probe.format_version,
            });
        }
        let mut snapshot: Snapshot = serde_json::from_slice(bytes).map_err(format)?;
        for event in &mut snapshot.events {
            event.upgrade_from(probe.format_version);
        }
        snapshot.format_version = FORMAT_VERSION;
        Ok(snapshot)
    }

    /// Writes the snapshot as an event log: JSON Lines whose first line is the snapshot without
    /// its events (device, settings, statistics, the segments at the end, call-site tables,
    /// steps) plus [`EVENT_LOG_COUNT_KEY`], the number of event lines that follow, and every
    /// further line one event, oldest first. The header's state is the log's end, so the
    /// events are only read whole: the inspector refuses a log with fewer (or more) event
    /// lines than its header counts, rather than rebuild a wrong start from them.
    pub fn write_event_log(&self, mut out: impl std::io::Write) -> std::io::Result<()> {
        let header = Snapshot {
            events: Events::new(),
            ..self.clone()
        };
        // The count goes last, so that `format_version` stays the first key (which is how a
        // reader tells our JSON from a Chrome trace).
        let mut header = serde_json::to_vec(&header)?;
        if header.last() == Some(&b'}') {
            header.pop();
            let count = format!(",\"{EVENT_LOG_COUNT_KEY}\":{}}}", self.events.len());
            header.extend_from_slice(count.as_bytes());
        }
        out.write_all(&header)?;
        out.write_all(b"\n")?;
        for event in &self.events {
            serde_json::to_writer(&mut out, event)?;
            out.write_all(b"\n")?;
        }
        out.flush()
    }

    /// The call site with id `id`, if the table has it.
    pub fn site(&self, id: Option<SiteId>) -> Option<&CallSite> {
        id.and_then(|i| self.sites.get(i as usize))
    }

    /// The tag string with id `id`.
    pub fn tag(&self, id: Option<TagId>) -> Option<&str> {
        id.and_then(|i| self.tags.get(i as usize))
            .map(String::as_str)
    }

    /// The scope path with id `id`.
    pub fn scope(&self, id: Option<ScopeId>) -> Option<&str> {
        id.and_then(|i| self.scopes.get(i as usize))
            .map(String::as_str)
    }

    /// Number of the last step seen (0 when no step was marked).
    pub fn last_step(&self) -> u64 {
        self.steps.last().map(|s| s.step).unwrap_or(0)
    }
}
