//! Fidelity against PyTorch itself: replaying the alloc/free sequence of a real PyTorch run
//! through our policy from an empty device must reproduce PyTorch's own `segment_alloc`
//! sequence. The trace lives in `../shared/traces` (or `$VRAMSCOPE_TRACES`); without it the test
//! prints one line saying it was skipped.

use std::collections::HashMap;
use std::path::Path;

use vramscope_caching::{CachingAllocator, SimDevice, StreamId};
use vramscope_model::{AllocatorConfig, EventKind};
use vramscope_testkit::shared_trace;

#[test]
fn decomfl_replay_reproduces_pytorch_segment_allocs() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let Some(path) = shared_trace(&root, "decomfl_opt125m_zo_fedlearn.events.csv") else {
        return;
    };
    let csv = std::fs::read_to_string(path).expect("decomfl events csv is readable");
    let device = SimDevice::phantom(1 << 40);
    let config = AllocatorConfig {
        record_sites: false,
        ..AllocatorConfig::default()
    };
    let alloc = CachingAllocator::new(device, config);
    let mut expected_segments = Vec::new();
    let mut ours_by_theirs: HashMap<u64, u64> = HashMap::new();
    for (line_no, line) in csv.lines().enumerate().skip(1) {
        let fields: Vec<&str> = line.split(',').collect();
        assert_eq!(fields.len(), 6, "line {}: {line}", line_no + 1);
        let addr: u64 = fields[2].parse().unwrap();
        let size: u64 = fields[3].parse().unwrap();
        let stream = StreamId(fields[4].parse().unwrap());
        match fields[1] {
            "segment_alloc" => expected_segments.push(size),
            "alloc" => {
                let ours = alloc.alloc_ptr(size, stream).unwrap();
                assert!(ours_by_theirs.insert(addr, ours).is_none());
            }
            "free_completed" => {
                let ours = ours_by_theirs
                    .remove(&addr)
                    .unwrap_or_else(|| panic!("line {}: free of unknown block", line_no + 1));
                alloc.free_ptr(ours).unwrap();
            }
            _ => {}
        }
    }
    let ours: Vec<u64> = alloc
        .snapshot()
        .events
        .iter()
        .filter(|e| e.kind == EventKind::SegmentAlloc)
        .map(|e| e.size)
        .collect();
    assert_eq!(expected_segments.len(), 61);
    assert_eq!(expected_segments.iter().sum::<u64>() >> 20, 1810);
    assert_eq!(ours.len(), expected_segments.len(), "segment count");
    assert_eq!(ours, expected_segments, "segment sizes in order");
    assert_eq!(ours_by_theirs.len(), 397, "live blocks at the end");
    assert_eq!(alloc.stats().reserved_bytes.all.peak >> 20, 1810);
    alloc.check_invariants().unwrap();
}
