//! The end of a PyTorch snapshot's import: what follows the traces (annotations, steps,
//! segments, settings) is converted, the snapshot is made with the events and call sites the
//! traces' conversion began, and its blocks are sized and its statistics counted.

use super::*;

/// Converts what follows the traces (annotations, steps, segments, settings) and makes the
/// snapshot, with the events of `traces` and the call sites and figures their conversion
/// began.
pub(super) fn finish(
    parts: Parts<'_>,
    traces: TraceEvents,
    mut stacks: Stacks,
    mut figures: Figures,
    options: &ImportOptions,
) -> Result<Snapshot, Fault> {
    let Parts {
        segments: segment_values,
        traces: _,
        settings,
        annotations: annotation_values,
    } = parts;
    let TraceEvents {
        mut events,
        earliest_us,
        devices_with_events,
        first_device,
        one_device,
    } = traces;
    let annotations_raw = read_annotations(annotation_values, stacks.max_bytes)?;

    // Times relative to the earliest one in the file.
    let epoch_us = earliest_us
        .into_iter()
        .chain(annotations_raw.iter().filter_map(|a| a.time_us))
        .min();
    let relative = |t: Option<u64>| match (t, epoch_us) {
        (Some(t), Some(epoch)) => t.saturating_sub(epoch).saturating_mul(1000),
        _ => 0,
    };
    // Numbered in the same pass unless the devices' events are merged by time first.
    let merged = devices_with_events > 1;
    // The collector's pairs and indices follow the order the events were read in, which a
    // merge changes.
    let read_on_one_device = one_device.filter(|_| !merged);
    for (seq, e) in events.iter_mut().enumerate() {
        e.time_ns = relative((e.seq == 1).then_some(e.time_ns));
        e.seq = seq as u64;
    }
    if merged {
        events.sort_by_key(|e| e.time_ns);
        for (seq, e) in events.iter_mut().enumerate() {
            e.seq = seq as u64;
        }
    }
    let annotations: Vec<Annotation> = annotations_raw
        .into_iter()
        .map(|a| Annotation {
            time_ns: relative(a.time_us),
            name: a.name,
            stage: a.stage,
            device: a.device,
        })
        .collect();

    // Steps.
    let steps: Vec<StepMark> = match &options.step_marker {
        Some(marker) => {
            let starts = marker_steps(&events, &stacks, marker);
            timeline::assign_steps_at(&mut events, starts)
        }
        None if epoch_us.is_some() => {
            let starts = annotation_steps(&annotations, options.step_annotation.as_deref());
            timeline::assign_steps_by_time(&mut events, starts)
        }
        None => Vec::new(),
    };

    // Segments, with the site and step of each live block's allocation.
    let alloc_of = |e: &Event| (e.site(), u64::from(e.step));
    let last_alloc: LastAlloc = match &read_on_one_device {
        Some(one) => one
            .last_alloc
            .iter()
            .map(|(&addr, &i)| {
                let e = &events[i as usize];
                ((u32::from(e.device), addr), alloc_of(e))
            })
            .collect(),
        None => {
            let mut last_alloc = LastAlloc::default();
            for e in events.iter().filter(|e| e.kind == EventKind::Alloc) {
                last_alloc.insert((u32::from(e.device), e.addr), alloc_of(e));
            }
            last_alloc
        }
    };
    let segments = read_segments(segment_values, &mut stacks, &last_alloc, &mut figures)?;

    let first_segment_device = segments.iter().map(|s| s.device).min();
    let index = match (first_device, first_segment_device) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b).unwrap_or(0),
    };
    let config = read_config(
        settings
            .filter(|s| s.is_dict())
            .map(ValueRef::to_value)
            .as_ref(),
    );
    let mut snapshot = Snapshot {
        format_version: FORMAT_VERSION,
        source: SnapshotSource::Pytorch,
        device: DeviceInfo {
            index,
            name: format!("cuda:{index}"),
            backend: "cuda".to_string(),
            capacity: 0,
        },
        config,
        stats: MemoryStats::default(),
        epoch_unix_ns: timeline::unix_epoch_ns(epoch_us.unwrap_or(0) as f64),
        segments,
        events: events.into(),
        dropped_events: 0,
        tags: std::mem::take(&mut stacks.tags),
        sites: stacks.table.into_sites(),
        scopes: Vec::new(),
        steps,
        annotations,
        violations: Vec::new(),
    };
    let paired = read_on_one_device.map(|one| one.paired);
    size_and_count(
        &mut snapshot,
        devices_with_events,
        first_device,
        paired,
        options,
    );
    Ok(snapshot)
}

/// The file's annotations (`external_annotations`), each read at its place.
fn read_annotations(
    values: Option<Seq<'_>>,
    max_bytes: usize,
) -> Result<Vec<RawAnnotation>, Fault> {
    let mut annotations = Vec::with_capacity(values.map_or(0, Seq::len));
    let mut text = 0;
    for (i, a) in elements(values).enumerate() {
        annotations.push(read_annotation(
            a,
            Loc::Annotation(i),
            &mut text,
            max_bytes,
        )?);
    }
    Ok(annotations)
}

/// The file's segments in address order by device, each with the site and step of its live
/// blocks' allocations (`last_alloc`); refused when two overlap.
fn read_segments(
    values: Option<Seq<'_>>,
    stacks: &mut Stacks,
    last_alloc: &LastAlloc,
    figures: &mut Figures,
) -> Result<Vec<Segment>, Fault> {
    let mut placed = Vec::with_capacity(values.map_or(0, Seq::len));
    for (i, s) in elements(values).enumerate() {
        placed.push((read_segment(s, i, stacks, last_alloc, figures)?, i));
    }
    placed.sort_by_key(|(s, _)| (s.device, s.address));
    let (segments, places): (Vec<Segment>, Vec<usize>) = placed.into_iter().unzip();
    check_segments_apart(&segments, &places)?;
    Ok(segments)
}

/// Sizes the snapshot's blocks (PyTorch records requested sizes; every figure counts block
/// sizes, as its statistics do) and counts its statistics.
fn size_and_count(
    snapshot: &mut Snapshot,
    devices_with_events: usize,
    first_device: Option<u32>,
    paired: Option<vramscope_engine::PairedEvents>,
    options: &ImportOptions,
) {
    let index = snapshot.device.index;
    // PyTorch records requested sizes; every figure counts block sizes, as its statistics do.
    // The sizing's last pass pairs every event once it has its block size: when all events are
    // on the snapshot's device, the statistics are counted in that pass, not in a pass of
    // their own. Several devices' events are counted for the snapshot's device alone, in a
    // pass of their own.
    let all_on_snapshot_device =
        devices_with_events == 0 || (devices_with_events == 1 && first_device == Some(index));
    let mut pass = all_on_snapshot_device
        .then(|| StatsPass::new(SegmentPools::from_segments(&snapshot.segments)));
    let mut visit = |e: &Event, pair: vramscope_engine::Pair, replaced: Option<&Event>| {
        if let Some(pass) = &mut pass {
            pass.push(e, pair, replaced);
        }
    };
    if let Some(progress) = &options.progress {
        // The replay says how many events it goes through once it starts.
        progress.begin(Stage::SizingBlocks, 0);
    }
    let mut report = |done: usize, total: usize| {
        if let Some(progress) = &options.progress {
            progress.set(done as u64, total as u64);
        }
    };
    if devices_with_events > 1 {
        size_blocks_per_device(snapshot, &mut report);
    } else {
        vramscope_replay::size_blocks_visiting(snapshot, paired, &mut report, &mut visit);
    }
    snapshot.stats = match pass {
        Some(pass) => pass.finish(&snapshot.segments, index, &snapshot.config),
        None => compute_stats(
            &snapshot.segments,
            &snapshot.events,
            index,
            &snapshot.config,
        ),
    };
}
