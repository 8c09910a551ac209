//! Exporters: the one model out to the formats other tools read.
//!
//! [`to_pytorch_pickle`] writes a `torch.cuda.memory._dump_snapshot()`-shaped pickle (keys and
//! value types as PyTorch writes them), so PyTorch's memory_viz page and
//! `python -m torch.cuda._memory_viz` open vramscope snapshots; steps become
//! `ProfilerStep#N` annotations. [`to_perfetto`] writes Chrome trace JSON that
//! ui.perfetto.dev opens: counter tracks for allocated and reserved bytes, one slice per
//! allocation on its stream's track, step slices, call sites in the args. Our own JSON is
//! `Snapshot::save`. The CLI's `vramscope convert` is glue over these functions.

use rustc_hash::FxHashMap;
use serde_json::{json, Value};
use vramscope_allocator::{
    AllocatorConfig, BlockState, CallSite, EventKind, Pool, SiteId, Snapshot,
};

use crate::pickle_writer::{MemoRef, PickleWriter};

/// PyTorch's action name for an event kind, or `None` for kinds PyTorch does not record.
fn action(kind: EventKind) -> Option<&'static str> {
    Some(match kind {
        EventKind::Alloc => "alloc",
        EventKind::FreeRequested => "free_requested",
        EventKind::FreeCompleted => "free_completed",
        EventKind::SegmentAlloc => "segment_alloc",
        EventKind::SegmentFree => "segment_free",
        EventKind::SegmentMap => "segment_map",
        EventKind::SegmentUnmap => "segment_unmap",
        EventKind::Oom => "oom",
        EventKind::Snapshot => "snapshot",
        _ => return None,
    })
}

/// Writes stacks once and shares them through the memo afterwards.
struct Frames<'a> {
    sites: &'a [CallSite],
    written: FxHashMap<SiteId, MemoRef>,
    strings: FxHashMap<String, MemoRef>,
    empty: Option<MemoRef>,
}

impl Frames<'_> {
    fn write(&mut self, w: &mut PickleWriter, site: Option<SiteId>) {
        let Some(call_site) = site.and_then(|id| self.sites.get(id as usize)) else {
            match self.empty {
                Some(slot) => w.get(slot),
                None => {
                    w.begin_list();
                    w.end_list();
                    self.empty = Some(w.memoize());
                }
            }
            return;
        };
        let id = site.unwrap_or_default();
        if let Some(&slot) = self.written.get(&id) {
            w.get(slot);
            return;
        }
        w.begin_list();
        if call_site.frames.is_empty() {
            self.frame(w, &call_site.file, call_site.line, &call_site.function);
        } else {
            for frame in &call_site.frames {
                self.frame(w, &frame.file, frame.line, &frame.function);
            }
        }
        w.end_list();
        let slot = w.memoize();
        self.written.insert(id, slot);
    }

    fn frame(&mut self, w: &mut PickleWriter, file: &str, line: u32, name: &str) {
        w.begin_dict();
        w.shared_str("filename", &mut self.strings);
        w.shared_str(file, &mut self.strings);
        w.shared_str("line", &mut self.strings);
        w.uint(line as u64);
        w.shared_str("name", &mut self.strings);
        w.shared_str(name, &mut self.strings);
        w.end_dict();
    }
}

fn write_settings(w: &mut PickleWriter, config: &AllocatorConfig) {
    w.begin_dict();
    w.str("PYTORCH_CUDA_ALLOC_CONF");
    w.str(&config.to_string());
    w.str("max_split_size");
    match config.max_split_size {
        Some(bytes) => w.uint(bytes),
        None => w.int(-1),
    }
    w.str("garbage_collection_threshold");
    w.float(config.garbage_collection_threshold.unwrap_or(0.0));
    w.str("expandable_segments");
    w.bool(config.expandable_segments);
    w.str("roundup_power2_divisions");
    w.uint(config.roundup_power2_divisions as u64);
    w.end_dict();
}

/// The snapshot as a PyTorch snapshot pickle (protocol 4): `segments`, `device_traces` (one
/// list per device), `allocator_settings` and `external_annotations`.
pub fn to_pytorch_pickle(snapshot: &Snapshot) -> Vec<u8> {
    let mut w = PickleWriter::new();
    let mut frames = Frames {
        sites: &snapshot.sites,
        written: FxHashMap::default(),
        strings: FxHashMap::default(),
        empty: None,
    };
    let to_us = |ns: u64| ns / 1000;
    w.begin_dict();

    w.str("segments");
    w.begin_list();
    for segment in &snapshot.segments {
        let sum = |pred: &dyn Fn(BlockState) -> bool, requested: bool| -> u64 {
            segment
                .blocks
                .iter()
                .filter(|b| pred(b.state))
                .map(|b| if requested { b.requested_size } else { b.size })
                .sum()
        };
        w.begin_dict();
        w.str("device");
        w.uint(segment.device as u64);
        w.str("address");
        w.uint(segment.address);
        w.str("total_size");
        w.uint(segment.total_size);
        w.str("allocated_size");
        w.uint(sum(&|s| s == BlockState::ActiveAllocated, false));
        w.str("active_size");
        w.uint(sum(&|s| s != BlockState::Inactive, false));
        w.str("requested_size");
        w.uint(sum(&|s| s != BlockState::Inactive, true));
        w.str("stream");
        w.uint(segment.stream);
        w.str("segment_type");
        w.str(match segment.pool {
            Pool::Small => "small",
            Pool::Large => "large",
        });
        w.str("segment_pool_id");
        w.begin_tuple();
        w.int(0);
        w.int(0);
        w.end_tuple();
        w.str("is_expandable");
        w.bool(segment.expandable);
        w.str("frames");
        frames.write(&mut w, None);
        w.str("blocks");
        w.begin_list();
        for block in &segment.blocks {
            w.begin_dict();
            w.str("address");
            w.uint(block.address);
            w.str("size");
            w.uint(block.size);
            w.str("requested_size");
            w.uint(block.requested_size);
            w.str("state");
            w.str(block.state.as_str());
            w.str("frames");
            frames.write(&mut w, block.site);
            w.end_dict();
        }
        w.end_list();
        w.end_dict();
    }
    w.end_list();

    w.str("device_traces");
    let devices = snapshot
        .events
        .iter()
        .map(|e| e.device)
        .chain(snapshot.segments.iter().map(|s| s.device))
        .chain(std::iter::once(snapshot.device.index))
        .max()
        .unwrap_or(0);
    w.begin_list();
    for device in 0..=devices {
        w.begin_list();
        for event in snapshot.events.iter().filter(|e| e.device == device) {
            let Some(name) = action(event.kind) else {
                continue;
            };
            w.begin_dict();
            w.str("action");
            w.str(name);
            w.str("addr");
            w.uint(event.addr);
            if event.kind == EventKind::Oom {
                w.str("device_free");
                w.uint(event.addr);
            }
            w.str("size");
            w.uint(event.size);
            w.str("stream");
            w.uint(event.stream);
            w.str("time_us");
            w.uint(to_us(event.time_ns));
            w.str("frames");
            frames.write(&mut w, event.site);
            w.end_dict();
        }
        w.end_list();
    }
    w.end_list();

    w.str("allocator_settings");
    write_settings(&mut w, &snapshot.config);

    w.str("external_annotations");
    w.begin_list();
    for annotation in &snapshot.annotations {
        w.begin_dict();
        w.str("device");
        w.uint(annotation.device as u64);
        w.str("name");
        w.str(&annotation.name);
        w.str("stage");
        w.str(&annotation.stage);
        w.str("time_us");
        w.uint(to_us(annotation.time_ns));
        w.end_dict();
    }
    if snapshot.annotations.is_empty() {
        for mark in &snapshot.steps {
            w.begin_dict();
            w.str("device");
            w.uint(snapshot.device.index as u64);
            w.str("name");
            w.str(&format!("ProfilerStep#{}", mark.step));
            w.str("stage");
            w.str("START");
            w.str("time_us");
            w.uint(to_us(mark.time_ns));
            w.end_dict();
        }
    }
    w.end_list();

    w.end_dict();
    w.finish()
}

/// The snapshot as Chrome trace JSON for ui.perfetto.dev.
pub fn to_perfetto(snapshot: &Snapshot) -> String {
    let timed = snapshot.events.iter().any(|e| e.time_ns > 0);
    // Without timestamps (older PyTorch files), event order stands in for time: 1 µs each.
    let ts = |seq: u64, time_ns: u64| -> f64 {
        if timed {
            time_ns as f64 / 1000.0
        } else {
            seq as f64
        }
    };
    let pid = snapshot.device.index as u64;
    let mut out: Vec<Value> = vec![json!({
        "ph": "M", "name": "process_name", "pid": pid,
        "args": {"name": format!("{} ({})", snapshot.device.name, snapshot.source)}
    })];
    let site_label = |site: Option<SiteId>| {
        snapshot
            .site(site)
            .map(|s| {
                if s.function.is_empty() {
                    s.file_line()
                } else {
                    format!("{} ({})", s.file_line(), s.function)
                }
            })
            .unwrap_or_else(|| "(unknown site)".to_string())
    };
    let mut streams: Vec<u64> = Vec::new();
    let mut open: FxHashMap<u64, (f64, u64, u64, Option<SiteId>, u64)> = FxHashMap::default();
    let (mut allocated, mut reserved) = (0i128, 0i128);
    let mut last_ts = 0.0;
    for event in &snapshot.events {
        let t = ts(event.seq, event.time_ns);
        last_ts = t;
        if !streams.contains(&event.stream) {
            streams.push(event.stream);
        }
        let counters_changed = match event.kind {
            EventKind::Alloc => {
                open.insert(
                    event.addr,
                    (t, event.size, event.stream, event.site, event.step),
                );
                allocated += event.size as i128;
                true
            }
            EventKind::FreeCompleted => {
                if let Some((start, size, stream, site, step)) = open.remove(&event.addr) {
                    out.push(json!({
                        "ph": "X", "pid": pid, "tid": stream, "ts": start,
                        "dur": (t - start).max(0.001),
                        "name": vramscope_allocator::format_bytes(size),
                        "args": {"site": site_label(site), "size": size, "addr": format!("{:#x}", event.addr), "step": step}
                    }));
                }
                allocated -= event.size as i128;
                true
            }
            EventKind::SegmentAlloc | EventKind::SegmentMap => {
                reserved += event.size as i128;
                true
            }
            EventKind::SegmentFree | EventKind::SegmentUnmap => {
                reserved -= event.size as i128;
                true
            }
            EventKind::Oom => {
                out.push(json!({
                    "ph": "i", "s": "p", "pid": pid, "tid": event.stream, "ts": t, "name": "OOM",
                    "args": {"requested": event.size, "device_free": event.addr, "site": site_label(event.site)}
                }));
                false
            }
            _ => false,
        };
        if counters_changed {
            out.push(json!({
                "ph": "C", "pid": pid, "ts": t, "name": "memory",
                "args": {"allocated": allocated.max(0) as u64, "reserved": reserved.max(0) as u64}
            }));
        }
    }
    // Blocks still live at the end stay open until the last event.
    let mut still_open: Vec<_> = open.into_iter().collect();
    still_open.sort_by_key(|(addr, _)| *addr);
    for (addr, (start, size, stream, site, step)) in still_open {
        out.push(json!({
            "ph": "X", "pid": pid, "tid": stream, "ts": start,
            "dur": (last_ts - start).max(0.001),
            "name": vramscope_allocator::format_bytes(size),
            "args": {"site": site_label(site), "size": size, "addr": format!("{addr:#x}"), "step": step, "live_at_end": true}
        }));
    }
    for stream in &streams {
        out.push(json!({
            "ph": "M", "name": "thread_name", "pid": pid, "tid": stream,
            "args": {"name": format!("stream {stream:#x}")}
        }));
    }
    let steps_tid = u64::MAX >> 12;
    out.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": steps_tid, "args": {"name": "steps"}}));
    let mark_time = |seq: u64, time_ns: u64| ts(seq, time_ns);
    for (i, mark) in snapshot.steps.iter().enumerate() {
        let start = mark_time(mark.seq, mark.time_ns);
        let end = snapshot
            .steps
            .get(i + 1)
            .map(|next| mark_time(next.seq, next.time_ns))
            .unwrap_or(last_ts);
        out.push(json!({
            "ph": "X", "pid": pid, "tid": steps_tid, "ts": start, "dur": (end - start).max(0.001),
            "name": format!("step {}", mark.step), "args": {"label": mark.label}
        }));
    }
    serde_json::to_string(&json!({"traceEvents": out, "displayTimeUnit": "ms"}))
        .unwrap_or_else(|_| "{\"traceEvents\": []}".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_allocator::{CachingAllocator, SimDevice};

    fn sample() -> Snapshot {
        let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
        let _keep = alloc.alloc(3 << 20).unwrap();
        for _ in 0..3 {
            alloc.mark_step();
            drop(alloc.alloc(4096).unwrap());
        }
        alloc.snapshot()
    }

    #[test]
    fn pytorch_pickle_round_trips_through_the_importer() {
        let snapshot = sample();
        let bytes = to_pytorch_pickle(&snapshot);
        let back = crate::import::load_bytes(&bytes, "export", &Default::default()).unwrap();
        assert_eq!(back.segments.len(), snapshot.segments.len());
        for (a, b) in back.segments.iter().zip(&snapshot.segments) {
            assert_eq!(
                (a.address, a.total_size, a.pool),
                (b.address, b.total_size, b.pool)
            );
            assert_eq!(a.blocks.len(), b.blocks.len());
        }
        let kinds = |s: &Snapshot| {
            s.events
                .iter()
                .filter(|e| action(e.kind).is_some() && e.kind != EventKind::Snapshot)
                .map(|e| (e.kind, e.addr, e.size))
                .collect::<Vec<_>>()
        };
        assert_eq!(kinds(&back), kinds(&snapshot));
        assert_eq!(
            back.steps.len(),
            3,
            "steps come back from the ProfilerStep annotations"
        );
        let site = back.site(
            back.events
                .iter()
                .find(|e| e.kind == EventKind::Alloc)
                .unwrap()
                .site,
        );
        assert!(site.unwrap().file.ends_with("export.rs"));
    }

    #[test]
    fn perfetto_output_has_counters_slices_and_steps() {
        let text = to_perfetto(&sample());
        let value: Value = serde_json::from_str(&text).unwrap();
        let events = value["traceEvents"].as_array().unwrap();
        let count = |ph: &str| events.iter().filter(|e| e["ph"] == ph).count();
        assert!(count("C") >= 6);
        assert!(events
            .iter()
            .any(|e| e["ph"] == "X" && e["name"] == "step 2"));
        assert!(events.iter().any(|e| e["ph"] == "X"
            && e["args"]["site"]
                .as_str()
                .is_some_and(|s| s.contains("export.rs"))));
        assert!(count("M") >= 2);
    }
}
