//! The replay and the sweep as text for a reader: what fits, what does not and why, the
//! device calls compared, and memory from before the trace said in sentences.

use super::*;

/// The device-call comparison as text lines.
pub(crate) fn render_device_calls(check: &DeviceCallCheck, capped: bool) -> String {
    let call = |call: &Option<DeviceCall>| match call {
        Some(call) => format!(
            "{} of {}",
            call.action,
            vramscope_model::format_bytes(call.size)
        ),
        None => "nothing more".to_string(),
    };
    if check.trace_calls == 0 {
        return format!(
            "  device calls: the trace records none to compare with (the replay made {})\n",
            check.replay_calls
        );
    }
    match &check.first_difference {
        None => format!(
            "  device calls: {0} of {0} alike, in order (segment allocations, frees, maps, unmaps)\n",
            check.trace_calls
        ),
        Some(difference) => format!(
            "  device calls: the first {} of the trace's {} made alike; at call {}{} the trace made {}, the replay {} ({} calls in all)\n",
            check.matching,
            check.trace_calls,
            difference.index + 1,
            difference
                .trace_seq
                .map(|seq| format!(" (trace event {seq})"))
                .unwrap_or_default(),
            call(&difference.trace),
            call(&difference.replay),
            check.replay_calls
        ) + if capped {
            ""
        } else {
            "  (replayed without --capacity: a run that was short of memory parts where it freed its cache or ran out)\n"
        },
    }
}

/// `1 time`, `3 times`.
pub(crate) fn plural_times(count: u64) -> String {
    vramscope_model::plural(count, "time")
}

/// A figure of the table, `-` where the source has none.
pub(crate) fn cell(value: Option<u64>, bytes: bool) -> String {
    match value {
        None => "-".to_string(),
        Some(v) if bytes => vramscope_model::format_bytes(v),
        Some(v) => v.to_string(),
    }
}

/// How the text names the settings of `result`: `(defaults)`, the settings, or
/// `(from the trace: ...)` with the policy that replaced the trace's.
pub(crate) fn settings_text(result: &ReplayResult) -> String {
    match &result.trace_settings {
        Some(recorded) if !recorded.is_empty() => {
            let policy = |text: &str| AllocatorConfig::parse(text).map(|c| c.policy).ok();
            match policy(&result.config) {
                Some(ours) if policy(recorded) != Some(ours) => {
                    format!("(from the trace: {recorded}) with policy:{}", ours.name())
                }
                _ => format!("(from the trace: {recorded})"),
            }
        }
        _ if result.config.is_empty() => "(defaults)".to_string(),
        _ => result.config.clone(),
    }
}

/// The sentences on memory from before the trace that it records only as totals.
pub(crate) fn held_text(held: &HeldBeforeTrace) -> String {
    let bytes = vramscope_model::format_bytes;
    let mut out = String::new();
    if held.allocated > 0 {
        out.push_str(&format!(
            "  {} held before the trace (recorded as a total, no blocks named), restored as one live block filling a segment of its size\n",
            bytes(held.allocated)
        ));
    }
    if held.cached > 0 && held.cached_restored {
        out.push_str(&format!(
            "  {} more reserved before the trace (cached, free), restored as one free segment\n",
            bytes(held.cached)
        ));
    } else if held.cached > 0 {
        out.push_str(&format!(
            "  {} more reserved before the trace (cached, free) left out: against a capacity the allocator sizes its cache itself\n",
            bytes(held.cached)
        ));
    }
    out
}

/// The line that says the start state alone exceeds `capacity`.
pub(crate) fn start_over_text(over: &StartOverCapacity, capacity: u64) -> String {
    let bytes = vramscope_model::format_bytes;
    format!(
        "  does not fit: the start state alone exceeds the {} capacity: {} allocated before the trace, in {} of segments that hold it\n",
        bytes(capacity),
        bytes(over.allocated),
        bytes(over.reserved)
    )
}

/// The replay as a text table: the replay's figures beside the trace's own. When the start
/// state alone exceeds the capacity, that comes first with what fits, and the figures are the
/// replay's without a limit.
pub fn render_text(source: &str, result: &ReplayResult) -> String {
    let source = vramscope_model::terminal::sanitize(source);
    let mut out = format!(
        "replay of {source}\n  settings {} on {} capacity\n",
        settings_text(result),
        vramscope_model::format_bytes(result.capacity)
    );
    if let Some(inferred) = &result.inferred_capacity {
        out.push_str(&format!("  {}\n", inferred.describe()));
    }
    if result.restored_segments > 0 {
        out.push_str(&format!(
            "  started from the state at the beginning of the trace: {} segments, {} live blocks\n",
            result.restored_segments, result.restored_blocks
        ));
    }
    if let Some(held) = &result.held_before_trace {
        out.push_str(&held_text(held));
    }
    if let Some(over) = &result.start_over_capacity {
        out.push_str(&format!(
            "\n{}  what fits: {}, what this replay reserves at its peak with no limit ({} allocated at its peak)\n",
            start_over_text(over, result.capacity),
            vramscope_model::format_bytes(over.needed),
            cell(result.figures.peak_allocated, true)
        ));
    }
    out.push_str(&format!(
        "\n  {:<20} {:>12} {:>12}\n",
        "",
        if result.start_over_capacity.is_some() {
            "no limit"
        } else {
            "replay"
        },
        "trace"
    ));
    let (r, o) = (&result.figures, &result.original);
    let estimate = |cell: String| {
        if o.peak_allocated_estimated && cell != "-" {
            format!("~{cell}")
        } else {
            cell
        }
    };
    let rows = [
        ("allocations", Some(r.allocs), Some(o.allocs), false),
        ("frees", Some(r.frees), Some(o.frees), false),
        ("peak allocated", r.peak_allocated, o.peak_allocated, true),
        ("peak reserved", r.peak_reserved, o.peak_reserved, true),
        ("segment allocs", r.segment_allocs, o.segment_allocs, false),
        ("segment frees", r.segment_frees, o.segment_frees, false),
        (
            "alloc retries",
            r.num_alloc_retries,
            o.num_alloc_retries,
            false,
        ),
        ("OOMs", r.num_ooms, o.num_ooms, false),
    ];
    for (name, ours, theirs, bytes) in rows {
        let theirs = match name {
            "peak allocated" => estimate(cell(theirs, bytes)),
            _ => cell(theirs, bytes),
        };
        out.push_str(&format!(
            "  {:<20} {:>12} {:>12}\n",
            name,
            cell(ours, bytes),
            theirs
        ));
    }
    if o.peak_allocated_estimated {
        out.push_str(
            "  ~ estimated: the trace records requests, and a replay with its own settings did not make its device calls, so its blocks are the requests rounded as PyTorch rounds them\n",
        );
    }
    out.push_str(&format!(
        "\n  fragmentation: {} reserved beyond allocated at the peaks; {} free inside partly used segments at the end\n",
        vramscope_model::format_bytes(result.fragmentation),
        vramscope_model::format_bytes(result.inactive_split_bytes)
    ));
    match &result.first_oom {
        // Without the limit the figures are what the trace needs; an OOM or its absence
        // there says nothing of the capacity.
        _ if result.start_over_capacity.is_some() => {}
        Some(oom) => out.push_str(&format!(
            "  first OOM: event {} in step {}{}, a request of {} with {} allocated and {} reserved\n",
            oom.seq,
            oom.step,
            oom.site
                .as_ref()
                .map(|s| format!(" at {}", vramscope_model::terminal::sanitize(s)))
                .unwrap_or_default(),
            vramscope_model::format_bytes(oom.requested),
            vramscope_model::format_bytes(oom.allocated),
            vramscope_model::format_bytes(oom.reserved)
        )),
        None => out.push_str("  no OOM at this capacity\n"),
    }
    if result
        .first_oom
        .as_ref()
        .is_some_and(|oom| oom.address_space)
    {
        out.push_str(
            "  the simulated device ran out of address space, not memory: with expandable segments every stream and pool that allocates reserves addresses for 9/8 of the device's memory; --conf expandable_segments:False replays the trace's memory alone\n",
        );
    }
    match result.unmatched_frees {
        0 => {}
        1 => out.push_str("  1 free of a block allocated before the trace was skipped\n"),
        n => out.push_str(&format!(
            "  {n} frees of blocks allocated before the trace were skipped\n"
        )),
    }
    match result.failed_frees {
        0 => {}
        1 => out.push_str("  1 free of an allocation that failed in the replay was skipped\n"),
        n => out.push_str(&format!(
            "  {n} frees of allocations that failed in the replay were skipped\n"
        )),
    }
    if result.empty_cache_calls > 0 {
        out.push_str(&format!(
            "  empty_cache() performed where the trace called it: {}\n",
            plural_times(result.empty_cache_calls)
        ));
    }
    if let Some(check) = &result.device_calls {
        out.push_str(&render_device_calls(
            check,
            result.capacity != UNLIMITED_CAPACITY,
        ));
    }
    if result.trace_ooms_served > 0 {
        out.push_str(&format!(
            "  requests that ran out of memory in the trace but were served here (and freed at once): {}\n",
            result.trace_ooms_served
        ));
    }
    out
}

/// How the sweep's text names a row's settings: `the defaults`, or the trace's settings.
pub(crate) fn baseline_name(row: &SweepRow) -> String {
    match row.origin {
        Some(SettingsOrigin::Recorded) => format!("the trace's settings ({})", row.config),
        _ if row.config == "(defaults)" => "the defaults".to_string(),
        _ => row.config.clone(),
    }
}

/// `saving` as a share of `of`, in whole percent.
pub(crate) fn percent(saving: u64, of: u64) -> u64 {
    (u128::from(saving) * 100 / u128::from(of.max(1))) as u64
}

/// A sweep as a text table, best setting first, and what it advises ([`recommend`]): a change
/// only where it changes the outcome, else that the baseline fits. When the start state alone
/// exceeds the capacity, that comes first, and the table says what each setting needs.
pub fn render_sweep_text(source: &str, capacity: u64, rows: &[SweepRow]) -> String {
    let source = vramscope_model::terminal::sanitize(source);
    let bytes = vramscope_model::format_bytes;
    let mut out = format!(
        "settings sweep of {source} on {} capacity\n\n",
        bytes(capacity)
    );
    let over = rows.iter().find_map(|r| r.result.start_over_capacity);
    let settings = |row: &SweepRow| match row.origin {
        Some(SettingsOrigin::Recorded) => format!("{} (the trace's)", row.config),
        Some(SettingsOrigin::Given) => format!("{} (given)", row.config),
        None => row.config.clone(),
    };
    match over {
        Some(over) => {
            out.push_str(&start_over_text(&over, capacity).replacen(
                "does not fit",
                "no setting fits",
                1,
            ));
            out.push_str(&format!(
                "\n  {:<52} {:>12} {:>12}\n",
                "settings", "needs", "peak alloc"
            ));
            for row in rows {
                out.push_str(&format!(
                    "  {:<52} {:>12} {:>12}\n",
                    settings(row),
                    cell(row.result.figures.peak_reserved, true),
                    cell(row.result.figures.peak_allocated, true)
                ));
            }
            out.push_str("  (needs: the peak reserved of each setting's replay with no limit)\n");
        }
        None => {
            out.push_str(&format!(
                "  {:<52} {:>5} {:>12} {:>12} {:>5}\n",
                "settings", "fits", "peak resv", "peak alloc", "OOMs"
            ));
            for row in rows {
                out.push_str(&format!(
                    "  {:<52} {:>5} {:>12} {:>12} {:>5}\n",
                    settings(row),
                    if row.fits { "yes" } else { "no" },
                    cell(row.result.figures.peak_reserved, true),
                    cell(row.result.figures.peak_allocated, true),
                    cell(row.result.figures.num_ooms, false)
                ));
            }
        }
    }
    let reserved = |row: &SweepRow| cell(row.result.figures.peak_reserved, true);
    let baseline = rows.iter().find(|r| r.baseline);
    let recommended = rows.iter().find(|r| r.recommended);
    let use_it = |row: &SweepRow| {
        let conf = if row.config == "(defaults)" {
            ""
        } else {
            row.config.as_str()
        };
        format!("; to use it with PyTorch:\n    PYTORCH_CUDA_ALLOC_CONF={conf}\n")
    };
    let saving = |base: &SweepRow, row: &SweepRow| {
        let (b, r) = (
            base.result.figures.peak_reserved.unwrap_or(0),
            row.result.figures.peak_reserved.unwrap_or(0),
        );
        format!(
            "{} less ({}%)",
            bytes(b.saturating_sub(r)),
            percent(b.saturating_sub(r), b)
        )
    };
    let threshold = format!(
        "at least {MATERIAL_SAVING_PERCENT}% and {}",
        bytes(MATERIAL_SAVING_BYTES)
    );
    match (baseline, recommended) {
        (Some(base), Some(row)) if over.is_some() => out.push_str(&format!(
            "\n  what fits: {} with {}; {} needs {}, {}{}",
            reserved(base),
            baseline_name(base),
            row.config,
            reserved(row),
            saving(base, row),
            use_it(row)
        )),
        (Some(base), None) if over.is_some() => out.push_str(&format!(
            "\n  what fits: {} with {}; no setting tried needs materially less ({threshold})\n",
            reserved(base),
            baseline_name(base)
        )),
        (Some(base), Some(row)) if base.fits => out.push_str(&format!(
            "\n  {} fit at a peak of {} reserved; {} reserves {}{}",
            baseline_name(base),
            reserved(base),
            row.config,
            saving(base, row),
            use_it(row)
        )),
        (Some(base), None) if base.fits => out.push_str(&format!(
            "\n  {} fit at a peak of {} reserved: no setting tried reserves materially less ({threshold}), so none is worth changing to\n",
            baseline_name(base),
            reserved(base)
        )),
        (base, Some(row)) => out.push_str(&format!(
            "\n  {}fits with {} at a peak of {} reserved{}",
            base.map(|b| format!("{} do not fit; ", baseline_name(b)))
                .unwrap_or_default(),
            row.config,
            reserved(row),
            use_it(row)
        )),
        (_, None) => out.push_str("\n  no PyTorch setting tried fits this capacity\n"),
    }
    for row in rows.iter().filter(|r| vramscope_only(r)) {
        let outcome = match (over, row.fits) {
            (Some(_), _) => format!("needs {}", reserved(row)),
            (None, true) => format!("fits at a peak of {} reserved", reserved(row)),
            (None, false) => format!("does not fit at a peak of {} reserved", reserved(row)),
        };
        out.push_str(&format!(
            "  vramscope's own {} (not a PyTorch setting): {outcome}\n",
            row.config
        ));
    }
    out
}
