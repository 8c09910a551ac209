//! Load, analyse and replay each shared trace, and print the time each stage takes and the
//! replay rate in events per second. Run with `cargo bench -p vramscope-analysis --bench
//! traces`; traces come from `../shared/traces` or `$VRAMSCOPE_TRACES`.

use std::path::PathBuf;
use std::time::Instant;

use vramscope_analysis::detect::{detect, DetectOptions};
use vramscope_import as import;
use vramscope_replay::{replay, ReplayOptions};

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[samples.len() / 2]
}

fn main() {
    let dir = std::env::var_os("VRAMSCOPE_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces"));
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!("skipped: no traces at {}", dir.display());
        return;
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.to_string_lossy();
            name.ends_with(".pickle") || name.ends_with(".json.gz")
        })
        .collect();
    files.sort();
    println!(
        "{:<48} {:>9} {:>10} {:>10} {:>10} {:>14}",
        "trace", "events", "load ms", "detect ms", "replay ms", "replay ev/s"
    );
    for path in files {
        let runs = 7;
        let mut load = Vec::new();
        let mut analyse = Vec::new();
        let mut replays = Vec::new();
        let mut events = 0;
        let mut replayed = 0;
        for _ in 0..runs {
            let t = Instant::now();
            let snapshot = import::load(&path).expect("trace loads");
            load.push(t.elapsed().as_secs_f64() * 1e3);
            events = snapshot.events.len();
            let t = Instant::now();
            let findings = detect(&snapshot, &DetectOptions::default());
            analyse.push(t.elapsed().as_secs_f64() * 1e3);
            std::hint::black_box(findings);
            let t = Instant::now();
            let result = replay(&snapshot, &ReplayOptions::default(), &mut |_, _| {});
            replays.push(t.elapsed().as_secs_f64() * 1e3);
            replayed = result.figures.events;
        }
        let replay_ms = median(replays);
        println!(
            "{:<48} {:>9} {:>10.1} {:>10.1} {:>10.2} {:>14.0}",
            path.file_name().unwrap().to_string_lossy(),
            events,
            median(load),
            median(analyse),
            replay_ms,
            replayed as f64 / (replay_ms / 1e3)
        );
    }
}
