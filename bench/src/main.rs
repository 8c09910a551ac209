//! Side-by-side benchmark of vramscope's caching allocator against peer allocators (issue 7).
//!
//! On the same traces in the same run, it replays every trace's alloc/free sequence through
//! vramscope (policies `pytorch` and `compact`; tracking off, call sites and events, backtraces
//! sampled 1 in 64), offset-allocator 0.2, gpu-alloc 0.6 on a fake `MemoryDevice`,
//! cubecl-server 0.11's `MemoryManagement` on a null `ComputeStorage`, and mimalloc as a host
//! reference. For each it prints nanoseconds per operation, raw device allocations and peak
//! reserved over peak live bytes, as markdown tables with ratios against vramscope with
//! tracking off; then the scaling of one vramscope allocator over 1 and 2 threads, and the
//! fidelity of the `pytorch` policy's peak reserved bytes against PyTorch's own.
//!
//! ```text
//! cargo run --release --manifest-path bench/Cargo.toml -- [--quick] [--reps N] [--traces DIR]
//! bench/target/release/vramscope-bench profile pairs <subject> <pairs>
//! bench/target/release/vramscope-bench profile trace|steady <trace> <subject> <reps>
//! bench/target/release/vramscope-bench profile threads <subject> <pairs> <reps> <threads>...
//! bench/target/release/vramscope-bench profile apart <subject> <pairs> <reps> <threads>...
//! ```
//!
//! The `profile` forms run one allocator alone, for `valgrind --tool=callgrind` or a quick
//! timing: `trace` times the first pass through a fresh allocator, `steady` the second pass,
//! and both print the mean and the fastest of `reps` repetitions. `threads` runs cached pairs
//! from each given number of threads on one allocator (the scaling table's pair loop, for more
//! thread counts). `apart` runs the same pairs with an allocator per thread, alone and with one
//! exact shared counter, beside one allocator for all: how far books kept apart per stream
//! could go, and what an exact all-streams statistic costs them.

mod measure;
mod peers;
mod trace;

use std::path::{Path, PathBuf};

use vramscope_model::{AllocatorConfig, EventKind, Snapshot};
use vramscope_replay::{self as replay, ReplayOptions};

use measure::Replay;
use peers::{
    Cubecl, DeviceAllocator, GpuAlloc, Mimalloc, Offset, Vramscope, VramscopeExclusive,
    DEVICE_CAPACITY,
};
use trace::Trace;

/// The real traces, by file name, with their short names.
const REAL_TRACES: [(&str, &str); 3] = [
    ("decomfl", "decomfl_opt125m_zo_fedlearn.pickle"),
    ("cs336_medium", "cs336_medium_ctx512_train_step.pickle"),
    ("hta", "hta_ddp_rank1_v100_profile_memory.trace.json.gz"),
];

/// Seed of the synthetic trace.
const SYNTHETIC_SEED: u64 = 0x7652_414d;
/// Blocks of the adversarial `scattered` trace: half of them pile up as free blocks of one size.
const SCATTERED_BLOCKS: usize = 10_000;

/// One allocator configuration under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Subject {
    /// vramscope, `pytorch` policy, tracking off.
    Off,
    /// vramscope, `pytorch` policy, call sites and events.
    Events,
    /// vramscope, `pytorch` policy, call sites, events and backtraces sampled 1 in 64.
    Backtraces,
    /// vramscope, `compact` policy, tracking off.
    CompactOff,
    /// vramscope, `compact` policy, call sites and events.
    CompactEvents,
    /// vramscope, `pytorch` policy, tracking off, through the thread-safe raw-pointer API
    /// (the device lock and the address lookup on every operation).
    Shared,
    /// offset-allocator 0.2.
    Offset,
    /// gpu-alloc 0.6.
    GpuAlloc,
    /// cubecl-server 0.11.
    Cubecl,
    /// mimalloc (host).
    Mimalloc,
}

/// Every subject, in table order; the first is the base of the ratios.
const SUBJECTS: [Subject; 10] = [
    Subject::Off,
    Subject::Events,
    Subject::Backtraces,
    Subject::CompactOff,
    Subject::CompactEvents,
    Subject::Shared,
    Subject::Offset,
    Subject::GpuAlloc,
    Subject::Cubecl,
    Subject::Mimalloc,
];

impl Subject {
    /// The name in tables.
    fn label(self) -> &'static str {
        match self {
            Subject::Off => "vramscope pytorch, tracking off",
            Subject::Events => "vramscope pytorch, call sites + events",
            Subject::Backtraces => "vramscope pytorch, + backtraces 1/64",
            Subject::CompactOff => "vramscope compact, tracking off",
            Subject::CompactEvents => "vramscope compact, call sites + events",
            Subject::Shared => "vramscope pytorch, off, lock + pointer per op",
            Subject::Offset => "offset-allocator 0.2",
            Subject::GpuAlloc => "gpu-alloc 0.6",
            Subject::Cubecl => "cubecl-server 0.11",
            Subject::Mimalloc => "mimalloc (host)",
        }
    }

    /// The name on the command line.
    fn key(self) -> &'static str {
        match self {
            Subject::Off => "off",
            Subject::Events => "events",
            Subject::Backtraces => "bt64",
            Subject::CompactOff => "compact",
            Subject::CompactEvents => "compact-events",
            Subject::Shared => "shared",
            Subject::Offset => "offset",
            Subject::GpuAlloc => "gpu-alloc",
            Subject::Cubecl => "cubecl",
            Subject::Mimalloc => "mimalloc",
        }
    }

    /// The subject a command-line name names.
    fn from_key(key: &str) -> Option<Subject> {
        SUBJECTS.into_iter().find(|s| s.key() == key)
    }

    /// The vramscope settings, for vramscope subjects.
    fn config(self) -> Option<AllocatorConfig> {
        let parse = |text: &str| AllocatorConfig::parse(text).expect("valid settings");
        Some(match self {
            Subject::Off => AllocatorConfig::default().untracked(),
            Subject::Events => AllocatorConfig::default(),
            Subject::Backtraces => parse("backtraces:64"),
            Subject::CompactOff => parse("policy:compact").untracked(),
            Subject::CompactEvents => parse("policy:compact"),
            Subject::Shared => AllocatorConfig::default().untracked(),
            _ => return None,
        })
    }
}

/// One subject's replays of one trace, with the offset-allocator's high-water mark.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// The first pass, through a fresh allocator (its books are the footprint reported).
    replay: Replay,
    /// A second pass through the same allocator after the first one freed everything: the
    /// steady state of a training loop, whose every step repeats the one before.
    warm: Replay,
    high_water: Option<u64>,
}

/// Replays `trace` twice through a fresh instance of `subject`.
fn run_once(subject: Subject, trace: &Trace) -> Sample {
    run_passes(subject, trace, true)
}

/// Replays `trace` through a fresh instance of `subject`, a second time when `twice` (else
/// the second pass is a copy of the first).
fn run_passes(subject: Subject, trace: &Trace, twice: bool) -> Sample {
    fn passes_of<A: DeviceAllocator>(
        alloc: &mut A,
        trace: &Trace,
        twice: bool,
    ) -> (Replay, Replay) {
        let cold = measure::replay(alloc, trace);
        let warm = if twice {
            measure::replay(alloc, trace)
        } else {
            cold
        };
        (cold, warm)
    }
    let mut high_water = None;
    let (replay, warm) = match subject {
        Subject::Shared => passes_of(&mut Vramscope::new(subject.config().unwrap()), trace, twice),
        _ if subject.config().is_some() => {
            let alloc = Vramscope::new(subject.config().unwrap());
            let mut adapter = VramscopeExclusive {
                inner: alloc.inner.exclusive(),
            };
            passes_of(&mut adapter, trace, twice)
        }
        Subject::Offset => {
            let max_allocs = (trace.max_live_blocks as u32 * 4).max(128 * 1024);
            let mut alloc = Offset::new(trace.peak_live * 2, max_allocs);
            let result = passes_of(&mut alloc, trace, twice);
            high_water = Some(alloc.high_water_bytes());
            result
        }
        Subject::GpuAlloc => passes_of(&mut GpuAlloc::new(), trace, twice),
        Subject::Cubecl => passes_of(&mut Cubecl::new(DEVICE_CAPACITY / 4), trace, twice),
        Subject::Mimalloc => passes_of(&mut Mimalloc, trace, twice),
        _ => unreachable!("every subject is handled above"),
    };
    Sample {
        replay,
        warm,
        high_water,
    }
}

/// Nanoseconds per operation of `pairs` cached 4 KiB alloc+free pairs through a fresh
/// instance of `subject`.
fn run_pairs(subject: Subject, pairs: u64) -> f64 {
    match subject {
        Subject::Offset => measure::pairs(&mut Offset::new(1 << 30, 1024), pairs),
        Subject::GpuAlloc => measure::pairs(&mut GpuAlloc::new(), pairs),
        Subject::Cubecl => measure::pairs(&mut Cubecl::new(DEVICE_CAPACITY / 4), pairs),
        Subject::Mimalloc => measure::pairs(&mut Mimalloc, pairs),
        Subject::Shared => measure::pairs(
            &mut Vramscope::new(Subject::Shared.config().unwrap()),
            pairs,
        ),
        s => {
            let alloc = Vramscope::new(s.config().expect("vramscope"));
            let mut adapter = VramscopeExclusive {
                inner: alloc.inner.exclusive(),
            };
            measure::pairs(&mut adapter, pairs)
        }
    }
}

/// A row of the results: the median and fastest time of all repetitions and the first one's
/// books (which do not change between repetitions).
struct Row {
    subject: Subject,
    ns_per_op: f64,
    min_ns_per_op: f64,
    /// The median and fastest of the second (steady-state) passes.
    warm_ns_per_op: f64,
    warm_min_ns_per_op: f64,
    /// Repetitions run (fewer than asked when the subject used up its time budget).
    reps: usize,
    first: Sample,
}

/// Wall time after which a subject gets no more repetitions on a trace (it has had at least
/// [`MIN_REPS`]): the slowest peers take seconds per pass on the adversarial trace.
const REP_BUDGET: std::time::Duration = std::time::Duration::from_secs(3);
/// Repetitions every subject gets whatever its time.
const MIN_REPS: usize = 3;

/// Bytes as whole MiB.
fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1 << 20) as f64)
}

/// `value / base` as a ratio, or a dash when there is no base.
fn ratio(value: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.2}×", value / base)
    } else {
        "—".to_string()
    }
}

/// The 1, 5 and 15 minute load averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| {
            let parts: Vec<&str> = s.split_whitespace().take(3).collect();
            (parts.len() == 3).then(|| parts.join(" "))
        })
        .unwrap_or_else(|| "unknown".to_string())
}

/// CPU count and model, and memory, as this machine reports them.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".to_string());
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
        })
        .map(|kb| format!("{:.0} GiB", kb as f64 / (1 << 20) as f64))
        .unwrap_or_else(|| "unknown memory".to_string());
    format!("{threads} vCPUs ({cpu}), {mem}")
}

/// Where the shared traces are: `$VRAMSCOPE_TRACES`, `../shared/traces` from the working
/// directory, or the same beside the workspace this crate sits in.
fn traces_dir(explicit: Option<PathBuf>) -> Option<PathBuf> {
    let candidates = explicit
        .into_iter()
        .chain(std::env::var_os("VRAMSCOPE_TRACES").map(PathBuf::from))
        .chain([
            PathBuf::from("../shared/traces"),
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces"),
        ]);
    candidates.into_iter().find(|p| p.is_dir())
}

/// Imports one of the real traces, or says why it was skipped.
fn load_real(dir: &Path, file: &str) -> Option<Snapshot> {
    let path = dir.join(file);
    match vramscope_import::load(&path) {
        Ok(snapshot) => Some(snapshot),
        Err(e) => {
            println!("skipped {}: {e}", path.display());
            None
        }
    }
}

/// Command-line options of the main run.
struct Options {
    quick: bool,
    reps: usize,
    traces: Option<PathBuf>,
}

/// Parses the main run's arguments; an empty error asks for the usage text.
fn parse_options(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        quick: false,
        reps: 0,
        traces: None,
    };
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "--quick" => options.quick = true,
            "--help" | "-h" => return Err(String::new()),
            "--reps" => {
                i += 1;
                options.reps = args
                    .get(i)
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n > 0)
                    .ok_or("--reps needs a positive number")?;
            }
            "--traces" => {
                i += 1;
                options.traces = Some(args.get(i).ok_or("--traces needs a folder")?.into());
            }
            other => return Err(format!("unknown argument {other}")),
        }
        i += 1;
    }
    if options.reps == 0 {
        options.reps = if options.quick { 1 } else { 31 };
    }
    Ok(options)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("profile") {
        if let Err(e) = profile(&args[1..]) {
            eprintln!("{e}");
            std::process::exit(2);
        }
        return;
    }
    let options = match parse_options(&args) {
        Ok(options) => options,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{e}");
            }
            eprintln!("usage: vramscope-bench [--quick] [--reps N] [--traces DIR]\n       vramscope-bench profile pairs <subject> <pairs>\n       vramscope-bench profile trace|steady <trace> <subject> <reps>");
            std::process::exit(if e.is_empty() { 0 } else { 2 });
        }
    };

    println!("# vramscope-bench: peer allocators (issue 7)\n");
    println!("machine: {}", machine());
    println!("load average at start: {}", load_average());
    println!(
        "mode: {}, {} repetition(s) per allocator and trace (fastest and median reported)\n",
        if options.quick { "quick" } else { "full" },
        options.reps
    );

    let mut traces = generated_traces(options.quick);
    let mut snapshots = Vec::new();
    match traces_dir(options.traces.clone()) {
        Some(dir) => {
            for (name, file) in REAL_TRACES {
                if let Some(snapshot) = load_real(&dir, file) {
                    traces.push(Trace::from_snapshot(name, &snapshot));
                    snapshots.push((name, snapshot));
                }
            }
        }
        None => println!("shared traces not found: only the synthetic trace is replayed"),
    }

    println!("## Traces\n");
    println!("| trace | operations | allocations | frees | unmatched frees (skipped) | peak live | largest request | most live blocks |");
    println!("|---|---|---|---|---|---|---|---|");
    for t in &traces {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            t.name,
            t.ops.len(),
            t.allocs,
            t.frees,
            t.unmatched_frees,
            mib(t.peak_live),
            mib(t.max_size),
            t.max_live_blocks
        );
    }

    let mut all_rows = Vec::new();
    for t in &traces {
        let mut times: Vec<Vec<f64>> = vec![Vec::new(); SUBJECTS.len()];
        let mut warm_times: Vec<Vec<f64>> = vec![Vec::new(); SUBJECTS.len()];
        let mut firsts: Vec<Option<Sample>> = vec![None; SUBJECTS.len()];
        let mut spent = vec![std::time::Duration::ZERO; SUBJECTS.len()];
        for rep in 0..options.reps {
            // Rotate the order each repetition so that a change of load hits every subject.
            for k in 0..SUBJECTS.len() {
                let i = (k + rep) % SUBJECTS.len();
                if times[i].len() >= MIN_REPS && spent[i] > REP_BUDGET {
                    continue;
                }
                let started = std::time::Instant::now();
                let sample = run_once(SUBJECTS[i], t);
                spent[i] += started.elapsed();
                times[i].push(sample.replay.ns_per_op());
                warm_times[i].push(sample.warm.ns_per_op());
                firsts[i].get_or_insert(sample);
            }
        }
        let rows: Vec<Row> = SUBJECTS
            .iter()
            .enumerate()
            .map(|(i, &subject)| Row {
                subject,
                ns_per_op: measure::median(&mut times[i]),
                min_ns_per_op: times[i].iter().copied().fold(f64::INFINITY, f64::min),
                warm_ns_per_op: measure::median(&mut warm_times[i]),
                warm_min_ns_per_op: warm_times[i].iter().copied().fold(f64::INFINITY, f64::min),
                reps: times[i].len(),
                first: firsts[i].expect("at least one repetition"),
            })
            .collect();
        all_rows.push((t, rows));
    }

    println!("\n## Results\n");
    println!("ns/op is the fastest of the repetitions, with the median in brackets: on a loaded machine a replay of a few milliseconds is often preempted, which only ever adds time, so the fastest is the better estimate of the code's cost. Ratios (×) are against vramscope `pytorch` with tracking off on the same trace in this run (fastest). Peak reserved ÷ peak live divides each allocator's most bytes held from its device by the trace's most live requested bytes.\n");
    println!("| trace | allocator | ns/op | × | raw device allocs | × | peak reserved | ÷ peak live | OOMs |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (t, rows) in &all_rows {
        let base = &rows[0];
        let base_raw = base.first.replay.footprint.raw_allocs.unwrap_or(0) as f64;
        for row in rows {
            let fp = row.first.replay.footprint;
            let raw = fp
                .raw_allocs
                .map(|r| r.to_string())
                .unwrap_or_else(|| "—".into());
            let raw_ratio = fp
                .raw_allocs
                .map(|r| ratio(r as f64, base_raw))
                .unwrap_or_else(|| "—".into());
            let (reserved, over) = match (row.first.high_water, fp.peak_reserved) {
                (Some(high), Some(arena)) => (
                    format!("{} arena, {} used†", mib(arena), mib(high)),
                    format!("{:.3}†", high as f64 / t.peak_live as f64),
                ),
                (None, Some(r)) => (mib(r), format!("{:.3}", r as f64 / t.peak_live as f64)),
                _ => ("—".into(), "—".into()),
            };
            let reps_note = if row.reps < options.reps {
                format!(" [{} reps]", row.reps)
            } else {
                String::new()
            };
            println!(
                "| {} | {} | {:.0} ({:.0}){reps_note} | {} | {} | {} | {} | {} | {} |",
                t.name,
                row.subject.label(),
                row.min_ns_per_op,
                row.ns_per_op,
                ratio(row.min_ns_per_op, base.min_ns_per_op),
                raw,
                raw_ratio,
                reserved,
                over,
                row.first.replay.ooms
            );
        }
    }
    println!("\nA subject that spent more than {} s on a trace stops after {MIN_REPS} or more repetitions; the count is given where it is fewer than {}.", REP_BUDGET.as_secs(), options.reps);
    println!("\n† offset-allocator manages one arena of 2 × peak live bytes, allocated up front (its one raw allocation); \"used\" is the highest byte its placements reached, the smallest arena that would have served the trace, and its ratio is that over peak live.");

    println!("\n## Steady state: a second pass through the same allocator\n");
    println!("Each repetition above replays the trace a second time through the same allocator once the first pass has freed everything, as every step of a training loop repeats the one before; ns/op of that pass, fastest with the median in brackets, × against offset-allocator's second pass in the same run.\n");
    println!("| trace | allocator | ns/op | × offset-allocator |");
    println!("|---|---|---|---|");
    for (t, rows) in &all_rows {
        let offset = rows
            .iter()
            .find(|r| r.subject == Subject::Offset)
            .expect("offset-allocator row");
        for row in rows {
            println!(
                "| {} | {} | {:.0} ({:.0}) | {} |",
                t.name,
                row.subject.label(),
                row.warm_min_ns_per_op,
                row.warm_ns_per_op,
                ratio(row.warm_min_ns_per_op, offset.warm_min_ns_per_op)
            );
        }
    }

    println!("\n## Targets\n");
    println!(
        "Time ratios are of the fastest repetitions, with the ratio of the medians in brackets; first pass (fresh allocators) and second pass (steady state).\n"
    );
    println!("| trace | off ÷ offset-allocator (≤ 1.5×) | events ÷ offset-allocator (≤ 3×) | steady off ÷ offset | steady events ÷ offset | raw allocs pytorch / compact | raw allocs of the peers |");
    println!("|---|---|---|---|---|---|---|");
    for (t, rows) in &all_rows {
        let get = |s: Subject| rows.iter().find(|r| r.subject == s).expect("subject");
        let offset = get(Subject::Offset);
        let versus = |s: Subject| {
            format!(
                "{} ({})",
                ratio(get(s).min_ns_per_op, offset.min_ns_per_op),
                ratio(get(s).ns_per_op, offset.ns_per_op)
            )
        };
        let steady = |s: Subject| {
            format!(
                "{} ({})",
                ratio(get(s).warm_min_ns_per_op, offset.warm_min_ns_per_op),
                ratio(get(s).warm_ns_per_op, offset.warm_ns_per_op)
            )
        };
        let raw = |s: Subject| get(s).first.replay.footprint.raw_allocs.unwrap_or(0);
        let peers = [Subject::Offset, Subject::GpuAlloc, Subject::Cubecl]
            .map(|s| format!("{} {}", s.key(), raw(s)))
            .join(", ");
        println!(
            "| {} | {} | {} | {} | {} | {} / {} | {} |",
            t.name,
            versus(Subject::Off),
            versus(Subject::Events),
            steady(Subject::Off),
            steady(Subject::Events),
            raw(Subject::Off),
            raw(Subject::CompactOff),
            peers
        );
    }

    fast_path(options.quick);
    scaling(&traces, options.quick);
    fidelity(&snapshots);
    println!("\nload average at end: {}", load_average());
}

/// Cached 4 KiB alloc+free pairs: the fast path, where the device is never touched.
fn fast_path(quick: bool) {
    let (pairs, reps) = if quick { (200_000, 1) } else { (1_000_000, 5) };
    println!("\n## Fast path: cached 4 KiB alloc+free pairs\n");
    println!("{pairs} pairs after one warm-up pair, {reps} repetition(s); ns per operation (half a pair), fastest with the median in brackets; × against vramscope `pytorch` with tracking off (fastest).\n");
    println!("| allocator | ns/op | × |");
    println!("|---|---|---|");
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); SUBJECTS.len()];
    for rep in 0..reps {
        for k in 0..SUBJECTS.len() {
            let i = (k + rep) % SUBJECTS.len();
            times[i].push(run_pairs(SUBJECTS[i], pairs));
        }
    }
    let summary: Vec<(f64, f64)> = times
        .iter_mut()
        .map(|t| {
            let min = t.iter().copied().fold(f64::INFINITY, f64::min);
            (measure::median(t), min)
        })
        .collect();
    for (subject, (median, min)) in SUBJECTS.iter().zip(&summary) {
        println!(
            "| {} | {min:.1} ({median:.1}) | {} |",
            subject.label(),
            ratio(*min, summary[0].1)
        );
    }
}

/// One vramscope allocator, 1 and 2 threads on different streams.
fn scaling(traces: &[Trace], quick: bool) {
    let reps = if quick { 1 } else { 5 };
    let trace = traces
        .iter()
        .find(|t| t.name == "decomfl")
        .unwrap_or(&traces[0]);
    let rounds = if quick { 10 } else { 60 };
    let pairs = if quick { 200_000 } else { 1_000_000 };
    println!("\n## Scaling: one vramscope allocator, threads on different streams\n");
    println!("Each thread works on its own stream: {} rounds of the {} replay, or {pairs} cached 4 KiB pairs. Per-thread figures are means over the threads; wall ns/op is elapsed time, CPU ns/op the thread's own CPU time (lock spinning and cache-line transfers included, time parked or preempted not); voluntary context switches are parks on the lock (the threads do nothing else that blocks), involuntary ones preemption by other work. Median of {reps} run(s) by throughput.\n", rounds, trace.name);
    println!("| workload | settings | threads | wall ns/op per thread | CPU ns/op per thread | total Mops/s | throughput ÷ 1 thread | voluntary / involuntary switches per 10k ops |");
    println!("|---|---|---|---|---|---|---|---|");
    for (label, config) in [
        ("tracking off", Subject::Off.config().expect("vramscope")),
        (
            "call sites + events",
            Subject::Events.config().expect("vramscope"),
        ),
    ] {
        for pair_loop in [false, true] {
            let workload = if pair_loop {
                "4 KiB pairs".to_string()
            } else {
                format!("{} replay", trace.name)
            };
            let mut one = 0.0;
            for threads in [1, 2] {
                let mut runs: Vec<measure::Threaded> = (0..reps)
                    .map(|_| {
                        if pair_loop {
                            measure::pairs_threads(&config, threads, pairs)
                        } else {
                            measure::replay_threads(trace, &config, threads, rounds)
                        }
                    })
                    .collect();
                runs.sort_by(|a, b| a.mops().total_cmp(&b.mops()));
                let run = runs[runs.len() / 2];
                if threads == 1 {
                    one = run.mops();
                }
                println!(
                    "| {workload} | {label} | {threads} | {:.0} | {:.0} | {:.2} | {:.2}× | {:.1} / {:.1} |",
                    run.wall_ns_per_op,
                    run.cpu_ns_per_op,
                    run.mops(),
                    run.mops() / one,
                    run.voluntary_switches as f64 * 1e4 / run.ops as f64,
                    run.involuntary_switches as f64 * 1e4 / run.ops as f64,
                );
            }
        }
    }
}

/// The `pytorch` policy's peak reserved bytes against the trace's own (PyTorch's), replayed
/// from the state each trace started in, and the `compact` policy's.
fn fidelity(snapshots: &[(&str, Snapshot)]) {
    if snapshots.is_empty() {
        return;
    }
    println!("\n## Fidelity: peak reserved against PyTorch's (inspector replay, start state reconstructed)\n");
    println!("| trace | PyTorch peak reserved | vramscope pytorch | equal | vramscope compact | replay peak allocated |");
    println!("|---|---|---|---|---|---|");
    for (name, snapshot) in snapshots {
        let run = |config: AllocatorConfig| {
            let mut options = ReplayOptions::default();
            options.config = config;
            replay::replay(snapshot, &options, &mut |_, _| {})
        };
        let pytorch = run(AllocatorConfig::default());
        let compact = run(AllocatorConfig::parse("policy:compact").expect("valid settings"));
        let ours = pytorch.figures.peak_reserved.unwrap_or(0);
        // A trace without segment events (a profiler trace) records the memory taken before
        // its window only as totals, which the replay restores as whole segments of those
        // sizes: its reserved peak is an approximation, not comparable byte for byte.
        let has_segments = !snapshot.segments.is_empty()
            || snapshot
                .events
                .iter()
                .any(|e| matches!(e.kind, EventKind::SegmentAlloc | EventKind::SegmentMap));
        let recorded = pytorch.original.peak_reserved;
        let theirs = recorded.filter(|_| has_segments);
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            recorded.map(mib).unwrap_or_else(|| "—".into()),
            mib(ours),
            match theirs {
                Some(t) if t == ours => "yes".to_string(),
                Some(t) => format!("no ({:+} bytes)", ours as i128 - t as i128),
                None => "not comparable: no segments in the trace".to_string(),
            },
            mib(compact.figures.peak_reserved.unwrap_or(0)),
            mib(pytorch.figures.peak_allocated.unwrap_or(0)),
        );
    }
}

/// The traces the bench makes itself: the synthetic training loop (4 steps with `quick`, else
/// 20) and the adversarial `scattered` one.
fn generated_traces(quick: bool) -> Vec<Trace> {
    vec![
        Trace::synthetic(if quick { 4 } else { 20 }, SYNTHETIC_SEED),
        Trace::scattered(SCATTERED_BLOCKS, 2, SYNTHETIC_SEED),
    ]
}

/// `profile pairs <subject> <pairs>` or `profile trace|steady <trace> <subject> <reps>`: one
/// allocator alone, for callgrind.
fn profile(args: &[String]) -> Result<(), String> {
    let usage =
        "usage: profile pairs <subject> <pairs> | profile trace|steady <trace> <subject> <reps> | profile threads|apart <subject> <pairs> <reps> <threads>...";
    let subject = |key: &str| {
        Subject::from_key(key).ok_or_else(|| {
            let keys: Vec<&str> = SUBJECTS.iter().map(|s| s.key()).collect();
            format!("unknown subject {key}; one of {}", keys.join(", "))
        })
    };
    let number = |s: Option<&String>| -> Result<u64, String> {
        s.and_then(|n| n.parse().ok())
            .ok_or_else(|| usage.to_string())
    };
    match args.first().map(String::as_str) {
        Some("pairs") => {
            let subject = subject(args.get(1).ok_or(usage)?)?;
            let n = number(args.get(2))?;
            let ns = run_pairs(subject, n);
            println!("{}: {n} pairs, {ns:.1} ns per operation", subject.label());
        }
        Some(form @ ("trace" | "steady")) => {
            let steady = form == "steady";
            let name = args.get(1).ok_or(usage)?;
            let subject = subject(args.get(2).ok_or(usage)?)?;
            let reps = number(args.get(3))?;
            let generated = generated_traces(false)
                .into_iter()
                .find(|t| &t.name == name);
            let trace = if let Some(trace) = generated {
                trace
            } else {
                let (short, file) = REAL_TRACES
                    .iter()
                    .find(|(short, _)| short == name)
                    .ok_or_else(|| format!("unknown trace {name}"))?;
                let dir = traces_dir(None).ok_or("shared traces not found")?;
                let snapshot = load_real(&dir, file).ok_or("trace did not load")?;
                Trace::from_snapshot(short, &snapshot)
            };
            let mut total = 0.0;
            let mut fastest = f64::INFINITY;
            for _ in 0..reps {
                let sample = run_passes(subject, &trace, steady);
                let ns = if steady { sample.warm } else { sample.replay }.ns_per_op();
                total += ns;
                fastest = fastest.min(ns);
            }
            println!(
                "{} on {}{}: {} operations × {reps}, {:.1} ns per operation (fastest {fastest:.1})",
                subject.label(),
                trace.name,
                if steady { ", steady state" } else { "" },
                trace.ops.len(),
                total / reps as f64
            );
        }
        Some(form @ ("threads" | "apart")) => {
            let subject = subject(args.get(1).ok_or(usage)?)?;
            let config = subject
                .config()
                .ok_or_else(|| format!("{form} needs a vramscope subject"))?;
            let pairs = number(args.get(2))?;
            let reps = number(args.get(3))?.max(1) as usize;
            let counts: Vec<usize> = args[4..]
                .iter()
                .map(|n| n.parse().map_err(|_| usage.to_string()))
                .collect::<Result<_, _>>()?;
            let run = ThreadedPairs {
                subject,
                config,
                pairs,
                reps,
                counts,
            };
            if form == "threads" {
                thread_pairs(&run);
            } else {
                pairs_apart(&run);
            }
        }
        _ => return Err(usage.to_string()),
    }
    Ok(())
}

/// What `profile threads` and `profile apart` run: cached 4 KiB pairs of `subject` with
/// `config`, `pairs` per thread, from each count of threads in `counts`, `reps` times.
struct ThreadedPairs {
    subject: Subject,
    config: AllocatorConfig,
    pairs: u64,
    reps: usize,
    counts: Vec<usize>,
}

/// `profile apart`: cached 4 KiB pairs from each count of threads in three arrangements, run
/// alternately: one allocator for all threads (each on its own stream, as `profile threads`),
/// an allocator each (the bound on books kept apart per stream), and an allocator each plus
/// one exact shared counter of allocated bytes (what an exact all-streams statistic adds to
/// that bound). Ratios are against one thread on one allocator; the median run of `reps` by
/// throughput for each.
fn pairs_apart(run: &ThreadedPairs) {
    use measure::Shared;
    let (subject, config, pairs, reps) = (run.subject, &run.config, run.pairs, run.reps);
    println!(
        "{}: {pairs} cached 4 KiB pairs per thread, the three arrangements run alternately, median of {reps} run(s) by throughput\n",
        subject.label()
    );
    println!("| threads | arrangement | total M pairs/s | ÷ 1 thread, one allocator | CPU ns/pair per thread | CPU ÷ wall | voluntary / involuntary switches per 10k pairs |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    let arrangements: [(&str, Option<Shared>); 3] = [
        ("one allocator", None),
        ("an allocator each", Some(Shared::Nothing)),
        (
            "an allocator each + exact shared counter",
            Some(Shared::ExactCounter),
        ),
    ];
    let mut one = None;
    for &threads in &run.counts {
        let mut runs: Vec<Vec<measure::Threaded>> = vec![Vec::new(); arrangements.len()];
        for _ in 0..reps {
            for (runs, (_, shared)) in runs.iter_mut().zip(arrangements) {
                runs.push(match shared {
                    None => measure::pairs_threads(config, threads, pairs),
                    Some(shared) => measure::pairs_apart(config, threads, pairs, shared),
                });
            }
        }
        for (runs, (label, _)) in runs.iter_mut().zip(arrangements) {
            let row = PairsRow::median_of(runs, &mut one);
            println!(
                "| {threads} | {label} | {:.2} | {:.2}× | {:.0} | {:.2} | {:.0} / {:.0} |",
                row.mpairs, row.ratio, row.cpu_ns, row.cpu_per_wall, row.voluntary, row.involuntary,
            );
        }
    }
}

/// `profile threads`: cached 4 KiB pairs through `alloc_ptr`/`free_ptr` on one allocator from
/// each count of threads, each thread on its own stream, as a markdown table. The median run of
/// `reps` by throughput; CPU time per pair is each thread's own (spinning included, time parked
/// or preempted not), so CPU ÷ wall near 1 says the threads had their cores to themselves.
fn thread_pairs(run: &ThreadedPairs) {
    let (subject, config, pairs, reps) = (run.subject, &run.config, run.pairs, run.reps);
    println!(
        "{}: {pairs} cached 4 KiB pairs per thread, median of {reps} run(s) by throughput\n",
        subject.label()
    );
    println!("| threads | total M pairs/s | ÷ 1 thread | wall ns/pair per thread | CPU ns/pair per thread | CPU ÷ wall | voluntary / involuntary switches per 10k pairs |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let mut one = None;
    for &threads in &run.counts {
        let mut runs: Vec<measure::Threaded> = (0..reps)
            .map(|_| measure::pairs_threads(config, threads, pairs))
            .collect();
        let row = PairsRow::median_of(&mut runs, &mut one);
        println!(
            "| {threads} | {:.2} | {:.2}× | {:.0} | {:.0} | {:.2} | {:.0} / {:.0} |",
            row.mpairs,
            row.ratio,
            row.wall_ns,
            row.cpu_ns,
            row.cpu_per_wall,
            row.voluntary,
            row.involuntary,
        );
    }
}

/// The figures of a row of the thread tables: the median run of a set by throughput.
struct PairsRow {
    /// Pairs per second of all threads together, in millions.
    mpairs: f64,
    /// That over the first row's (one thread).
    ratio: f64,
    /// Wall-clock and CPU nanoseconds per pair, each a mean over the threads.
    wall_ns: f64,
    cpu_ns: f64,
    /// CPU time over wall-clock time, per thread: 1 when each had a core to itself.
    cpu_per_wall: f64,
    /// Context switches of all threads per 10,000 pairs.
    voluntary: f64,
    involuntary: f64,
}

impl PairsRow {
    /// The row of the median of `runs` by throughput; `one` is the throughput the ratios are
    /// taken against, set by the first row.
    fn median_of(runs: &mut [measure::Threaded], one: &mut Option<f64>) -> PairsRow {
        runs.sort_by(|a, b| a.mops().total_cmp(&b.mops()));
        let run = runs[runs.len() / 2];
        let mpairs = run.mops() / 2.0;
        let base = *one.get_or_insert(mpairs);
        let pairs_total = run.ops as f64 / 2.0;
        PairsRow {
            mpairs,
            ratio: mpairs / base,
            wall_ns: run.wall_ns_per_op * 2.0,
            cpu_ns: run.cpu_ns_per_op * 2.0,
            cpu_per_wall: run.cpu_ns_per_op / run.wall_ns_per_op,
            voluntary: run.voluntary_switches as f64 * 1e4 / pairs_total,
            involuntary: run.involuntary_switches as f64 * 1e4 / pairs_total,
        }
    }
}
