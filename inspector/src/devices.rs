//! Snapshots of several devices: which devices have data, and one device's part on its own.
//!
//! A PyTorch snapshot holds `device_traces` per device, and the importers keep every device's
//! events and segments in one `Snapshot` (its `device` is the lowest one with data). Figures
//! only mean something per device (each GPU has its own memory, its own caching allocator and
//! its own peak), so the commands that report figures (`report`, `summary`, `view`, `replay`)
//! take one device's part, [`only_device`], and report each device in turn, the
//! devices being [`devices_with_data`]. The part is a snapshot like any other: the engine,
//! the detectors and the dashboard need nothing else.

use vramscope_model::{Snapshot, SnapshotSource};

/// The devices that have events, in increasing order; those with segments when no device has
/// events; the snapshot's own device when it has neither.
pub fn devices_with_data(snapshot: &Snapshot) -> Vec<u32> {
    let mut devices: Vec<u32> = snapshot.events.iter().map(|e| e.device).collect();
    if devices.is_empty() {
        devices = snapshot.segments.iter().map(|s| s.device).collect();
    }
    if devices.is_empty() {
        devices.push(snapshot.device.index);
    }
    devices.sort_unstable();
    devices.dedup();
    devices
}

/// Whether `snapshot` holds data of more than one device.
pub fn is_multi_device(snapshot: &Snapshot) -> bool {
    devices_with_data(snapshot).len() > 1
}

/// `device`'s part of `snapshot`: its events (renumbered from 0, step marks moved with them),
/// segments and annotations, with the statistics of that device (recomputed for a PyTorch
/// snapshot; kept for the snapshot's own device; unknown, that is zero, otherwise). Call
/// sites, tags and scopes are shared tables and stay whole.
pub fn only_device(snapshot: &Snapshot, device: u32) -> Snapshot {
    let mut part = snapshot.clone();
    if !is_multi_device(snapshot) && snapshot.device.index == device {
        return part;
    }
    let kept: Vec<usize> = snapshot
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.device == device)
        .map(|(i, _)| i)
        .collect();
    part.events = kept.iter().map(|&i| snapshot.events[i]).collect();
    for (seq, e) in part.events.iter_mut().enumerate() {
        e.seq = seq as u64;
    }
    // A step mark starts at the first kept event at or after its old sequence number.
    part.steps = snapshot
        .steps
        .iter()
        .map(|mark| {
            let mut mark = mark.clone();
            mark.seq = kept.partition_point(|&i| snapshot.events[i].seq < mark.seq) as u64;
            mark
        })
        .collect();
    part.segments.retain(|s| s.device == device);
    part.annotations.retain(|a| a.device == device);
    part.device.index = device;
    if part.device.name.starts_with("cuda:") {
        part.device.name = format!("cuda:{device}");
    }
    part.stats = match snapshot.source {
        SnapshotSource::Pytorch => crate::import::pytorch::compute_stats(
            &part.segments,
            &part.events,
            device,
            &part.config,
        ),
        _ if snapshot.device.index == device => snapshot.stats,
        _ => Default::default(),
    };
    part
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_model::Snapshot;
    use vramscope_testkit::{device_run, merge_devices};

    /// Two devices' runs in one snapshot, and each run alone.
    fn merged() -> (Snapshot, Snapshot, Snapshot) {
        let (a, b) = (device_run(0, 64 << 20), device_run(1, 200 << 20));
        (merge_devices(&[a.clone(), b.clone()]), a, b)
    }

    #[test]
    fn each_device_part_has_only_its_own_figures() {
        let (both, a, b) = merged();
        assert_eq!(devices_with_data(&both), [0, 1]);
        for (device, alone) in [(0, &a), (1, &b)] {
            let part = only_device(&both, device);
            assert!(part.events.iter().all(|e| e.device == device));
            assert!(part.segments.iter().all(|s| s.device == device));
            assert_eq!(part.events.len(), alone.events.len());
            assert!(part
                .events
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq == i as u64));
            let view = crate::model_view::ModelView::new(&part);
            let own = crate::model_view::ModelView::new(alone);
            assert_eq!(
                view.peak_allocated(),
                own.peak_allocated(),
                "device {device}"
            );
            assert_eq!(view.end_allocated(), own.end_allocated(), "device {device}");
        }
    }

    #[test]
    fn a_single_device_snapshot_is_its_own_part() {
        let alone = device_run(0, 64 << 20);
        assert!(!is_multi_device(&alone));
        assert_eq!(only_device(&alone, 0).events, alone.events);
    }
}
