//! Measures how long the dashboard takes to draw one frame at 200×60, panel by panel, and how
//! long each thing a user does takes to reach the screen (the key or click, `App::prepare` and
//! the draw together).
//!
//! Two datasets:
//!
//! ```sh
//! # A state with BLOCKS live blocks (100,000 unless given), the cursor moved a little:
//! cargo run --release -p vramscope-tui --example draw_bench [BLOCKS]
//! # A decomfl-shaped trace of EVENTS events: the shared decomfl trace's events repeated in
//! # memory, each copy shifted in sequence numbers, time and step (without the teardown
//! # between copies that `bench/gen_pytorch_snapshot.py` writes), or any file the importers
//! # read; several `--trace FILE` are measured one after the other (the generator's file and
//! # replicas of real traces, `../shared/bench/replicate_trace.py`, side by side):
//! cargo run --release -p vramscope-tui --example draw_bench -- --events 10000000 [--trace FILE]...
//! ```
//!
//! Each dataset's first line says the load average as it was opened: the machine may be
//! shared.
//!
//! With `--events`, the file opens as `vramscope view` opens it (at the peak of allocated
//! bytes), and for every panel the bench reports the median and the largest of: a redraw with
//! nothing changed, `→` (the time cursor a timeline column on in the overview and the timeline,
//! to the next step start elsewhere), a jump to a random position (a click on the timeline),
//! and in the event log `↓` (the next row); then, once per change, a new kind filter in the
//! event log (`e`), and what asking for the findings at a resting cursor costs the loop. Each
//! is timed twice: on the wall clock, what the user waits, and on the measuring thread's CPU
//! clock, which other processes sharing the machine do not inflate (their turns on the CPU are
//! not counted). The shared traces come from `$VRAMSCOPE_TRACES`, or `shared/traces` beside the
//! workspace.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::layout::Rect;
use ratatui::Terminal;
use vramscope_import::{self as import, ImportOptions};
use vramscope_model::Snapshot;
use vramscope_testkit::fixture;
use vramscope_tui::app::{App, Panel};
use vramscope_tui::data::{Dataset, Origin};
use vramscope_tui::ui;

/// Samples per measurement.
const SAMPLES: usize = 25;

/// The screen size measured.
const SIZE: (u16, u16) = (200, 60);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.iter().position(|a| a == "--events") {
        Some(i) => {
            let events: usize = args
                .get(i + 1)
                .and_then(|s| s.replace('_', "").parse().ok())
                .expect("--events takes a number of events");
            // Every `--trace FILE` in turn (the generator's shape and replicas of real traces
            // side by side), the shared decomfl trace without one.
            let mut traces: Vec<PathBuf> = args
                .windows(2)
                .filter(|w| w[0] == "--trace")
                .map(|w| PathBuf::from(&w[1]))
                .collect();
            if traces.is_empty() {
                traces.push(decomfl());
            }
            for trace in traces {
                trace_bench(&trace, events);
            }
        }
        None => {
            let blocks = args.first().and_then(|s| s.parse().ok()).unwrap_or(100_000);
            blocks_bench(blocks);
        }
    }
}

/// The shared decomfl trace.
fn decomfl() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    vramscope_testkit::shared_traces_dir(&root)
        .map(|d| d.join("decomfl_opt125m_zo_fedlearn.pickle"))
        .expect("no shared traces: set VRAMSCOPE_TRACES, or pass --trace FILE")
}

/// Median and largest of `v`, in milliseconds.
fn stats(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[v.len() - 1])
}

/// Milliseconds since `t`.
fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Milliseconds this thread has run on a CPU: unlike the wall clock, not inflated when other
/// processes share the machine (0 where the clock is missing).
fn cpu_ms() -> f64 {
    #[cfg(unix)]
    {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the call to fill in.
        if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } == 0 {
            return ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6;
        }
    }
    0.0
}

/// The time one measured thing took: on the wall clock, and on this thread's CPU.
#[derive(Clone, Copy)]
struct Sample {
    wall: f64,
    cpu: f64,
}

/// The first bench: a state with many live blocks, the cursor moved a little.
fn blocks_bench(blocks: usize) {
    let t = Instant::now();
    let snapshot = fixture::many_blocks_snapshot(blocks);
    let made = t.elapsed();
    let t = Instant::now();
    let data = Dataset::new(snapshot, Origin::File("bench".into()));
    println!(
        "{} events, {} live blocks at the end; fixture {:.0} ms, dataset {:.0} ms",
        data.len(),
        data.head().blocks.len(),
        made.as_secs_f64() * 1e3,
        ms(t)
    );
    let mut app = App::new(data);
    app.analyze_now();
    let (w, h) = SIZE;
    let area = Rect::new(0, 0, w, h);
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    let n = app.data.len();
    for panel in Panel::ALL {
        app.panel = panel;
        let mut moved = Vec::new();
        let mut still = Vec::new();
        for i in 0..20 {
            // Move the cursor a little, as holding an arrow key does.
            app.cursor = Some(n - 1 - (i % 2) * 64);
            let t = Instant::now();
            app.prepare_frame(area);
            terminal.draw(|f| ui::draw(f, &app)).unwrap();
            moved.push(ms(t));
            let t = Instant::now();
            app.prepare_frame(area);
            terminal.draw(|f| ui::draw(f, &app)).unwrap();
            still.push(ms(t));
        }
        let (mm, mx) = stats(&mut moved);
        let (sm, sx) = stats(&mut still);
        println!(
            "{:<10} cursor moved: median {mm:>6.2} ms, max {mx:>6.2} ms   redraw: median {sm:>6.2} ms, max {sx:>6.2} ms",
            panel.title()
        );
    }
}

/// `base`'s events repeated until there are `n`, each copy after the last in sequence numbers,
/// time and step; its step marks repeated with them.
fn repeated(base: &Snapshot, n: usize) -> Snapshot {
    let mut out = base.clone();
    out.events = vramscope_model::Events::with_capacity(n);
    out.steps = Vec::new();
    let (Some(first), Some(last)) = (base.events.first(), base.events.last()) else {
        return out;
    };
    let seq_span = last.seq - first.seq + 1;
    let time_span = last.time_ns.saturating_sub(first.time_ns) + 1;
    let step_span = base
        .events
        .iter()
        .map(|e| u64::from(e.step))
        .max()
        .unwrap_or(0)
        + 1;
    let mut copy = 0u64;
    while out.events.len() < n {
        for e in &base.events {
            if out.events.len() == n {
                break;
            }
            let mut e = *e;
            e.seq += copy * seq_span;
            e.time_ns += copy * time_span;
            e.step = vramscope_model::step_after((u64::from(e.step) + copy * step_span) as usize);
            out.events.push(e);
        }
        let last_seq = out.events.last().map_or(0, |e| e.seq);
        out.steps.extend(base.steps.iter().filter_map(|m| {
            let mut m = m.clone();
            m.seq += copy * seq_span;
            m.step += copy * step_span;
            (m.seq <= last_seq).then_some(m)
        }));
        copy += 1;
    }
    out
}

/// A small random number generator (xorshift), so that every run jumps to the same places.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n.max(1) as u64) as usize
    }
}

/// Puts the cursor at `at` with no event row selected, and draws a frame there, not measured:
/// each series of measurements starts from a screen already drawn.
fn start(app: &mut App, terminal: &mut Terminal<TestBackend>, at: Option<usize>) {
    app.cursor = at;
    app.events.selected = None;
    app.prepare_frame(terminal.get_frame().area());
    terminal.draw(|f| ui::draw(f, &*app)).unwrap();
}

/// The time from doing `act` to the frame drawn after it, as the terminal loop does it.
fn frame(
    app: &mut App,
    terminal: &mut Terminal<TestBackend>,
    act: impl FnOnce(&mut App),
) -> Sample {
    let (t, c) = (Instant::now(), cpu_ms());
    act(app);
    app.prepare_frame(terminal.get_frame().area());
    terminal.draw(|f| ui::draw(f, &*app)).unwrap();
    Sample {
        wall: ms(t),
        cpu: cpu_ms() - c,
    }
}

/// The app of the second bench: `trace`'s events, repeated up to `events`, opened as
/// `vramscope view` opens a file (at the peak of allocated bytes, analysed), with what each
/// step of getting there took.
fn open_trace(trace: &Path, events: usize) -> App {
    // The load average before the bench adds its own.
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_string());
    let t = Instant::now();
    let base = import::load_with(trace, &ImportOptions::default()).expect("the trace loads");
    let loaded = ms(t);
    let t = Instant::now();
    let repeat = base.events.len() < events;
    let snapshot = if repeat {
        repeated(&base, events)
    } else {
        let mut s = base;
        s.events.truncate(events);
        s
    };
    let made = ms(t);
    let t = Instant::now();
    let data = Dataset::new(snapshot, Origin::File(trace.display().to_string()));
    let built = ms(t);
    let mut app = App::new(data);
    app.cursor = Some(app.data.peak_allocated_pos());
    let t = Instant::now();
    app.analyze_now();
    let analysed = ms(t);
    println!(
        "{} ({}): {} events, {} step starts, {} live blocks at the end (load {load})",
        trace.display(),
        if repeat { "repeated" } else { "as is" },
        app.data.len(),
        app.data.step_starts().len(),
        app.data.head().blocks.len(),
    );
    println!(
        "load {loaded:.0} ms, repeat {made:.0} ms, dataset {built:.0} ms, analysis {analysed:.0} ms"
    );
    app
}

/// What one panel's measurements found.
struct PanelTimes {
    /// A redraw with nothing changed.
    redraw: Vec<Sample>,
    /// `→`.
    right: Vec<Sample>,
    /// A jump to a random position.
    jump: Vec<Sample>,
    /// `↓` (the event log only).
    down: Vec<Sample>,
    /// `e`, a new kind filter (the event log only).
    kinds: Vec<Sample>,
}

/// Measures `panel`: redraws from `home`, `→` from a quarter in, random jumps, and in the event
/// log `↓` from `home` and the six kind filters.
fn measure_panel(
    app: &mut App,
    terminal: &mut Terminal<TestBackend>,
    rng: &mut Rng,
    panel: Panel,
    home: Option<usize>,
) -> PanelTimes {
    let n = app.data.len();
    app.panel = panel;
    let key = |code| move |a: &mut App| a.handle_key(KeyEvent::from(code));
    start(app, terminal, home);
    let redraw = (0..SAMPLES).map(|_| frame(app, terminal, |_| {})).collect();
    // A quarter in, where there are step starts ahead for `→` to go to.
    start(app, terminal, Some(n / 4));
    let right = (0..SAMPLES)
        .map(|_| frame(app, terminal, key(KeyCode::Right)))
        .collect();
    let jump = (0..SAMPLES)
        .map(|_| {
            let to = rng.below(n + 1);
            frame(app, terminal, |a| a.set_cursor(to))
        })
        .collect();
    let (mut down, mut kinds) = (Vec::new(), Vec::new());
    if panel == Panel::Events {
        start(app, terminal, home);
        down = (0..SAMPLES)
            .map(|_| frame(app, terminal, key(KeyCode::Down)))
            .collect();
        // A new kind filter costs a pass over the events, once: `e` through all six.
        kinds = (0..6)
            .map(|_| frame(app, terminal, key(KeyCode::Char('e'))))
            .collect();
    }
    PanelTimes {
        redraw,
        right,
        jump,
        down,
        kinds,
    }
}

/// `median / max` of one clock of `v` (0 the wall clock, 1 the CPU), or `—` when empty.
fn cell(v: &[Sample], clock: usize) -> (String, f64) {
    if v.is_empty() {
        return ("—".to_string(), 0.0);
    }
    let mut t: Vec<f64> = v
        .iter()
        .map(|s| if clock == 0 { s.wall } else { s.cpu })
        .collect();
    let (m, x) = stats(&mut t);
    (format!("{m:.2} / {x:.2}"), x)
}

/// The second bench: a big trace, as `vramscope view` opens it.
fn trace_bench(trace: &Path, events: usize) {
    let mut app = open_trace(trace, events);
    let (w, h) = SIZE;
    let mut terminal = Terminal::new(TestBackend::new(w, h)).unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let home = app.cursor;
    let times: Vec<(Panel, PanelTimes)> = Panel::ALL
        .iter()
        .map(|&p| (p, measure_panel(&mut app, &mut terminal, &mut rng, p, home)))
        .collect();
    // One table of the wall clock, one of the CPU time.
    for (clock, title) in [
        "wall clock, median / max ms",
        "CPU time of this thread, median / max ms",
    ]
    .iter()
    .enumerate()
    {
        println!("{title}");
        println!(
            "{:<10} {:>18} {:>18} {:>18} {:>18}",
            "panel", "redraw", "→ (time)", "random jump", "↓ (event row)"
        );
        let mut worst = 0f64;
        for (panel, t) in &times {
            let cells = [&t.redraw, &t.right, &t.jump, &t.down].map(|v| cell(v, clock));
            worst = cells.iter().fold(worst, |w, c| w.max(c.1));
            println!(
                "{:<10} {:>18} {:>18} {:>18} {:>18}",
                panel.title(),
                cells[0].0,
                cells[1].0,
                cells[2].0,
                cells[3].0
            );
        }
        println!("slowest frame: {worst:.2} ms (goal ≤ 16 ms)");
    }
    if let Some((_, t)) = times.iter().find(|(p, _)| *p == Panel::Events) {
        println!(
            "event log, a new kind filter (e, once per change): {} ms (CPU {})",
            cell(&t.kinds, 0).0,
            cell(&t.kinds, 1).0
        );
    }
    let asks = ask_for_findings(app, &mut rng);
    println!(
        "asking for the findings at a resting cursor (the loop's part): {} ms (CPU {})",
        cell(&asks, 0).0,
        cell(&asks, 1).0
    );
}

/// Once the cursor rests, the loop's `tick` asks the background thread for the findings at the
/// cursor: what that costs the loop itself, a few times (each waits for the analysis). The
/// cursor is put there as a click puts it, with the frame there drawn (the jump is measured
/// above); before issue 47's sums the measure also held that jump, not drawn first.
fn ask_for_findings(app: App, rng: &mut Rng) -> Vec<Sample> {
    let mut app = app.with_analyzer();
    let n = app.data.len();
    let (w, h) = SIZE;
    let mut asks = Vec::new();
    for _ in 0..3 {
        app.set_cursor(rng.below(n));
        app.prepare_frame(Rect::new(0, 0, w, h));
        std::thread::sleep(std::time::Duration::from_millis(200));
        let (t, c) = (Instant::now(), cpu_ms());
        app.tick();
        asks.push(Sample {
            wall: ms(t),
            cpu: cpu_ms() - c,
        });
        while !app.tick() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    asks
}
