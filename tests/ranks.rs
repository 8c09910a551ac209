//! `vramscope ranks`, end to end: a job's snapshots, one per rank, with a planted difference
//! on one rank. The comparison must name that rank and the site behind its excess, and stay
//! quiet on a balanced job.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use vramscope::allocator::{CachingAllocator, SimDevice};
use vramscope::import;
use vramscope::model::{
    AllocatorConfig, Block, BlockState, CallSite, EventKind, Pool, Segment, Snapshot,
};
use vramscope_testkit::shared_trace;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vramscope-ranks-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Runs `vramscope ranks` on `dir` and returns its JSON.
fn ranks_json(dir: &Path) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["ranks", "--format", "json"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Where the planted rank keeps its extra optimizer shard: this line.
fn extra_shard(
    alloc: &CachingAllocator<SimDevice>,
) -> (vramscope::allocator::DeviceBuffer<SimDevice>, String) {
    let (buffer, line) = (alloc.alloc(96 << 20).unwrap(), line!());
    (buffer, format!("{}:{line}", file!()))
}

/// One rank of a data-parallel step: weights, activations freed each step, and on `heavy`
/// ranks an extra shard held from the start.
fn rank_snapshot(heavy: bool) -> (Snapshot, Option<String>) {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 36), AllocatorConfig::default());
    let _weights = alloc.tagged("weights").alloc(200 << 20).unwrap();
    let shard = heavy.then(|| extra_shard(&alloc));
    for _ in 0..4 {
        alloc.mark_step();
        let activations: Vec<_> = (0..6).map(|_| alloc.alloc(24 << 20).unwrap()).collect();
        drop(activations);
    }
    let snapshot = alloc.snapshot();
    (snapshot, shard.map(|(_, site)| site))
}

#[test]
fn the_heavy_rank_and_its_site_are_named() {
    let dir = scratch("planted");
    let mut planted_site = None;
    for rank in 0..8 {
        let (snapshot, site) = rank_snapshot(rank == 3);
        if site.is_some() {
            planted_site = site;
        }
        snapshot
            .save(dir.join(format!("snapshot_rank{rank}.json")))
            .unwrap();
    }
    let planted_site = planted_site.unwrap();
    let json = ranks_json(&dir);
    let ranks = json["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 8);
    let ids: Vec<u64> = ranks.iter().map(|r| r["rank"].as_u64().unwrap()).collect();
    assert_eq!(
        ids,
        (0..8).collect::<Vec<u64>>(),
        "ranks from the file names"
    );
    let findings = json["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{json:#}");
    let finding = &findings[0];
    assert_eq!(finding["kind"], "rank_imbalance");
    assert_eq!(finding["rank"], 3);
    let top = finding["sites"][0]["site"].as_str().unwrap();
    assert!(
        planted_site.ends_with(top) || top.ends_with(&planted_site) || top == planted_site,
        "the excess is named at {top}, planted at {planted_site}"
    );
    let excess = finding["peak"].as_u64().unwrap() - finding["median_peak"].as_u64().unwrap();
    assert_eq!(excess, 96 << 20, "the shard is the whole difference");

    // The text names them too.
    let text = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("ranks")
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("rank_imbalance: rank 3 peaks"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_balanced_job_has_no_imbalance() {
    let dir = scratch("balanced");
    for rank in 0..4 {
        rank_snapshot(false)
            .0
            .save(dir.join(format!("rank{rank}.json")))
            .unwrap();
    }
    let json = ranks_json(&dir);
    assert_eq!(json["ranks"].as_array().unwrap().len(), 4);
    assert!(json["findings"].as_array().unwrap().is_empty(), "{json:#}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A copy of `snapshot` that also holds `bytes` at `site` from before its first event, in a
/// segment of its own (as a rank with an extra shard would).
fn with_planted_shard(snapshot: &Snapshot, bytes: u64, site: &str) -> Snapshot {
    let mut planted = snapshot.clone();
    let site_id = planted.sites.len() as u32;
    let (file, line) = site.rsplit_once(':').unwrap();
    planted.sites.push(CallSite {
        file: file.to_string(),
        line: line.parse().unwrap(),
        column: 0,
        function: "shard_optimizer_state".to_string(),
        frames: Vec::new(),
    });
    let address = 0x7fff_0000_0000;
    let device = u16::try_from(planted.device.index).unwrap();
    let first = planted.events.first().copied();
    let event = |kind| {
        vramscope_testkit::event(kind)
            .time_ns(first.map_or(0, |e| e.time_ns))
            .device(device)
            .addr(address)
            .size(bytes)
            .site(site_id)
            .step(first.map_or(0, |e| e.step))
            .build()
    };
    planted.events.to_mut().splice(
        0..0,
        [event(EventKind::SegmentAlloc), event(EventKind::Alloc)],
    );
    for (seq, e) in planted.events.iter_mut().enumerate() {
        e.seq = seq as u64;
    }
    for mark in &mut planted.steps {
        mark.seq += 2;
    }
    planted.segments.push(Segment {
        device: u32::from(device),
        address,
        total_size: bytes,
        stream: 0,
        pool: Pool::Large,
        expandable: false,
        blocks: vec![Block {
            address,
            size: bytes,
            requested_size: bytes,
            state: BlockState::ActiveAllocated,
            site: Some(site_id),
            tag: None,
            scope: None,
            step: 0,
            thread: 0,
        }],
    });
    planted
}

#[test]
fn a_shared_trace_replicated_over_ranks_names_the_planted_rank() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Some(path) = shared_trace(root, "decomfl_opt125m_zo_fedlearn.pickle") else {
        return;
    };
    let snapshot = import::load(&path).unwrap();
    let dir = scratch("decomfl");
    let site = "cezo_fl/fl_helpers.py:88";
    for rank in 0..4 {
        let copy = if rank == 2 {
            with_planted_shard(&snapshot, 512 << 20, site)
        } else {
            snapshot.clone()
        };
        copy.save(dir.join(format!("decomfl_rank{rank}.json")))
            .unwrap();
    }
    let json = ranks_json(&dir);
    let findings = json["findings"].as_array().unwrap();
    assert_eq!(findings.len(), 1, "{json:#}");
    assert_eq!(findings[0]["rank"], 2);
    assert_eq!(findings[0]["sites"][0]["site"], site);
    let excess =
        findings[0]["peak"].as_u64().unwrap() - findings[0]["median_peak"].as_u64().unwrap();
    assert_eq!(excess, 512 << 20);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A folder with a single-device rank, a 3-GPU dump, an empty dump and a file that is not a
/// snapshot (issue 42, item 11): the 3-GPU dump is its three devices, each a row with its own
/// peak (not one rank whose peak sums them), and the other two are skipped, each said on one
/// line of standard error with the reason, in the words `report` says.
#[test]
fn a_multi_device_file_is_its_devices_and_skipped_files_are_said() {
    use vramscope::analysis::model_view::ModelView;
    use vramscope::model::{DeviceInfo, SnapshotSource};
    let dir = scratch("faces");
    let (single, _) = rank_snapshot(false);
    single.save(dir.join("a_rank0.json")).unwrap();
    let three = vramscope_testkit::three_devices_oom_on_1();
    three.save(dir.join("b_rank1.json")).unwrap();
    Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default())
        .save(dir.join("c_rank2.json"))
        .unwrap();
    std::fs::write(
        dir.join("d_rank3.json"),
        "{\"format_version\": 1, \"events\": 7}",
    )
    .unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["ranks", "--format", "json"])
        .arg(&dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(1),
        "some files were skipped: {stderr}"
    );
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let rows = json["ranks"].as_array().unwrap();
    let single_peak = ModelView::new(&single).peak_allocated();
    let peaks: Vec<(Option<u64>, u64)> = rows
        .iter()
        .map(|r| (r["device"].as_u64(), r["peak_allocated"].as_u64().unwrap()))
        .collect();
    let device_peaks: Vec<u64> = vramscope::engine::devices::devices_with_data(&three)
        .iter()
        .map(|&d| {
            ModelView::new(&vramscope::engine::devices::only_device(&three, d)).peak_allocated()
        })
        .collect();
    assert_eq!(
        peaks,
        [
            (None, single_peak),
            (Some(0), device_peaks[0]),
            (Some(1), device_peaks[1]),
            (Some(2), device_peaks[2]),
        ],
        "{json:#}"
    );
    assert!(json["numbering"]
        .as_str()
        .unwrap()
        .contains("holds devices 0, 1, 2, each a row of its own"));
    let skipped: Vec<(&str, &str)> = json["failed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| (f["skipped"].as_str().unwrap(), f["file"].as_str().unwrap()))
        .collect();
    let empty = dir.join("c_rank2.json").display().to_string();
    let broken = dir.join("d_rank3.json").display().to_string();
    assert_eq!(
        skipped,
        [("empty", empty.as_str()), ("unreadable", broken.as_str())]
    );
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("vramscope ranks: skipped"))
        .collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].contains(&format!(
            "{empty}: nothing to analyse: the snapshot holds no events"
        )),
        "{stderr}"
    );
    assert!(lines[1].contains(&broken), "{stderr}");
    // The text says what each skipped row is.
    let text = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("ranks")
        .arg(&dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("6 ranks (1 could not be read, 1 empty)"),
        "{text}"
    );
    assert!(
        text.contains("skipped: ") && text.contains("could not be read: "),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Where the leaking rank keeps a buffer each step: this line.
fn kept_for_logging(
    alloc: &CachingAllocator<SimDevice>,
) -> vramscope::allocator::DeviceBuffer<SimDevice> {
    alloc.alloc(8 << 20).unwrap()
}

/// One rank of a 200-rank job: weights, activations freed each step with a little noise
/// between ranks; the `leak` rank keeps 8 MiB a step at one site, the `batch` rank runs a
/// batch half again as large.
fn job_rank(rank: u32, leak: bool, batch: bool) -> Snapshot {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 36), AllocatorConfig::default());
    let _weights = alloc.tagged("weights").alloc(512 << 20).unwrap();
    let samples = if batch { 3 } else { 2 };
    let wobble = u64::from(rank * 7919 % 97) * (16 << 10);
    let mut kept = Vec::new();
    for _ in 0..6 {
        alloc.mark_step();
        let activations: Vec<_> = (0..4)
            .map(|_| alloc.alloc(samples * (32 << 20) + wobble).unwrap())
            .collect();
        if leak {
            kept.push(kept_for_logging(&alloc));
        }
        drop(activations);
    }
    alloc.snapshot()
}

/// Runs `vramscope ranks --format json` (with `args` before the inputs) and returns its
/// standard output and standard error; a file of the job is skipped, so it exits with 1.
fn ranks_of(inputs: &[&Path]) -> (String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["ranks", "--format", "json"])
        .args(inputs)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(
        output.status.code(),
        Some(1),
        "a file was skipped: {stderr}"
    );
    (String::from_utf8(output.stdout).unwrap(), stderr)
}

/// Issue 48: 200 ranks with a little noise between them, one that leaks at one site, one
/// that runs a larger batch, and a file that is no snapshot. `ranks` names exactly the two,
/// lists the bad file as skipped with the reason, and says the same, byte for byte, from the
/// snapshots, from their summaries (`vramscope summarize`) and from both mixed; the text
/// prints the ranks alike and the distribution, not 200 rows.
#[test]
fn two_planted_ranks_of_200_are_named_from_snapshots_and_from_summaries() {
    const LEAK: u32 = 17;
    const BATCH: u32 = 143;
    let dir = scratch("job200");
    let job = dir.join("job");
    let sums = dir.join("summaries");
    std::fs::create_dir_all(&job).unwrap();
    std::fs::create_dir_all(&sums).unwrap();
    for rank in 0..200 {
        job_rank(rank, rank == LEAK, rank == BATCH)
            .save(job.join(format!("rank{rank}.json")))
            .unwrap();
    }
    std::fs::write(job.join("rank200.json"), [0u8; 4096]).unwrap();
    let (from_snapshots, stderr) = ranks_of(&[&job]);
    assert!(stderr.contains("skipped rank 200: "), "{stderr}");
    let json: Value = serde_json::from_str(&from_snapshots).unwrap();
    let mut named: Vec<u64> = json["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["rank"].as_u64().unwrap())
        .collect();
    named.sort_unstable();
    assert_eq!(
        named,
        [u64::from(LEAK), u64::from(BATCH)],
        "{:#}",
        json["findings"]
    );
    let finding = |rank: u32| {
        json["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["rank"] == rank)
            .unwrap()
            .clone()
    };
    assert_eq!(finding(BATCH)["kind"], "rank_imbalance");
    let leak = finding(LEAK);
    assert_eq!(leak["kind"], "rank_retains_more", "{leak:#}");
    assert!(
        leak["sites_at_end"][0]["site"]
            .as_str()
            .unwrap()
            .starts_with("tests/ranks.rs:"),
        "{leak:#}"
    );
    assert_eq!(leak["sites_at_end"][0]["bytes"], 6 * (8 << 20));
    assert_eq!(json["ranks"].as_array().unwrap().len(), 200);
    assert_eq!(json["failed"][0]["rank"], 200);
    assert_eq!(json["failed"][0]["skipped"], "unreadable");

    // The map: one summary per file, kilobytes each, the bad file's saying why.
    for rank in 0..=200 {
        let output = Command::new(env!("CARGO_BIN_EXE_vramscope"))
            .arg("summarize")
            .arg(job.join(format!("rank{rank}.json")))
            .arg("-o")
            .arg(sums.join(format!("rank{rank}.json")))
            .output()
            .unwrap();
        assert_eq!(
            output.status.code(),
            Some(if rank == 200 { 1 } else { 0 }),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let size = std::fs::metadata(sums.join(format!("rank{rank}.json")))
            .unwrap()
            .len();
        assert!(size < 16 << 10, "rank {rank}'s summary is {size} bytes");
    }
    // The reduce: from the summaries, and from summaries and snapshots mixed.
    let (from_summaries, _) = ranks_of(&[&sums]);
    assert_eq!(from_summaries, from_snapshots);
    let mixed = dir.join("mixed");
    std::fs::create_dir_all(&mixed).unwrap();
    for rank in 0..=200 {
        let from = if rank % 2 == 0 { &job } else { &sums };
        let name = format!("rank{rank}.json");
        std::fs::copy(from.join(&name), mixed.join(&name)).unwrap();
    }
    let (from_mixed, _) = ranks_of(&[&mixed]);
    assert_eq!(
        from_mixed.replace(&mixed.display().to_string(), &job.display().to_string()),
        from_snapshots,
        "the snapshots of the mixed folder are named by it"
    );

    // The text: which ranks are alike and the distribution, not a row per rank.
    let text = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .arg("ranks")
        .arg(&sums)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("ranks 0–200 alike but 17 and 143; 200 skipped"),
        "{text}"
    );
    assert!(text.contains("peak allocated"), "{text}");
    assert!(text.lines().count() < 40, "{text}");
    let all = Command::new(env!("CARGO_BIN_EXE_vramscope"))
        .args(["ranks", "--all"])
        .arg(&sums)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&all.stdout).lines().count() > 200);
    let _ = std::fs::remove_dir_all(&dir);
}
