//! A profiler trace records `Total Allocated` and `Total Reserved` with every memory event.
//! Whatever order the file lists the events in, and whatever was allocated before the
//! recording (memory known only from the totals, or blocks the trace frees), the report's start,
//! end and peak figures are those totals, and the summary table says the same.

use proptest::prelude::*;
use vramscope_analysis::report::{build_report, ReportOptions};
use vramscope_import::{load_bytes, ImportOptions};
use vramscope_model::format_bytes;
use vramscope_render::render_summary;

const MIB: u64 = 1 << 20;

/// One `[memory]` event of the profiler.
fn memory_event(ts: u64, addr: u64, bytes: i64, total: u64, reserved: u64) -> String {
    format!(
        r#"{{"ph": "i", "name": "[memory]", "ts": {ts}, "args": {{"Device Type": 1, "Device Id": 0, "Addr": {addr}, "Bytes": {bytes}, "Total Allocated": {total}, "Total Reserved": {reserved}}}}}"#
    )
}

proptest! {
    #![proptest_config(vramscope_testkit::props::config(128))]

    /// Allocations and frees at random slots, blocks from before the recording freed in it
    /// or never, memory known only from the totals, reserved memory that grows with the
    /// allocations, and the events listed in a random order.
    #[test]
    fn the_figures_of_a_profiler_trace_are_its_totals(
        totals_only in 0u64..64,
        early in proptest::collection::vec(1u64..8, 0..4),
        ops in proptest::collection::vec((any::<bool>(), 0usize..12, 1u64..8), 1..60),
        headroom in 0u64..32,
        order in proptest::collection::vec(any::<u64>(), 64),
    ) {
        // Blocks live when the recording began: `early[i]` MiB at slot 8 + i, freed by ops
        // that name their slot; slots 0..8 are allocated and freed within the trace.
        let mut live: Vec<Option<u64>> = vec![None; 12];
        for (i, &size) in early.iter().enumerate() {
            live[8 + i] = Some(size * MIB);
        }
        let mut total = totals_only * MIB + early.iter().sum::<u64>() * MIB;
        let start = total;
        let mut reserved = total + headroom * MIB;
        let (mut peak, mut peak_reserved) = (start, reserved);
        let mut events = Vec::new();
        for (alloc, slot, size) in ops {
            let addr = 0x7f00_0000_0000 + slot as u64 * 64 * MIB;
            let bytes = match (alloc && slot < 8, live[slot]) {
                (true, None) => {
                    live[slot] = Some(size * MIB);
                    size * MIB
                }
                (false, Some(size)) => {
                    live[slot] = None;
                    total -= size;
                    events.push((addr, -(size as i64), total, reserved));
                    continue;
                }
                _ => continue,
            };
            total += bytes;
            reserved = reserved.max(total + headroom * MIB);
            peak = peak.max(total);
            peak_reserved = peak_reserved.max(reserved);
            events.push((addr, bytes as i64, total, reserved));
        }
        prop_assume!(!events.is_empty());
        // The file lists the events in any order; their times say the order.
        let mut lines: Vec<(u64, String)> = events
            .iter()
            .enumerate()
            .map(|(k, &(addr, bytes, total, reserved))| {
                (order[k % order.len()], memory_event(10 * (k as u64 + 1), addr, bytes, total, reserved))
            })
            .collect();
        lines.sort();
        let json = format!(
            r#"{{"traceEvents": [{}]}}"#,
            lines.into_iter().map(|(_, l)| l).collect::<Vec<_>>().join(",\n")
        );
        let snapshot = load_bytes(json.as_bytes(), "t.json", &ImportOptions::default()).unwrap();
        let mut options = ReportOptions::default();
        options.explorer = false;
        let report = build_report(&snapshot, &options);
        let s = &report.stats;
        let last = events.last().unwrap();
        prop_assert_eq!(s.baseline_allocated_bytes, start);
        prop_assert_eq!(s.allocated_bytes, last.2);
        prop_assert_eq!(s.peak_allocated_bytes, peak);
        prop_assert_eq!(s.reserved_bytes, Some(last.3));
        prop_assert_eq!(s.peak_reserved_bytes, Some(peak_reserved));
        let summary = render_summary(&report);
        let row = summary
            .lines()
            .find(|l| l.starts_with("| Allocated memory"))
            .unwrap();
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        prop_assert_eq!(cells[2], format_bytes(last.2));
        prop_assert_eq!(cells[3], format_bytes(peak));
    }
}
