//! The HTML explorer's size and time to first paint on generated traces, for BENCHMARKS.md.
//!
//! For each event count given (default 100,000 and 1,000,000) this builds a synthetic training
//! trace (40 call sites with stacks, activations allocated and freed every step, a slow leak,
//! segments, step marks and time stamps), writes `report --format html`'s page for it under
//! `target/explorer-bench/`, and loads it three times in headless Chromium with `--dump-dom`;
//! the page records in `data-paint-ms` the milliseconds from navigation start until its chart
//! and tables were first drawn. Run it with
//! `cargo run --release -p vramscope-tui --example explorer_bench -- 100000 1000000`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use vramscope_analysis::explorer::ExplorerData;
use vramscope_analysis::model_view::ModelView;
use vramscope_analysis::report;
use vramscope_model::{CallSite, DeviceInfo, EventKind, Frame, Snapshot, SnapshotSource, StepMark};
use vramscope_render::html;

const MIB: u64 = 1 << 20;

/// A trace of about `target` events. See the module documentation.
fn synthetic(target: usize) -> Snapshot {
    let mut s = Snapshot::empty(
        SnapshotSource::Vramscope,
        DeviceInfo {
            name: "synthetic".to_string(),
            backend: "sim".to_string(),
            capacity: 80 << 30,
            ..DeviceInfo::default()
        },
    );
    for i in 0..40u32 {
        let file = format!("model/layer_{}.py", i % 8);
        let frames = vec![
            Frame {
                file: file.clone(),
                line: 10 + i,
                function: format!("forward_{i}"),
            },
            Frame {
                file: "train.py".to_string(),
                line: 120,
                function: "train_step".to_string(),
            },
            Frame {
                file: "train.py".to_string(),
                line: 200,
                function: "main".to_string(),
            },
        ];
        s.sites.push(CallSite {
            file,
            line: 10 + i,
            column: 0,
            function: format!("forward_{i}"),
            frames,
        });
    }
    let mut seq = 0u64;
    let mut push = |s: &mut Snapshot, kind, addr, size, site: Option<u32>, step: u64| {
        s.events.push(
            vramscope_testkit::event(kind)
                .seq(seq)
                .time_ns(seq * 1_000)
                .addr(addr)
                .size(size)
                .requested(size)
                .site(site)
                .step(vramscope_model::step_after(step as usize))
                .build(),
        );
        seq += 1;
    };
    let acts_base = 0x7f00_0000_0000u64;
    let leak_base = 0x7f80_0000_0000u64;
    push(&mut s, EventKind::SegmentAlloc, acts_base, 8 << 30, None, 0);
    push(&mut s, EventKind::Alloc, acts_base, 512 * MIB, Some(0), 0);
    let mut step = 0u64;
    let mut leak_segment_end = leak_base;
    let mut leak_next = leak_base;
    while s.events.len() < target {
        step += 1;
        // Sequence numbers are event indices here.
        let next = s.events.len() as u64;
        s.steps.push(StepMark {
            step,
            seq: next,
            time_ns: next * 1_000,
            label: "mark_step".to_string(),
        });
        // Forward: 20 activations of varied sizes; backward frees them in reverse.
        let mut live = Vec::new();
        let mut offset = 512 * MIB;
        for i in 0..20u64 {
            let size = (1 + (i * 7 + step) % 13) * 2 * MIB;
            let site = 1 + ((i + step / 50) % 30) as u32;
            push(
                &mut s,
                EventKind::Alloc,
                acts_base + offset,
                size,
                Some(site),
                step,
            );
            live.push((acts_base + offset, size));
            offset += size;
        }
        while let Some((addr, size)) = live.pop() {
            push(&mut s, EventKind::FreeRequested, addr, size, None, step);
            push(&mut s, EventKind::FreeCompleted, addr, size, None, step);
        }
        // A slow leak: a small block kept every step, in 2 MiB segments.
        let size = 64 << 10;
        if leak_next + size > leak_segment_end {
            leak_next = leak_segment_end.max(leak_next);
            push(
                &mut s,
                EventKind::SegmentAlloc,
                leak_next,
                2 * MIB,
                None,
                step,
            );
            leak_segment_end = leak_next + 2 * MIB;
        }
        push(&mut s, EventKind::Alloc, leak_next, size, Some(35), step);
        leak_next += size;
    }
    s
}

fn browser() -> Option<PathBuf> {
    ["/usr/bin/chromium", "/usr/bin/chromium-headless-shell"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// Loads `page` in headless Chromium and returns `data-paint-ms` and the process's seconds.
fn paint_ms(browser: &Path, page: &Path, profile: &Path) -> (Option<f64>, f64) {
    let _ = std::fs::remove_dir_all(profile);
    let started = Instant::now();
    let out = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--window-size=1400,900",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", page.display()))
        .stderr(Stdio::null())
        .output()
        .expect("chromium runs");
    let seconds = started.elapsed().as_secs_f64();
    let dom = String::from_utf8_lossy(&out.stdout);
    let ms = dom.find("data-paint-ms=\"").and_then(|i| {
        let v = &dom[i + 15..];
        v[..v.find('"')?].parse().ok()
    });
    (ms, seconds)
}

fn main() {
    let counts: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let counts = if counts.is_empty() {
        vec![100_000, 1_000_000]
    } else {
        counts
    };
    let dir = PathBuf::from("target/explorer-bench");
    std::fs::create_dir_all(&dir).expect("an output folder");
    let dir = dir.canonicalize().expect("an absolute folder");
    let browser = browser();
    println!(
        "| events | steps | HTML size | report build | of which explorer data | first paint (median of 3) | chromium run |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for n in counts {
        let snapshot = synthetic(n);
        let started = Instant::now();
        let built = report::build_report(&snapshot, &report::ReportOptions::default());
        let page_text = html::render_html(&built);
        let build_s = started.elapsed().as_secs_f64();
        let view = ModelView::new(&snapshot);
        let started = Instant::now();
        let data = ExplorerData::build(&view, None);
        let explorer_s = started.elapsed().as_secs_f64();
        drop(data);
        let page = dir.join(format!("synthetic_{n}.html"));
        std::fs::write(&page, &page_text).expect("the page is written");
        let (paint, run) = match &browser {
            Some(b) => {
                let mut runs: Vec<(Option<f64>, f64)> = (0..3)
                    .map(|i| paint_ms(b, &page, &dir.join(format!("profile-{i}"))))
                    .collect();
                runs.sort_by(|a, b| a.1.total_cmp(&b.1));
                let mut paints: Vec<f64> = runs.iter().filter_map(|r| r.0).collect();
                paints.sort_by(f64::total_cmp);
                (
                    paints
                        .get(paints.len() / 2)
                        .map_or("no paint".to_string(), |p| format!("{p:.0} ms")),
                    format!("{:.2} s", runs[1].1),
                )
            }
            None => ("chromium absent".to_string(), "-".to_string()),
        };
        println!(
            "| {} | {} | {:.1} MB | {:.2} s | {:.2} s | {} | {} |",
            snapshot.events.len(),
            snapshot.steps.len(),
            page_text.len() as f64 / 1e6,
            build_s,
            explorer_s,
            paint,
            run
        );
    }
}
