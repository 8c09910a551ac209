//! The statistics of a trace through a PyTorch pickle: the importer counts them in the block
//! sizing's last pass, and they must be those of the engine's own pass
//! (`vramscope_engine::stats::compute_stats`) and of every view, on traces that lost frees,
//! waited on other streams, emptied the cache and ran out of memory.

use vramscope_model::{AllocatorConfig, Snapshot, SnapshotSource};

/// A trace that lost frees allocates where a block, or a segment, still is: through a pickle,
/// the importer's statistics are the engine's, and the view's peak agrees.
#[test]
fn a_block_or_segment_allocated_over_a_live_one_replaces_it_through_a_pickle() {
    let mib = 1u64 << 20;
    let (segments, events) = vramscope_testkit::lost_frees();
    let mut snapshot = Snapshot::empty(SnapshotSource::Vramscope, Default::default());
    snapshot.segments = segments;
    snapshot.events = events.iter().copied().collect();
    let own = vramscope_engine::stats::compute_stats(
        &snapshot.segments,
        &events,
        0,
        &AllocatorConfig::default(),
    );
    let bytes = vramscope_export::to_pytorch_pickle(&snapshot).unwrap();
    let back = vramscope_import::load_bytes(&bytes, "lost frees", &Default::default()).unwrap();
    let view = vramscope_analysis::model_view::ModelView::new(&back);
    assert_eq!(back.stats.allocated_bytes.all.peak, view.peak_allocated());
    assert_eq!(back.stats.allocated_bytes.all.peak, 6 * mib);
    assert_eq!(
        back.stats.allocated_bytes.all.peak,
        own.allocated_bytes.all.peak
    );
    assert_eq!(back.stats.reserved_bytes.all.peak, 20 * mib);
}

/// The importer counts the statistics in the block sizing's last pass (`vramscope_engine::stats::StatsPass` fed
/// by `size_blocks_visiting`); they are those of a pass of their own over the sized events
/// (`vramscope_engine::stats::compute_stats`), on a run with frees waiting on other streams, an `empty_cache()`
/// and an out-of-memory failure, and on the shared PyTorch traces.
#[test]
fn the_statistics_counted_while_sizing_are_those_of_a_pass_of_their_own() {
    use vramscope_caching::{Backend, CachingAllocator, SimDevice};
    let device = SimDevice::phantom(64 << 20);
    device.set_manual_events(true);
    let side = device.create_stream().unwrap();
    let alloc = CachingAllocator::new(device.clone(), AllocatorConfig::default());
    let mut kept = Vec::new();
    for i in 0..40u64 {
        let a = alloc.alloc((1 + i % 7) << 18).unwrap();
        let b = alloc.alloc((3 + i % 5) << 20).unwrap();
        if i % 3 == 0 {
            b.record_stream(side).unwrap();
        }
        if i % 4 == 0 {
            kept.push(a);
        }
        if i % 10 == 9 {
            device.complete_all_events();
            alloc.empty_cache();
        }
    }
    assert!(alloc.alloc(1 << 30).is_err(), "an out-of-memory failure");
    let run = alloc.snapshot();
    drop(kept);
    let bytes = vramscope_export::to_pytorch_pickle(&run).unwrap();
    let mut snapshots =
        vec![vramscope_import::load_bytes(&bytes, "run", &Default::default()).unwrap()];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for name in [
        "decomfl_opt125m_zo_fedlearn.pickle",
        "cs336_medium_ctx512_train_step.pickle",
    ] {
        if let Some(path) = vramscope_testkit::shared_trace(&root, name) {
            snapshots.push(vramscope_import::load(path).unwrap());
        }
    }
    for snapshot in &snapshots {
        assert!(snapshot.stats.allocated_bytes.all.allocated > 0);
        let own_pass = vramscope_engine::stats::compute_stats(
            &snapshot.segments,
            &snapshot.events,
            snapshot.device.index,
            &snapshot.config,
        );
        assert_eq!(snapshot.stats, own_pass);
    }
    let first = &snapshots[0].stats;
    assert!(first.num_ooms > 0 && first.num_device_free > 0);
    assert!(first.active_bytes.all.freed > 0);
}
