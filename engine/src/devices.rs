//! Snapshots of several devices: which devices have data, and one device's part on its own.
//!
//! A PyTorch snapshot holds `device_traces` per device, and the importers keep every device's
//! events and segments in one `Snapshot` (its `device` is the lowest one with data). Figures
//! only mean something per device (each GPU has its own memory, its own caching allocator and
//! its own peak), so the commands that report figures (`report`, `summary`, `view`, `replay`)
//! take one device's part, [`only_device`], and report each device in turn, the
//! devices being [`devices_with_data`]. The part is a snapshot like any other: the engine,
//! the detectors and the dashboard need nothing else.

use vramscope_model::{Event, Id, Segment, Snapshot, SnapshotSource, Violation};

/// The devices that have events, in increasing order; those with segments when no device has
/// events; the snapshot's own device when it has neither.
pub fn devices_with_data(snapshot: &Snapshot) -> Vec<u32> {
    // Events come in runs of one device: each run's device is looked up once, and the list
    // holds each device once (not one entry per event, 40 MB at 10M events, to sort).
    let mut devices: Vec<u32> = Vec::new();
    let mut last = None;
    for e in snapshot.events.iter() {
        if last != Some(e.device) {
            last = Some(e.device);
            let device = u32::from(e.device);
            if let Err(at) = devices.binary_search(&device) {
                devices.insert(at, device);
            }
        }
    }
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

/// [`devices_with_data`] of `snapshot`, and whether the snapshot holds only the device when
/// there is one ([`holds_only`]), with one pass over the events instead of two: events of one
/// device are all on it.
pub fn devices_with_data_and_sole(snapshot: &Snapshot) -> (Vec<u32>, bool) {
    let devices = devices_with_data(snapshot);
    let sole = match devices.as_slice() {
        // With events, they name this device alone; without, there are none to look at.
        &[device] => {
            snapshot.device.index == device && snapshot.segments.iter().all(|s| s.device == device)
        }
        _ => false,
    };
    (devices, sole)
}

/// The parts of `snapshot` a report of the whole file describes: every device with data, in
/// device order, for a snapshot of several; else the one device with events, without the
/// segments of devices that have none; else the snapshot itself.
pub fn parts(snapshot: Snapshot) -> Vec<Snapshot> {
    let (available, sole) = devices_with_data_and_sole(&snapshot);
    match available.as_slice() {
        [_, _, ..] => available
            .iter()
            .map(|&d| only_device(&snapshot, d))
            .collect(),
        &[d] if !sole => vec![only_device(&snapshot, d)],
        _ => vec![snapshot],
    }
}

/// Whether `snapshot` holds data of more than one device.
pub fn is_multi_device(snapshot: &Snapshot) -> bool {
    devices_with_data(snapshot).len() > 1
}

/// Whether every event and segment of `snapshot` is on `device`, and the snapshot is that
/// device's: then it is its own part. A device with segments and no events is not among
/// [`devices_with_data`] when another has events, but its part of the memory is its own.
pub fn holds_only(snapshot: &Snapshot, device: u32) -> bool {
    snapshot.device.index == device
        && snapshot.segments.iter().all(|s| s.device == device)
        && snapshot
            .events
            .iter()
            .all(|e| u32::from(e.device) == device)
}

/// The indices of `device`'s events in `snapshot`, in order.
pub fn event_indices(snapshot: &Snapshot, device: u32) -> Vec<usize> {
    snapshot
        .events
        .iter()
        .enumerate()
        .filter(|(_, e)| u32::from(e.device) == device)
        .map(|(i, _)| i)
        .collect()
}

/// The parts of `snapshot` a reader asked for: device `device` alone, or, with no device
/// named, every device with data (one part for a single-device snapshot, without the segments
/// of devices that have none). A device without data is an error whose message lists the
/// devices that have some; the CLI and the Python face print it as it is.
pub fn select(snapshot: Snapshot, device: Option<u32>) -> Result<Vec<Snapshot>, String> {
    let available = devices_with_data(&snapshot);
    match device {
        Some(d) if !available.contains(&d) => Err(format!(
            "the snapshot has no data for device {d} (it has device{} {})",
            if available.len() == 1 { "" } else { "s" },
            available
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(d) => Ok(vec![only_device(&snapshot, d)]),
        None => Ok(parts(snapshot)),
    }
}

/// `device`'s part of `snapshot`: its events (renumbered from 0, step marks moved with them),
/// segments and annotations, with the statistics of that device (recomputed for a PyTorch
/// snapshot; kept for the snapshot's own device; unknown, that is zero, otherwise), and the
/// call sites, tags and scopes that those events and blocks name (renumbered in the order of
/// the whole snapshot's tables). The part costs what it holds: nothing of the other devices is
/// copied, so taking every device's part in turn is linear in the snapshot.
pub fn only_device(snapshot: &Snapshot, device: u32) -> Snapshot {
    if holds_only(snapshot, device) {
        return snapshot.clone();
    }
    let kept = event_indices(snapshot, device);
    let mut events: Vec<Event> = kept.iter().map(|&i| snapshot.events[i]).collect();
    for (seq, e) in events.iter_mut().enumerate() {
        e.seq = seq as u64;
    }
    // A step mark starts at the first kept event at or after its old sequence number.
    let steps = snapshot
        .steps
        .iter()
        .map(|mark| {
            let mut mark = mark.clone();
            mark.seq = kept.partition_point(|&i| snapshot.events[i].seq < mark.seq) as u64;
            mark
        })
        .collect();
    let mut segments: Vec<Segment> = snapshot
        .segments
        .iter()
        .filter(|s| s.device == device)
        .cloned()
        .collect();
    // Only the table entries the part names, renumbered.
    let mut violations = snapshot.violations.clone();
    let mut tables = [
        Renumbering::new(snapshot.sites.len()),
        Renumbering::new(snapshot.tags.len()),
        Renumbering::new(snapshot.scopes.len()),
    ];
    each_id(
        &mut events,
        &mut segments,
        &mut violations,
        &mut |table, id| tables[table].mark(id),
    );
    let [sites_kept, tags_kept, scopes_kept] = tables.each_mut().map(Renumbering::finish);
    each_id(
        &mut events,
        &mut segments,
        &mut violations,
        &mut |table, id| tables[table].renumber(id),
    );
    let annotations = snapshot
        .annotations
        .iter()
        .filter(|a| a.device == device)
        .cloned()
        .collect();
    let mut device_info = snapshot.device.clone();
    device_info.index = device;
    if device_info.name.starts_with("cuda:") {
        device_info.name = format!("cuda:{device}");
    }
    let stats = match snapshot.source {
        SnapshotSource::Pytorch => {
            crate::stats::compute_stats(&segments, &events, device, &snapshot.config)
        }
        _ if snapshot.device.index == device => snapshot.stats,
        _ => Default::default(),
    };
    Snapshot {
        format_version: snapshot.format_version,
        source: snapshot.source,
        device: device_info,
        config: snapshot.config.clone(),
        stats,
        epoch_unix_ns: snapshot.epoch_unix_ns,
        segments,
        events: events.into(),
        dropped_events: snapshot.dropped_events,
        sites: sites_kept
            .iter()
            .map(|&i| snapshot.sites[i].clone())
            .collect(),
        tags: tags_kept
            .iter()
            .map(|&i| snapshot.tags[i].clone())
            .collect(),
        scopes: scopes_kept
            .iter()
            .map(|&i| snapshot.scopes[i].clone())
            .collect(),
        steps,
        annotations,
        violations,
    }
}

/// Calls `f` with every table id of `events`, `segments`' blocks and `violations`' owners: the
/// table (0 call sites, 1 tags, 2 scopes) and the id.
fn each_id(
    events: &mut [Event],
    segments: &mut [Segment],
    violations: &mut [Violation],
    f: &mut dyn FnMut(usize, &mut Option<u32>),
) {
    for e in events {
        for (table, id) in [(0, &mut e.site), (1, &mut e.tag), (2, &mut e.scope)] {
            let mut plain = id.map(Id::get);
            f(table, &mut plain);
            *id = Id::pack(plain);
        }
    }
    for b in segments.iter_mut().flat_map(|s| s.blocks.iter_mut()) {
        f(0, &mut b.site);
        f(1, &mut b.tag);
        f(2, &mut b.scope);
    }
    let owners = violations
        .iter_mut()
        .flat_map(|v| [v.previous_owner.as_mut(), v.new_owner.as_mut()])
        .flatten();
    for owner in owners {
        f(0, &mut owner.site);
        f(1, &mut owner.tag);
    }
}

/// The entries of one table (call sites, tags or scopes) that a device's part names, and
/// their new numbers: marked first, then numbered in the table's order.
struct Renumbering {
    /// For each entry of the whole table, its number in the part: [`UNUSED`] for an entry the
    /// part does not name; once marked and before [`Renumbering::finish`], any other value.
    new_id: Vec<u32>,
}

/// An entry of a table that a device's part does not name ([`Renumbering`]).
const UNUSED: u32 = u32::MAX;

impl Renumbering {
    fn new(len: usize) -> Renumbering {
        Renumbering {
            new_id: vec![UNUSED; len],
        }
    }

    fn mark(&mut self, id: &mut Option<u32>) {
        if let Some(new_id) = id.and_then(|i| self.new_id.get_mut(i as usize)) {
            *new_id = 0;
        }
    }

    /// Numbers the used entries in order and returns their places in the whole table.
    fn finish(&mut self) -> Vec<usize> {
        let kept: Vec<usize> = (0..self.new_id.len())
            .filter(|&i| self.new_id[i] != UNUSED)
            .collect();
        for (new, &old) in kept.iter().enumerate() {
            self.new_id[old] = new as u32;
        }
        kept
    }

    /// An id past the table (an inconsistent file) becomes no entry, as it read before.
    fn renumber(&self, id: &mut Option<u32>) {
        *id = id.and_then(|i| self.new_id.get(i as usize).copied());
    }
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
    fn select_gives_the_device_asked_for_or_every_one_and_names_those_with_data() {
        let (both, a, b) = merged();
        let one = select(both.clone(), Some(1)).unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].device.index, 1);
        assert_eq!(one[0].events.len(), b.events.len());
        let every = select(both.clone(), None).unwrap();
        assert_eq!(
            every.iter().map(|p| p.device.index).collect::<Vec<_>>(),
            [0, 1]
        );
        assert_eq!(every[0].events.len(), a.events.len());
        let error = select(both, Some(3)).unwrap_err();
        assert_eq!(
            error,
            "the snapshot has no data for device 3 (it has devices 0, 1)"
        );
        let error = select(a, Some(1)).unwrap_err();
        assert!(error.ends_with("(it has device 0)"), "{error}");
    }

    #[test]
    fn each_device_part_has_only_its_own_figures() {
        let (both, a, b) = merged();
        assert_eq!(devices_with_data(&both), [0, 1]);
        for (device, alone) in [(0, &a), (1, &b)] {
            let part = only_device(&both, device);
            assert!(part.events.iter().all(|e| u32::from(e.device) == device));
            assert!(part.segments.iter().all(|s| s.device == device));
            assert_eq!(part.events.len(), alone.events.len());
            assert!(part
                .events
                .iter()
                .enumerate()
                .all(|(i, e)| e.seq == i as u64));
            // The engine's walk of the part gives the figures of the device's run alone.
            let part_walk = crate::Reconstruction::from_snapshot(&part);
            let own_walk = crate::Reconstruction::from_snapshot(alone);
            assert_eq!(
                part_walk.peak_allocated.bytes, own_walk.peak_allocated.bytes,
                "device {device}"
            );
            assert_eq!(
                part_walk.end.usage(),
                own_walk.end.usage(),
                "device {device}"
            );
        }
    }

    #[test]
    fn a_part_names_only_its_own_sites_and_each_the_same_as_before() {
        let (mut both, _, _) = merged();
        // Sites that only device 1 names, so that device 0's part must leave them out.
        let first_site = both.sites.len() as u32;
        for (i, e) in both.events.iter_mut().filter(|e| e.device == 1).enumerate() {
            let mut site = both.sites[0].clone();
            site.line = 10_000 + i as u32;
            both.sites.push(site);
            e.site = Id::new(first_site + i as u32);
        }
        let site_of = |s: &Snapshot, id: Option<u32>| id.map(|i| s.sites[i as usize].clone());
        for device in [0, 1] {
            let part = only_device(&both, device);
            let full: Vec<_> = both
                .events
                .iter()
                .filter(|e| u32::from(e.device) == device)
                .collect();
            for (kept, original) in part.events.iter().zip(&full) {
                assert_eq!(site_of(&part, kept.site()), site_of(&both, original.site()));
            }
            let used: std::collections::BTreeSet<_> =
                part.events.iter().filter_map(|e| e.site()).collect();
            let blocks = part.segments.iter().flat_map(|s| &s.blocks);
            let used_by_blocks: std::collections::BTreeSet<_> =
                blocks.filter_map(|b| b.site).collect();
            assert_eq!(
                part.sites.len(),
                used.union(&used_by_blocks).count(),
                "device {device}: only the sites its events and blocks name"
            );
        }
    }

    #[test]
    fn one_pass_says_what_the_device_list_and_holds_only_say() {
        let (both, a, b) = merged();
        let mut elsewhere = device_run(0, 64 << 20);
        // Its events on device 0, but it says it is device 3's snapshot.
        elsewhere.device.index = 3;
        let mut segments_apart = device_run(0, 64 << 20);
        // One segment on another device than the events'.
        if let Some(segment) = segments_apart.segments.first_mut() {
            segment.device = 2;
        }
        let mut no_events = device_run(1, 64 << 20);
        no_events.events.clear();
        let mut nothing = no_events.clone();
        nothing.segments.clear();
        nothing.device.index = 5;
        for snapshot in [
            &both,
            &a,
            &b,
            &elsewhere,
            &segments_apart,
            &no_events,
            &nothing,
        ] {
            let devices = devices_with_data(snapshot);
            let sole = devices.len() == 1 && holds_only(snapshot, devices[0]);
            assert_eq!(devices_with_data_and_sole(snapshot), (devices, sole));
        }
        assert!(devices_with_data_and_sole(&a).1);
        assert!(!devices_with_data_and_sole(&elsewhere).1);
        assert!(!devices_with_data_and_sole(&segments_apart).1);
    }

    #[test]
    fn a_single_device_snapshot_is_its_own_part() {
        let alone = device_run(0, 64 << 20);
        assert!(!is_multi_device(&alone));
        assert_eq!(only_device(&alone, 0).events, alone.events);
    }
}
