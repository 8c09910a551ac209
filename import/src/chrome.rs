//! Importer for torch.profiler Chrome traces recorded with `profile_memory=True`.
//!
//! `super::load_bytes` hands the JSON here (an object with `traceEvents`, or a bare array of
//! events), as bytes or, for gzip data, as a reader that unpacks it on the way. The profiler writes
//! one instant event named `[memory]` per allocation and free, with args `Addr`, `Bytes` (negative
//! for a free), `Total Allocated`, `Total Reserved`, `Device Type` (1 is CUDA) and `Device Id`.
//! Those of CUDA devices become `Alloc` and `FreeCompleted` events of a
//! `vramscope_model::Snapshot` with source `ChromeTrace`, ordered by time (the file is not);
//! their `requested` is 0 because the profiler records only block sizes. `ProfilerStep#N` slices
//! (phase `X`) become the steps of `Snapshot::steps`, numbered from 1 in time order and labelled
//! with the slice name, and every event gets the step it falls in. The statistics keep the last
//! `Total Allocated` and `Total Reserved` as current values and their maxima as peaks; allocation
//! counts and the per-pool split of allocated bytes come from replaying the recorded window. The
//! trace has no segments, stacks or allocator settings.
//!
//! Only the fields needed are deserialized, leniently: an argument of an unexpected type is
//! ignored rather than fatal, so traces of other profiler versions still load. Keys, and the
//! names, phases and categories of events, are compared without being copied; only the
//! memory events and step slices are kept, so that memory does not grow with the size of
//! the trace's other events. Values under keys the importer does not read are skipped by
//! serde_json without recursion, however deeply nested. Everywhere else (each event, and each
//! field it reads, even one of a type it then ignores) nesting deeper than [`MAX_JSON_DEPTH`]
//! (serde_json's own limit) is an error naming the limit, with line and column: an array
//! nested a million deep is not an empty trace. Malformed JSON is a clean error with line and
//! column.

use std::borrow::Cow;
use std::fmt;

use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use vramscope_model::pytorch::pool_for;
use vramscope_model::{
    DeviceInfo, Event, EventKind, MemoryStats, Snapshot, SnapshotSource, Stat, FORMAT_VERSION,
};

use super::sites::SiteTable;
use super::timeline;
use super::{ImportError, ImportErrorKind, ImportOptions};
use vramscope_engine::stats::TrackArray;

mod activity;

/// The `Device Type` of CUDA devices in profiler memory events.
const CUDA_DEVICE_TYPE: i128 = 1;
/// The name of the profiler's memory events.
const MEMORY_EVENT: &str = "[memory]";

/// Converts a Chrome trace; `origin` names the data in errors.
pub fn from_json_bytes(
    bytes: &[u8],
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    match read(bytes, origin, options)? {
        Read::Trace(snapshot) => Ok(*snapshot),
        Read::OwnSnapshot => Err(ImportError::new(
            origin,
            ImportErrorKind::UnknownFormat {
                found: "a vramscope JSON snapshot, not a Chrome trace".to_string(),
            },
        )),
    }
}

/// What a JSON object turned out to be.
pub(crate) enum Read {
    /// A Chrome trace, converted.
    Trace(Box<Snapshot>),
    /// A vramscope snapshot whose first key is not `format_version`.
    OwnSnapshot,
}

/// Reads a Chrome trace, or recognises a vramscope snapshot for the caller to load.
pub(crate) fn read(
    bytes: &[u8],
    origin: &str,
    options: &ImportOptions,
) -> Result<Read, ImportError> {
    let top: Top<'_> = serde_json::from_slice(bytes).map_err(|e| json_error(origin, e))?;
    finish(top, origin, options)
}

/// Like [`read`], but reads the JSON from `reader` as it goes, so that it is never held in
/// memory whole (the caller unpacks gzip data into it).
pub(crate) fn read_from(
    reader: impl std::io::Read,
    origin: &str,
    options: &ImportOptions,
) -> Result<Read, ImportError> {
    let json = |e| json_error(origin, e);
    let reader = std::io::BufReader::with_capacity(64 << 10, reader);
    let mut de = serde_json::Deserializer::from_reader(reader);
    let top = Top::deserialize(&mut de).map_err(json)?;
    // Only whitespace may follow, as `serde_json::from_slice` requires.
    de.end().map_err(json)?;
    finish(top, origin, options)
}

/// The deepest nesting of JSON arrays and objects the importer reads: serde_json's recursion
/// limit, which holds wherever the importer reads values (the events, and the fields of each
/// that it looks at). Values under keys it does not read are skipped without recursion,
/// however deep.
pub const MAX_JSON_DEPTH: usize = 127;

/// The import error for a JSON error: [`ImportErrorKind::TooDeep`] for serde_json's recursion
/// limit, [`ImportErrorKind::Json`] for anything else.
fn json_error(origin: &str, e: serde_json::Error) -> ImportError {
    // serde_json names this error only in its message.
    let kind = if e.classify() == serde_json::error::Category::Syntax
        && e.to_string().starts_with("recursion limit exceeded")
    {
        ImportErrorKind::TooDeep {
            limit: MAX_JSON_DEPTH,
            line: e.line(),
            column: e.column(),
        }
    } else {
        ImportErrorKind::Json(e)
    };
    ImportError::new(origin, kind)
}

fn finish(top: Top<'_>, origin: &str, options: &ImportOptions) -> Result<Read, ImportError> {
    let (events, devices, base_ns) = match top {
        Top::Events(events) => (events, Vec::new(), None),
        Top::Object(doc) => {
            if doc.format_version.is_some() {
                return Ok(Read::OwnSnapshot);
            }
            let Some(events) = doc.trace_events else {
                return Err(ImportError::new(
                    origin,
                    ImportErrorKind::UnknownFormat {
                        found: "a JSON object with neither `traceEvents` nor `format_version`"
                            .to_string(),
                    },
                ));
            };
            (
                events,
                doc.device_properties.unwrap_or_default(),
                doc.base_time_ns.int(),
            )
        }
    };
    check_figures(&events.memory, origin)?;
    Ok(Read::Trace(Box::new(convert(
        events, &devices, base_ns, options,
    ))))
}

/// Checks the figures of the memory events, as the PyTorch importer does, so that no sum
/// computed from them later can pass 64 bits: every block must end below 2^63, the sizes
/// together and each total must stay within 2^60 bytes (1 EiB). The error names the event by
/// its place among the file's `[memory]` events and the field.
fn check_figures(memory: &[Memory], origin: &str) -> Result<(), ImportError> {
    const MAX_TOTAL: u128 = 1 << 60;
    const ADDRESS_END: u128 = 1 << 63;
    let mut total: u128 = 0;
    for (k, m) in memory.iter().enumerate() {
        let size = m.bytes.unsigned_abs();
        let fault = |field: &str, message: String| {
            ImportError::new(
                origin,
                ImportErrorKind::Structure {
                    path: format!("[memory] event {k} of the file, args.{field}"),
                    message,
                },
            )
        };
        if vramscope_model::event_device(u64::from(m.device)).is_none() {
            return Err(fault(
                "Device Id",
                vramscope_model::device_refusal(u64::from(m.device)),
            ));
        }
        if m.addr.unwrap_or(0) as u128 + size > ADDRESS_END {
            return Err(fault(
                "Addr",
                format!(
                    "{:#x} + {size} bytes ends past 2^63, outside any device's address space; the file is inconsistent",
                    m.addr.unwrap_or(0)
                ),
            ));
        }
        total += size;
        for (field, figure) in [
            ("Bytes", total),
            ("Total Allocated", m.total_allocated.unwrap_or(0).into()),
            ("Total Reserved", m.total_reserved.unwrap_or(0).into()),
        ] {
            if figure > MAX_TOTAL {
                return Err(fault(
                    field,
                    "more than 2^60 bytes (1 EiB), alone or with the sizes before it, which no device holds; the file is inconsistent".to_string(),
                ));
            }
        }
    }
    Ok(())
}

/// A trace file: an object with `traceEvents`, or a bare array of events.
enum Top<'a> {
    Events(Collected<'a>),
    Object(Document<'a>),
}

struct TopVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for TopVisitor<'a> {
    type Value = Top<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with `traceEvents` or a list of trace events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Top<'a>, A::Error> {
        CollectVisitor(std::marker::PhantomData)
            .visit_seq(seq)
            .map(Top::Events)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Top<'a>, A::Error> {
        Document::deserialize(MapAccessDeserializer::new(map)).map(Top::Object)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Top<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TopVisitor(std::marker::PhantomData))
    }
}

/// The events the importer keeps, gathered while `traceEvents` is read (so that the many
/// other events are never stored).
#[derive(Default)]
struct Collected<'a> {
    memory: Vec<Memory>,
    /// Start time and name of each `ProfilerStep#N` slice.
    step_slices: Vec<(f64, Cow<'a, str>)>,
    /// Host slices, runtime calls, device copies and flows, for the waits and the stacks.
    activity: activity::Gathered,
}

impl<'a> Collected<'a> {
    fn add(&mut self, e: RawEvent<'a>) {
        match e.name {
            Name::Memory => {
                let thread = self.activity.thread(e.pid, e.tid);
                self.memory.extend(memory_event(e.ts, &e.args, thread));
            }
            Name::Step(name) if e.ph == b'X' && e.cat != Some(CAT_GPU_ANNOTATION) => {
                if let Some(ts) = e.ts.float() {
                    self.step_slices.push((ts, name));
                }
            }
            Name::Other(ref name) => self.activity.add(name, &e),
            _ => {}
        }
    }
}

struct CollectVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for CollectVisitor<'a> {
    type Value = Collected<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of trace events")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Collected<'a>, A::Error> {
        let mut collected = Collected::default();
        while let Some(event) = seq.next_element::<RawEvent<'a>>()? {
            collected.add(event);
        }
        Ok(collected)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Collected<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_seq(CollectVisitor(std::marker::PhantomData))
    }
}

/// The top level of a trace file, reduced to what the importer needs.
#[derive(Deserialize)]
struct Document<'a> {
    #[serde(rename = "traceEvents", borrow, default)]
    trace_events: Option<Collected<'a>>,
    #[serde(rename = "deviceProperties", borrow, default)]
    device_properties: Option<Vec<DeviceProps<'a>>>,
    #[serde(rename = "baseTimeNanoseconds", default)]
    base_time_ns: Num,
    #[serde(default)]
    format_version: Option<IgnoredAny>,
}

/// One entry of `deviceProperties`.
#[derive(Deserialize)]
struct DeviceProps<'a> {
    #[serde(default)]
    id: Num,
    #[serde(borrow, default)]
    name: Text<'a>,
    #[serde(rename = "totalGlobalMem", default)]
    total_global_mem: Num,
}

/// A string, or nothing when the JSON value is of another type.
#[derive(Default)]
pub(crate) struct Text<'a>(pub(crate) Option<Cow<'a, str>>);

/// A number, or nothing when the JSON value is of another type. Integers are kept exactly.
#[derive(Default, Clone, Copy)]
pub(crate) enum Num {
    #[default]
    Absent,
    Int(i128),
    Float(f64),
}

impl Num {
    pub(crate) fn int(self) -> Option<i128> {
        match self {
            Num::Int(i) => Some(i),
            Num::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e30 => Some(f as i128),
            _ => None,
        }
    }

    pub(crate) fn float(self) -> Option<f64> {
        match self {
            Num::Int(i) => Some(i as f64),
            Num::Float(f) if f.is_finite() => Some(f),
            _ => None,
        }
    }

    fn u64(self) -> Option<u64> {
        self.int().and_then(|i| u64::try_from(i).ok())
    }
}

/// The args the importer reads: those of a `[memory]` event, a runtime call's or device copy's
/// `correlation`, a device copy's `bytes` and the 2021 format's `Call stack`; others are
/// skipped.
#[derive(Default)]
pub(crate) struct Args<'a> {
    addr: Num,
    bytes: Num,
    total_allocated: Num,
    total_reserved: Num,
    device_type: Num,
    device_id: Num,
    pub(crate) correlation: Num,
    pub(crate) copy_bytes: Num,
    pub(crate) call_stack: Text<'a>,
}

/// Consumes and discards the rest of a sequence where a value was expected, within
/// serde_json's recursion limit.
fn skip_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<Skip>()?.is_some() {}
    Ok(())
}

/// Consumes and discards the rest of a map where a value was expected, within serde_json's
/// recursion limit.
fn skip_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, Skip>()?.is_some() {}
    Ok(())
}

/// A value read only to be discarded, through `deserialize_any` so that serde_json counts its
/// nesting against its recursion limit (`IgnoredAny` is skipped without counting, which is
/// right only under keys the importer does not read).
struct Skip;

struct SkipVisitor;

impl<'de> Visitor<'de> for SkipVisitor {
    type Value = Skip;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_str<E>(self, _: &str) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_unit<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_none<E>(self) -> Result<Skip, E> {
        Ok(Skip)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Skip, A::Error> {
        skip_seq(seq)?;
        Ok(Skip)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Skip, A::Error> {
        skip_map(map)?;
        Ok(Skip)
    }
}

impl<'de> Deserialize<'de> for Skip {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(SkipVisitor)
    }
}

/// Implements the visits that make a lenient value "absent".
macro_rules! absent_otherwise {
    () => {
        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_none<E>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            skip_seq(seq)?;
            Ok(Default::default())
        }
    };
}

struct TextVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for TextVisitor<'a> {
    type Value = Text<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Borrowed(v))))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Owned(v.to_string()))))
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(Text(Some(Cow::Owned(v))))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Text(None))
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Text(None))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Text(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)?;
        Ok(Text(None))
    }

    absent_otherwise!();
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextVisitor(std::marker::PhantomData))
    }
}

struct NumVisitor;

impl<'de> Visitor<'de> for NumVisitor {
    type Value = Num;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_i64<E>(self, v: i64) -> Result<Num, E> {
        Ok(Num::Int(v as i128))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Num, E> {
        Ok(Num::Int(v as i128))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Num, E> {
        Ok(Num::Float(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Num, E> {
        let v = v.trim();
        Ok(match v.parse::<i128>() {
            Ok(i) => Num::Int(i),
            Err(_) => v.parse::<f64>().map(Num::Float).unwrap_or(Num::Absent),
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Num, A::Error> {
        skip_map(map)?;
        Ok(Num::Absent)
    }

    absent_otherwise!();
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NumVisitor)
    }
}

struct ArgsVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ArgsVisitor<'a> {
    type Value = Args<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Args<'a>, A::Error> {
        let mut args = Args::default();
        const KEYS: &[&str] = &[
            "Addr",
            "Bytes",
            "Total Allocated",
            "Total Reserved",
            "Device Type",
            "Device Id",
            "correlation",
            "bytes",
            "Call stack",
        ];
        while let Some(key) = map.next_key_seed(KeyIn(KEYS))? {
            let slot = match key {
                Some(0) => &mut args.addr,
                Some(1) => &mut args.bytes,
                Some(2) => &mut args.total_allocated,
                Some(3) => &mut args.total_reserved,
                Some(4) => &mut args.device_type,
                Some(5) => &mut args.device_id,
                Some(6) => &mut args.correlation,
                Some(7) => &mut args.copy_bytes,
                Some(8) => {
                    args.call_stack = map.next_value()?;
                    continue;
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            *slot = map.next_value()?;
        }
        Ok(args)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }

    fn visit_str<E>(self, _: &str) -> Result<Args<'a>, E> {
        Ok(Args::default())
    }

    absent_otherwise!();
}

impl<'de: 'a, 'a> Deserialize<'de> for Args<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ArgsVisitor(std::marker::PhantomData))
    }
}

/// The categories the importer tells apart, by their place in [`CATEGORIES`].
const CATEGORIES: &[&str] = &[
    "cpu_op",
    "Operator",
    "python_function",
    "cuda_runtime",
    "Runtime",
    "cuda_driver",
    "gpu_memcpy",
    "Memcpy",
    "ac2g",
    "gpu_user_annotation",
];
/// `gpu_user_annotation`, the GPU copy of an annotation.
const CAT_GPU_ANNOTATION: usize = 9;

/// One trace event, reduced to what the importer needs. An event that is not a JSON object
/// is read as an empty event and ignored.
#[derive(Default)]
pub(crate) struct RawEvent<'a> {
    name: Name<'a>,
    /// The first byte of `ph` (`X` a complete slice, `s` and `f` a flow's ends).
    pub(crate) ph: u8,
    /// The place of `cat` in [`CATEGORIES`].
    pub(crate) cat: Option<usize>,
    pub(crate) ts: Num,
    pub(crate) dur: Num,
    pub(crate) pid: Num,
    pub(crate) tid: Num,
    /// A flow's id.
    pub(crate) id: Num,
    pub(crate) args: Args<'a>,
}

/// The `name` of a trace event, as far as the importer cares: only the names of steps are
/// kept.
#[derive(Default)]
enum Name<'a> {
    /// No name yet, or one that is not a string.
    #[default]
    Absent,
    /// `[memory]`.
    Memory,
    /// A name starting with `ProfilerStep#`.
    Step(Cow<'a, str>),
    /// Any other string.
    Other(Cow<'a, str>),
}

impl<'a> Name<'a> {
    fn classify(name: &str, keep: impl FnOnce() -> Cow<'a, str>) -> Name<'a> {
        if name == MEMORY_EVENT {
            Name::Memory
        } else if name.starts_with("ProfilerStep#") {
            Name::Step(keep())
        } else {
            Name::Other(keep())
        }
    }
}

struct NameVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for NameVisitor<'a> {
    type Value = Name<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Name::classify(v, || Cow::Borrowed(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Name::classify(v, || Cow::Owned(v.to_string())))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Name::Absent)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(Name::Absent)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Name::Absent)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        skip_map(map)?;
        Ok(Name::Absent)
    }

    absent_otherwise!();
}

impl<'de: 'a, 'a> Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NameVisitor(std::marker::PhantomData))
    }
}

/// A map key looked up among known names without being copied: its position among them, or
/// `None` for any other key.
#[derive(Clone, Copy)]
struct KeyIn(&'static [&'static str]);

impl<'de> Visitor<'de> for KeyIn {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|&k| k == v))
    }
}

impl<'de> DeserializeSeed<'de> for KeyIn {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_str(self)
    }
}

/// Whether the importer reads the args of `event`, as far as it is known when they come:
/// those of memory events and of the categories the waits and stacks need (and of an event
/// whose name or category is still unknown).
fn wants_args(event: &RawEvent<'_>) -> bool {
    match event.name {
        Name::Absent | Name::Memory => true,
        Name::Step(_) => false,
        Name::Other(_) => event.cat != Some(CAT_GPU_ANNOTATION),
    }
}

/// The place of a string value among the strings given, read without copying it; any other
/// value is skipped.
#[derive(Clone, Copy)]
struct OneOf(&'static [&'static str]);

impl<'de> Visitor<'de> for OneOf {
    type Value = Option<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, v: &str) -> Result<Option<usize>, E> {
        Ok(self.0.iter().position(|&k| k == v))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Option<usize>, E> {
        Ok(None)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Option<usize>, E> {
        Ok(None)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Option<usize>, E> {
        Ok(None)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Option<usize>, A::Error> {
        skip_map(map)?;
        Ok(None)
    }

    absent_otherwise!();
}

impl<'de> DeserializeSeed<'de> for OneOf {
    type Value = Option<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Option<usize>, D::Error> {
        d.deserialize_any(self)
    }
}

/// The first byte of a string value (0 for an empty string or any other value, which is
/// skipped).
#[derive(Clone, Copy)]
struct FirstByte;

impl<'de> Visitor<'de> for FirstByte {
    type Value = u8;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_str<E>(self, v: &str) -> Result<u8, E> {
        Ok(v.bytes().next().unwrap_or(0))
    }

    fn visit_i64<E>(self, _: i64) -> Result<u8, E> {
        Ok(0)
    }

    fn visit_u64<E>(self, _: u64) -> Result<u8, E> {
        Ok(0)
    }

    fn visit_f64<E>(self, _: f64) -> Result<u8, E> {
        Ok(0)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<u8, A::Error> {
        skip_map(map)?;
        Ok(0)
    }

    absent_otherwise!();
}

impl<'de> DeserializeSeed<'de> for FirstByte {
    type Value = u8;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u8, D::Error> {
        d.deserialize_any(self)
    }
}

struct RawEventVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for RawEventVisitor<'a> {
    type Value = RawEvent<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a trace event")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawEvent<'a>, A::Error> {
        let mut event = RawEvent::default();
        const KEYS: &[&str] = &["name", "ph", "cat", "ts", "args", "dur", "pid", "tid", "id"];
        while let Some(key) = map.next_key_seed(KeyIn(KEYS))? {
            match key {
                Some(0) => event.name = map.next_value()?,
                Some(1) => event.ph = map.next_value_seed(FirstByte)?,
                Some(2) => event.cat = map.next_value_seed(OneOf(CATEGORIES))?,
                Some(3) => event.ts = map.next_value()?,
                // The profiler writes `name` and `cat` before `args`: the args of the many
                // events the importer does not read are skipped without being looked at.
                Some(4) if wants_args(&event) => event.args = map.next_value()?,
                Some(5) => event.dur = map.next_value()?,
                Some(6) => event.pid = map.next_value()?,
                Some(7) => event.tid = map.next_value()?,
                Some(8) => event.id = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(event)
    }

    fn visit_i64<E>(self, _: i64) -> Result<RawEvent<'a>, E> {
        Ok(RawEvent::default())
    }

    fn visit_u64<E>(self, _: u64) -> Result<RawEvent<'a>, E> {
        Ok(RawEvent::default())
    }

    fn visit_f64<E>(self, _: f64) -> Result<RawEvent<'a>, E> {
        Ok(RawEvent::default())
    }

    fn visit_str<E>(self, _: &str) -> Result<RawEvent<'a>, E> {
        Ok(RawEvent::default())
    }

    absent_otherwise!();
}

impl<'de: 'a, 'a> Deserialize<'de> for RawEvent<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(RawEventVisitor(std::marker::PhantomData))
    }
}

/// A CUDA memory event, before times are made relative.
struct Memory {
    ts: f64,
    device: u32,
    /// The block's address; `None` in the 2021 format, which records only `Bytes`.
    addr: Option<u64>,
    bytes: i128,
    total_allocated: Option<u64>,
    total_reserved: Option<u64>,
    /// The thread that recorded it (`Gathered::thread`).
    thread: u32,
}

fn memory_event(ts: Num, args: &Args<'_>, thread: u32) -> Option<Memory> {
    if args.device_type.int()? != CUDA_DEVICE_TYPE {
        return None;
    }
    let bytes = args.bytes.int().filter(|&b| b != 0)?;
    let addr = match args.addr {
        Num::Absent => None,
        addr => Some(addr.u64()?),
    };
    Some(Memory {
        ts: ts.float()?,
        device: u32::try_from(args.device_id.int().unwrap_or(0)).ok()?,
        addr,
        bytes,
        total_allocated: args.total_allocated.u64(),
        total_reserved: args.total_reserved.u64(),
        thread,
    })
}

/// Where the importer places the blocks of memory events that carry no address (the 2021
/// format's `Bytes`-only events): far above any device's real addresses, below 2^63.
pub const SYNTHETIC_ADDRESS_BASE: u64 = 1 << 62;

/// Gives every memory event without an address (the 2021 format) one that pairs it: an
/// allocation a fresh block, a free the latest live block of its size on its device, or, when
/// there is none (a block from before the trace), a fresh one. The allocated bytes after every
/// event are then exact, as the deltas give them; which allocation a free releases is a guess
/// by size, which the trace cannot settle.
fn place_unaddressed(memory: &mut [Memory]) {
    let mut next = SYNTHETIC_ADDRESS_BASE;
    let mut live: rustc_hash::FxHashMap<(u32, u64), Vec<u64>> = Default::default();
    for m in memory.iter_mut().filter(|m| m.addr.is_none()) {
        let size = u64::try_from(m.bytes.unsigned_abs()).unwrap_or(u64::MAX);
        let mut fresh = || {
            let at = next;
            next = next.saturating_add(size.div_ceil(512).max(1) * 512);
            at
        };
        let addr = if m.bytes > 0 {
            let at = fresh();
            live.entry((m.device, size)).or_default().push(at);
            at
        } else {
            live.get_mut(&(m.device, size))
                .and_then(Vec::pop)
                .unwrap_or_else(fresh)
        };
        m.addr = Some(addr);
    }
}

fn convert(
    collected: Collected<'_>,
    devices: &[DeviceProps<'_>],
    base_ns: Option<i128>,
    options: &ImportOptions,
) -> Snapshot {
    let Collected {
        mut memory,
        mut step_slices,
        activity,
    } = collected;
    // The file lists events per thread, not in time order; a stable sort keeps the file's order
    // for events at the same microsecond.
    memory.sort_by(|a, b| a.ts.total_cmp(&b.ts));
    place_unaddressed(&mut memory);
    step_slices.sort_by(|a, b| a.0.total_cmp(&b.0));
    // A step's slice can appear more than once (several threads): keep the first.
    let mut seen = std::collections::HashSet::new();
    step_slices.retain(|(_, name)| seen.insert(name.clone()));

    let index = memory.iter().map(|m| m.device).min().unwrap_or(0);
    let mut sites = SiteTable::new(&options.framework_paths);
    let queries: Vec<activity::Query> = memory
        .iter()
        .map(|m| activity::Query {
            thread: m.thread,
            ts: m.ts,
        })
        .collect();
    let resolved = activity.resolve(&queries, &mut sites, u16::try_from(index).unwrap_or(0));

    let epoch_ts = memory
        .first()
        .map(|m| m.ts)
        .into_iter()
        .chain(step_slices.first().map(|s| s.0))
        .chain(resolved.events.iter().map(|(ts, _)| *ts))
        .reduce(f64::min)
        .unwrap_or(0.0);
    let relative = |ts: f64| ((ts - epoch_ts) * 1000.0).round().max(0.0) as u64;
    let epoch_unix_ns = match base_ns {
        Some(base) => {
            let base = u64::try_from(base).unwrap_or(0);
            base.saturating_add((epoch_ts * 1000.0).round().max(0.0) as u64)
        }
        None => timeline::unix_epoch_ns(epoch_ts),
    };

    let mut timed: Vec<(f64, Event)> = memory
        .iter()
        .zip(&resolved.memory_sites)
        .map(|(m, &site)| {
            let size = u64::try_from(m.bytes.unsigned_abs()).unwrap_or(u64::MAX);
            let event = Event {
                seq: 0,
                time_ns: 0,
                kind: if m.bytes > 0 {
                    EventKind::Alloc
                } else {
                    EventKind::FreeCompleted
                },
                // `check_figures` refused devices past `MAX_DEVICES`.
                device: u16::try_from(m.device).unwrap_or(u16::MAX),
                stream: 0,
                addr: m.addr.unwrap_or(0),
                size,
                requested: 0,
                site: site.and_then(vramscope_model::Id::new),
                tag: None,
                scope: None,
                step: 0,
                thread: 0,
                device_free: 0,
            };
            (m.ts, event)
        })
        .collect();
    timed.extend(resolved.events);
    // Stable: memory events keep their order, and a wait follows the memory events of its
    // microsecond.
    timed.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut events: Vec<Event> = timed
        .into_iter()
        .enumerate()
        .map(|(seq, (ts, mut e))| {
            e.seq = seq as u64;
            e.time_ns = relative(ts);
            e
        })
        .collect();
    let starts = if step_slices.is_empty() && !events.is_empty() {
        // Without `ProfilerStep#` slices the trace is one step: a loop over a model's layers
        // inside one forward is not a loop over steps.
        vec![(0, WHOLE_TRACE_STEP.to_string())]
    } else {
        step_slices
            .iter()
            .map(|(ts, name)| (relative(*ts), name.to_string()))
            .collect()
    };
    let steps = timeline::assign_steps_by_time(&mut events, starts);

    let stats = compute_stats(&memory, &events, index);
    let props = devices.iter().find(|d| d.id.int() == Some(index as i128));
    let device = DeviceInfo {
        index,
        name: props
            .and_then(|p| p.name.0.as_deref())
            .map(str::to_string)
            .unwrap_or_else(|| format!("cuda:{index}")),
        backend: "cuda".to_string(),
        capacity: props.and_then(|p| p.total_global_mem.u64()).unwrap_or(0),
    };
    let mut snapshot = Snapshot::empty(SnapshotSource::ChromeTrace, device);
    snapshot.format_version = FORMAT_VERSION;
    snapshot.stats = stats;
    snapshot.epoch_unix_ns = epoch_unix_ns;
    snapshot.events = events.into();
    snapshot.steps = steps;
    snapshot.sites = sites.into_sites();
    snapshot
}

/// The label of the one step of a trace without `ProfilerStep#` slices.
pub const WHOLE_TRACE_STEP: &str = "the whole trace (no ProfilerStep# slices)";

/// A statistic known only from a series of totals: the last as current, the largest as peak.
fn from_totals(values: impl Iterator<Item = u64>) -> Option<Stat> {
    let mut stat: Option<Stat> = None;
    for v in values {
        let s = stat.get_or_insert_with(Stat::default);
        s.current = v;
        s.peak = s.peak.max(v);
    }
    stat
}

fn compute_stats(memory: &[Memory], events: &[Event], device: u32) -> MemoryStats {
    let mut allocated = TrackArray::default();
    let mut allocation = TrackArray::default();
    for e in events.iter().filter(|e| {
        u32::from(e.device) == device
            && matches!(e.kind, EventKind::Alloc | EventKind::FreeCompleted)
    }) {
        let pool = pool_for(e.size);
        if e.kind == EventKind::Alloc {
            allocated.add(pool, e.size);
            allocation.add(pool, 1);
        } else {
            allocated.remove(pool, e.size);
            allocation.remove(pool, 1);
        }
    }
    let mut stats = MemoryStats {
        allocated_bytes: allocated.finish(None),
        allocation: allocation.finish(None),
        ..MemoryStats::default()
    };
    let mine = || memory.iter().filter(|m| m.device == device);
    if let Some(total) = from_totals(mine().filter_map(|m| m.total_allocated)) {
        let all = &mut stats.allocated_bytes.all;
        all.current = total.current;
        all.peak = total.peak;
    }
    if let Some(total) = from_totals(mine().filter_map(|m| m.total_reserved)) {
        stats.reserved_bytes.all.current = total.current;
        stats.reserved_bytes.all.peak = total.peak;
    }
    stats
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(json: &str) -> Result<Snapshot, ImportError> {
        from_json_bytes(json.as_bytes(), "t.json", &ImportOptions::default())
    }

    const TRACE: &str = r#"{
      "schemaVersion": 1,
      "deviceProperties": [{"id": 0, "name": "Test GPU", "totalGlobalMem": 1000000}],
      "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#7", "ts": 100.0, "dur": 50},
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#7", "ts": 90, "dur": 50},
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#8", "ts": 200, "dur": 50},
        {"ph": "i", "name": "[memory]", "ts": 210, "args": {"Device Type": 1, "Device Id": 0,
          "Addr": 4096, "Bytes": -512, "Total Allocated": 2048, "Total Reserved": 4096}},
        {"ph": "i", "name": "[memory]", "ts": 110, "args": {"Device Type": 1, "Device Id": 0,
          "Addr": 4096, "Bytes": 512, "Total Allocated": 2560, "Total Reserved": 4096}},
        {"ph": "i", "name": "[memory]", "ts": 50, "args": {"Device Type": 1, "Device Id": 0,
          "Addr": 8192, "Bytes": 2097152, "Total Allocated": 2048, "Total Reserved": 4096}},
        {"ph": "i", "name": "[memory]", "ts": 60, "args": {"Device Type": 0, "Device Id": -1,
          "Addr": 1, "Bytes": 64, "Total Allocated": 64, "Total Reserved": 0}},
        {"ph": "i", "name": "[memory]", "ts": 70, "args": "odd"},
        {"ph": "X", "name": "aten::add", "ts": 120, "dur": 3, "args": {"Bytes": "x", "n": [1, {}]}}
      ]
    }"#;

    #[test]
    fn reads_memory_events_and_steps() {
        let s = load(TRACE).unwrap();
        assert_eq!(s.source, SnapshotSource::ChromeTrace);
        assert_eq!(s.device.name, "Test GPU");
        assert_eq!(s.device.capacity, 1_000_000);
        let kinds: Vec<(EventKind, u64, u32)> =
            s.events.iter().map(|e| (e.kind, e.addr, e.step)).collect();
        assert_eq!(
            kinds,
            vec![
                (EventKind::Alloc, 8192, 0),
                (EventKind::Alloc, 4096, 1),
                (EventKind::FreeCompleted, 4096, 2),
            ]
        );
        assert_eq!(s.events[0].time_ns, 0);
        assert_eq!(s.events[1].time_ns, 60_000);
        assert_eq!(s.steps.len(), 2);
        assert_eq!(s.steps[0].label, "ProfilerStep#7");
        assert_eq!((s.steps[0].step, s.steps[0].seq), (1, 1));
        assert_eq!((s.steps[1].step, s.steps[1].seq), (2, 2));
        assert_eq!(s.stats.allocated_bytes.all.peak, 2560);
        assert_eq!(s.stats.allocated_bytes.all.current, 2048);
        assert_eq!(s.stats.reserved_bytes.all.peak, 4096);
        assert_eq!(s.stats.allocation.all.current, 1);
        assert_eq!(s.stats.allocated_bytes.large_pool.current, 2 << 20);
        assert_eq!(s.stats.allocated_bytes.small_pool.peak, 512);
    }

    #[test]
    fn reads_the_array_form() {
        let s = load(
            r#"[{"name": "[memory]", "ph": "i", "ts": 1,
            "args": {"Device Type": 1, "Device Id": 2, "Addr": 5, "Bytes": 7}}]"#,
        )
        .unwrap();
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.device.index, 2);
        assert_eq!(s.device.name, "cuda:2");
    }

    #[test]
    fn malformed_json_is_an_error() {
        let e = load(r#"{"traceEvents": [{"name": "[memory]", "#).unwrap_err();
        assert!(matches!(e.kind, ImportErrorKind::Json(_)), "{e}");
        // Nesting deeper than the limit where the importer reads events is an error naming
        // the limit and where; up to the limit, and under keys it does not read, it is fine.
        let nested = |depth: usize, at: &str| {
            format!(
                "{{\"traceEvents\": [{}{}], {at}}}",
                "[".repeat(depth),
                "]".repeat(depth)
            )
        };
        let e = load(&nested(5000, "\"y\": 1")).unwrap_err();
        assert!(
            matches!(
                e.kind,
                ImportErrorKind::TooDeep {
                    limit: MAX_JSON_DEPTH,
                    line: 1,
                    column: 143
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("nested too deep"), "{e}");
        assert!(e.to_string().contains("more than 127 levels"), "{e}");
        // `{`, the events' `[` and 125 more: 127 levels.
        let fits = nested(MAX_JSON_DEPTH - 2, "\"x\": \"[[[\\\"{{{{\"");
        assert_eq!(load(&fits).unwrap().events.len(), 0);
        assert!(load(&nested(MAX_JSON_DEPTH - 1, "\"y\": 1")).is_err());
        let skipped = nested(
            1,
            &format!("\"x\": {}{}", "[".repeat(5000), "]".repeat(5000)),
        );
        assert_eq!(load(&skipped).unwrap().events.len(), 0);
        // The same in an event's fields: as the value of a field the importer reads, or as
        // the event itself.
        let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
        for text in [
            format!("[{{\"name\": {deep}}}]"),
            format!("[{{\"name\": \"[memory]\", \"args\": {{\"Addr\": {deep}}}}}]"),
            format!("[{deep}]"),
        ] {
            let e = load(&text).unwrap_err();
            assert!(matches!(e.kind, ImportErrorKind::TooDeep { .. }), "{e}");
        }
        let e = load(&nested(5000, "\"y\": 1")[..3000]).unwrap_err();
        assert!(matches!(e.kind, ImportErrorKind::TooDeep { .. }), "{e}");
        let e = load("[[{\"traceEvents\": [").unwrap_err();
        assert!(matches!(e.kind, ImportErrorKind::Json(_)), "{e}");
        let e = load(r#"{"other": 1}"#).unwrap_err();
        assert!(
            matches!(e.kind, ImportErrorKind::UnknownFormat { .. }),
            "{e}"
        );
    }
}
