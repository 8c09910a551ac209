//! Screen tests of the dashboard: every panel drawn on the fixed data of
//! `vramscope_testkit::fixture` into ratatui's `TestBackend`, at 80×24 and 160×48, compared with
//! the insta snapshots in `tests/snapshots`; plus the detail and tree views, the help overlay,
//! the help bar while typing a filter, the time cursor in the past, a lost connection,
//! `NO_COLOR`, and the stack view on PyTorch's stacks (framework frames folded, `f` unfolds).

use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::crossterm::event::{KeyCode, KeyEvent};
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::Terminal;
use vramscope_testkit::fixture;
use vramscope_tui::app::{App, Panel};
use vramscope_tui::data::{Dataset, Link, Origin};
use vramscope_tui::ui::{self, Theme};

fn app() -> App {
    let data = Dataset::new(
        fixture::training_snapshot(),
        Origin::File("run.json".into()),
    );
    let mut app = App::new(data);
    app.theme = Theme::plain();
    app.now_unix_ns = fixture::EPOCH_UNIX_NS;
    app.cursor = Some(app.data.len());
    app.analyze_now();
    app
}

fn draw(app: &mut App, width: u16, height: u16) -> Buffer {
    app.area = Rect::new(0, 0, width, height);
    app.prepare();
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| ui::draw(f, app)).unwrap();
    terminal.backend().buffer().clone()
}

fn text(buf: &Buffer) -> String {
    let area = buf.area;
    let mut out = String::new();
    for y in 0..area.height {
        let line: String = (0..area.width).map(|x| buf[(x, y)].symbol()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn screen(app: &mut App, width: u16, height: u16) -> String {
    text(&draw(app, width, height))
}

macro_rules! panel_screens {
    ($($name:ident: $panel:expr,)*) => {
        $(
            #[test]
            fn $name() {
                let mut app = app();
                app.panel = $panel;
                insta::assert_snapshot!(
                    concat!(stringify!($name), "_80x24"),
                    screen(&mut app, 80, 24)
                );
                insta::assert_snapshot!(
                    concat!(stringify!($name), "_160x48"),
                    screen(&mut app, 160, 48)
                );
            }
        )*
    };
}

panel_screens! {
    overview: Panel::Overview,
    timeline: Panel::Timeline,
    segments: Panel::Segments,
    call_sites: Panel::Sites,
    findings: Panel::Findings,
    events: Panel::Events,
    memory: Panel::Memory,
}

/// A planted training program (`vramscope_testkit::planted`) marked as `attach()` marks it,
/// dumped in its third forward after two of four layers.
fn planted_mid_forward() -> App {
    use vramscope_testkit::planted::cases::{Program, Shape};
    use vramscope_testkit::planted::StackMode;
    let mut p = Program::new(StackMode::All, Shape::default()).with_marks();
    p.load_model();
    p.train_step(1);
    p.train_step(1);
    p.zero_grad();
    p.load_batch();
    p.forward_interrupted(2);
    let data = Dataset::new(
        p.finish("mid_forward").snapshot,
        Origin::File("train.pickle".into()),
    );
    let mut app = App::new(data);
    app.theme = Theme::plain();
    app.now_unix_ns = fixture::EPOCH_UNIX_NS;
    app.cursor = Some(app.data.len());
    app.panel = Panel::Memory;
    app
}

#[test]
fn the_memory_panel_shows_the_categories_and_the_models_tree() {
    let mut app = planted_mid_forward();
    let wide = screen(&mut app, 160, 48);
    insta::assert_snapshot!("memory_planted_160x48", wide);
    // The bar and its legend: parameters, optimizer state and the two layers' activations.
    for needed in [
        "activations 32.0 MiB",
        "parameters 64.1 MiB",
        "optimizer state 128 MiB",
        "Model.layers.0",
        "Model.layers.1",
        "train.py:44 train",
    ] {
        assert!(wide.contains(needed), "{needed} in\n{wide}");
    }
    assert!(
        !wide.contains("Model.layers.2"),
        "the forward stopped at layer 2"
    );
    insta::assert_snapshot!("memory_planted_80x24", screen(&mut app, 80, 24));
    // Enter folds the selected node (the largest of the root's children) and opens it again.
    let rows = app.view().memory.len();
    assert!(!app.view().memory[0].folded);
    app.handle_key(KeyEvent::from(KeyCode::Enter));
    assert!(app.view().memory[0].folded);
    assert!(app.view().memory.len() < rows);
    app.handle_key(KeyEvent::from(KeyCode::Enter));
    assert_eq!(app.view().memory.len(), rows);
    app.handle_key(KeyEvent::from(KeyCode::Char('7')));
    assert_eq!(app.panel, Panel::Memory);
}

#[test]
fn call_site_detail_and_tree() {
    let mut app = app();
    app.panel = Panel::Sites;
    app.prepare();
    // The leaking loss is the third largest holder.
    app.sites.selected = 2;
    app.sites.detail = true;
    insta::assert_snapshot!("call_site_detail_80x24", screen(&mut app, 80, 24));
    app.sites.all_frames = true;
    insta::assert_snapshot!(
        "call_site_detail_all_frames_160x48",
        screen(&mut app, 160, 48)
    );
    app.sites.all_frames = false;
    app.sites.detail = false;
    app.sites.tree = true;
    app.sites.hide_framework = false;
    insta::assert_snapshot!("call_site_tree_80x24", screen(&mut app, 80, 24));
    app.sites.hide_framework = true;
    insta::assert_snapshot!(
        "call_site_tree_no_framework_80x24",
        screen(&mut app, 80, 24)
    );
}

/// The fixture's run with PyTorch's stacks (`fixture::pytorch_stacks_snapshot`), the call-site
/// panel open on the detail view of the loss kept every step: `model.py:31` under 26 C++ and
/// torch frames, called from `train.py:57`.
fn pytorch_stack_view() -> App {
    let data = Dataset::new(
        fixture::pytorch_stacks_snapshot(),
        Origin::File("run.json".into()),
    );
    let mut app = App::new(data);
    app.theme = Theme::plain();
    app.now_unix_ns = fixture::EPOCH_UNIX_NS;
    app.cursor = Some(app.data.len());
    app.analyze_now();
    app.handle_key(KeyEvent::from(KeyCode::Char('4')));
    app.prepare();
    let groups = app.data.groups();
    let row = app
        .view()
        .sites
        .iter()
        .position(|r| groups.get(r.group).label() == "model.py:31")
        .expect("the loss's site is a row");
    app.sites.selected = row;
    app.handle_key(KeyEvent::from(KeyCode::Enter));
    assert!(app.sites.detail);
    app
}

/// Issue 32, item 8: the stack view opens on the user's frames, each run of framework frames
/// (PyTorch's ~30 C++ frames, torch's module calls) folded into one line; `f` shows every
/// frame and folds them again; the help bar and the overlay say so.
#[test]
fn the_stack_view_opens_on_the_users_frames() {
    let mut app = pytorch_stack_view();
    let s = screen(&mut app, 80, 24);
    for user in ["model.py:31  forward", "train.py:57  train"] {
        assert!(s.contains(user), "{user} is on screen at 80x24:\n{s}");
    }
    assert!(s.contains("… 26 framework frames (f shows them)"), "{s}");
    assert!(s.contains("… 2 framework frames (f shows them)"), "{s}");
    assert!(!s.contains("torch::unwind::unwind()"), "{s}");
    assert!(s.lines().last().unwrap().contains("f all frames"), "{s}");
    insta::assert_snapshot!("stack_view_pytorch_80x24", s);
    let wide = screen(&mut app, 200, 60);
    assert!(wide.contains("train.py:57  train"), "{wide}");
    assert!(
        wide.contains("… 13 framework frames (f shows them)"),
        "{wide}"
    );

    app.handle_key(KeyEvent::from(KeyCode::Char('f')));
    assert!(app.sites.all_frames && app.sites.detail);
    let s = screen(&mut app, 80, 24);
    for native in [
        "??:0  torch::unwind::unwind()",
        "??:0  torch::CapturedTraceback::gather",
        "??:0  c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator",
    ] {
        assert!(s.contains(native), "{native} shown after f:\n{s}");
    }
    assert!(s.contains("more frames"), "the cut is said:\n{s}");
    assert!(!s.contains("framework frames (f shows them)"), "{s}");
    assert!(s.lines().last().unwrap().contains("f fold frames"), "{s}");
    insta::assert_snapshot!("stack_view_pytorch_all_frames_80x24", s);
    // At 200x60 the frames down to the user's fit, in the stack's own order.
    let wide = screen(&mut app, 200, 60);
    let at = |what: &str| wide.find(what).unwrap_or_else(|| panic!("{what}:\n{wide}"));
    // (The frames' own lines, not the header's `model.py:31  forward`.)
    assert!(at("│  ??:0  torch::unwind::unwind()") < at("nn/modules/linear.py:116"));
    assert!(at("nn/modules/linear.py:116") < at("│  model.py:31  forward"));
    assert!(at("│  model.py:31  forward") < at("│  train.py:57  train"));
    assert!(at("│  train.py:57  train") < at("more frames"));

    app.handle_key(KeyEvent::from(KeyCode::Char('f')));
    assert!(!app.sites.all_frames);
    assert!(screen(&mut app, 80, 24).contains("… 26 framework frames"));
    // `f` in the stack view leaves the tree's own choice alone.
    assert!(!app.sites.hide_framework);

    app.handle_key(KeyEvent::from(KeyCode::Char('?')));
    let help = screen(&mut app, 80, 24);
    assert!(
        help.contains("show / fold framework frames"),
        "the overlay lists f:\n{help}"
    );
}

#[test]
fn help_overlay_and_filter_bar() {
    let mut app = app();
    app.help = true;
    insta::assert_snapshot!("help_overlay_80x24", screen(&mut app, 80, 24));
    app.help = false;
    app.panel = Panel::Events;
    app.input = Some(vramscope_tui::app::Input {
        target: Panel::Events,
        text: "sync".to_string(),
    });
    let s = screen(&mut app, 80, 24);
    assert!(
        s.lines()
            .last()
            .unwrap()
            .contains("/ sync▏  Enter apply · Esc cancel"),
        "{s}"
    );
}

#[test]
fn the_time_cursor_shows_the_past_in_every_panel() {
    let mut app = app();
    // The start of step 3.
    let (_, at) = app.data.step_starts()[2];
    app.cursor = Some(at);
    app.analyze_now();
    let overview = screen(&mut app, 80, 24);
    assert!(overview.contains(&format!("event {at}/")), "{overview}");
    insta::assert_snapshot!("cursor_at_step_3_overview_80x24", overview);
    app.panel = Panel::Segments;
    insta::assert_snapshot!("cursor_at_step_3_segments_80x24", screen(&mut app, 80, 24));
    app.panel = Panel::Events;
    insta::assert_snapshot!("cursor_at_step_3_events_80x24", screen(&mut app, 80, 24));
}

#[test]
fn a_lost_connection_says_since_when() {
    let mut app = app();
    app.data.link_state = Link::Down {
        since_unix_ns: fixture::EPOCH_UNIX_NS - 42_000_000_000,
        reason: "the program ended".to_string(),
    };
    let s = screen(&mut app, 120, 30);
    assert!(
        s.lines()
            .next()
            .unwrap()
            .contains("disconnected since 22:12:38 (42s ago), retrying: the program ended"),
        "{s}"
    );
    // A reason from a hostile publisher is shown escaped, and cut to a third of the row.
    app.data.link_state = Link::Down {
        since_unix_ns: fixture::EPOCH_UNIX_NS - 42_000_000_000,
        reason: format!("refused: \u{1b}]52;c;b3duZWQ=\u{7}{}", "x".repeat(500)),
    };
    let s = screen(&mut app, 120, 30);
    let header = s.lines().next().unwrap();
    assert!(header.contains("retrying: refused: \\u{1b}]52;c;"), "{s}");
    assert!(header.contains("b3…"), "cut where the row ends: {s}");
    assert!(!s.contains('\u{1b}'), "{s}");
}

#[test]
fn no_color_means_no_colour_anywhere() {
    let mut app = app();
    for panel in Panel::ALL {
        app.panel = panel;
        let buf = draw(&mut app, 160, 48);
        for cell in buf.content() {
            assert_eq!(cell.fg, Color::Reset, "{panel:?}: {cell:?}");
            assert_eq!(cell.bg, Color::Reset, "{panel:?}: {cell:?}");
        }
    }
    app.theme = Theme::colored();
    app.panel = Panel::Overview;
    let buf = draw(&mut app, 80, 24);
    assert!(
        buf.content().iter().any(|c| c.fg == Color::Green),
        "colours when allowed"
    );
}

#[test]
fn tiny_and_odd_terminal_sizes_do_not_panic() {
    let mut app = app();
    for panel in Panel::ALL {
        app.panel = panel;
        for (w, h) in [(1, 1), (10, 5), (20, 8), (79, 23), (300, 100), (40, 60)] {
            draw(&mut app, w, h);
        }
    }
    app.help = true;
    draw(&mut app, 12, 4);
}

#[test]
fn an_empty_dataset_draws() {
    let empty = vramscope_model::Snapshot::empty(
        vramscope_model::SnapshotSource::Vramscope,
        Default::default(),
    );
    let mut app = App::new(Dataset::new(empty, Origin::Live("tcp:127.0.0.1:1".into())));
    app.theme = Theme::plain();
    app.now_unix_ns = fixture::EPOCH_UNIX_NS;
    app.data.link_state = Link::Connecting;
    for panel in Panel::ALL {
        app.panel = panel;
        let s = screen(&mut app, 80, 24);
        assert!(s.contains("connecting…"), "{s}");
    }
}

/// The sizes of the screen tests.
const SIZES: [(u16, u16); 3] = [(80, 24), (120, 40), (200, 60)];

/// A file opened as `view` opens it: at the peak of allocated bytes.
fn file_at_peak() -> App {
    let mut app = app();
    app.cursor = Some(app.data.peak_allocated_pos());
    app.analyze_now();
    app
}

#[test]
fn a_file_opens_at_the_peak_and_says_so() {
    let mut app = file_at_peak();
    let peak = app.data.peak_allocated_pos();
    assert!(peak < app.data.len(), "the fixture peaks before its end");
    // The report's peak event: the cursor stands just after it.
    let snapshot = fixture::training_snapshot();
    let view = vramscope_analysis::model_view::ModelView::new(&snapshot);
    assert_eq!(
        Some(peak),
        view.peak_allocated_event().map(|e| e as usize + 1)
    );
    assert_eq!(
        app.data.usage_at(peak).allocated,
        app.data.peak_at(app.data.len()).allocated
    );
    for (w, h) in SIZES {
        let s = screen(&mut app, w, h);
        let first = s.lines().next().unwrap();
        assert!(first.contains(&format!("event {peak}/384 at peak")), "{s}");
        assert!(
            first.contains("cap 16.0 GiB"),
            "the header keeps its words: {s}"
        );
        assert!(
            s.contains("At cursor"),
            "the sites say where they count: {s}"
        );
        assert!(
            s.contains("Findings at the cursor"),
            "so do the findings: {s}"
        );
        assert!(s.lines().last().unwrap().contains("P peak"), "{s}");
        insta::assert_snapshot!(format!("file_at_peak_{w}x{h}"), s);
    }
    // Away from the peak and back with P; R goes to the peak of reserved bytes.
    app.cursor = Some(0);
    app.handle_key(ratatui::crossterm::event::KeyEvent::new(
        ratatui::crossterm::event::KeyCode::Char('P'),
        ratatui::crossterm::event::KeyModifiers::SHIFT,
    ));
    assert_eq!(app.pos(), peak);
    app.handle_key(ratatui::crossterm::event::KeyEvent::new(
        ratatui::crossterm::event::KeyCode::Char('R'),
        ratatui::crossterm::event::KeyModifiers::SHIFT,
    ));
    assert_eq!(app.pos(), app.data.peak_reserved_pos());
    assert_eq!(
        app.data.usage_at(app.pos()).reserved,
        app.data.peak_at(app.data.len()).reserved
    );
}

#[test]
fn the_demo_after_ten_steps() {
    let data = Dataset::new(
        fixture::training_snapshot_with(10),
        Origin::InProcess("demo".into()),
    );
    let mut app = App::new(data);
    app.theme = Theme::plain();
    app.now_unix_ns = fixture::EPOCH_UNIX_NS;
    app.intro = Some(
        "training an MLP with a retained loss and .item() in a loop planted: see Findings (5)"
            .to_string(),
    );
    app.analyze_now();
    for (w, h) in SIZES {
        let s = screen(&mut app, w, h);
        assert!(s.lines().next().unwrap().contains("LIVE"), "{s}");
        let bar = s.lines().last().unwrap();
        assert!(bar.starts_with(" ? help q quit │ training an MLP"), "{s}");
        assert!(
            s.contains("At end"),
            "following: the sites count at the end: {s}"
        );
        insta::assert_snapshot!(format!("demo_after_10_steps_{w}x{h}"), s);
    }
    // The first key puts the keys back.
    app.handle_key(ratatui::crossterm::event::KeyEvent::new(
        ratatui::crossterm::event::KeyCode::Char('2'),
        ratatui::crossterm::event::KeyModifiers::NONE,
    ));
    let s = screen(&mut app, 80, 24);
    assert!(s.lines().last().unwrap().contains("P peak"), "{s}");
}

#[test]
fn the_findings_detail_puts_the_fix_first() {
    let mut app = app();
    app.panel = Panel::Findings;
    for (w, h) in SIZES {
        let s = screen(&mut app, w, h);
        let fix = s.find("fix: ").expect("a fix line");
        let evidence = s.find("evidence: ").unwrap_or(usize::MAX);
        assert!(fix < evidence, "fix before evidence: {s}");
        // Every error and warning is on the first screen, one line each.
        let serious = app
            .analysis
            .as_ref()
            .unwrap()
            .findings
            .iter()
            .filter(|f| f.severity != vramscope_analysis::detect::Severity::Info)
            .count();
        let list = &s[..s.find("│───").expect("the list ends")];
        let listed = list
            .lines()
            .filter(|l| l.starts_with("│ERROR") || l.starts_with("│WARN"))
            .count();
        assert_eq!(listed, serious, "{s}");
        insta::assert_snapshot!(format!("findings_detail_{w}x{h}"), s);
    }
}

#[test]
fn segment_addresses_are_hex_with_a_pool_legend() {
    let mut app = app();
    app.panel = Panel::Segments;
    for (w, h) in [(80, 24), (200, 60)] {
        let s = screen(&mut app, w, h);
        assert!(s.contains("s/L small/large pool"), "{s}");
        let rows: Vec<&str> = s
            .lines()
            .filter(|l| l.contains("MiB L") || l.contains("MiB s"))
            .collect();
        assert!(!rows.is_empty(), "{s}");
        for row in &rows {
            assert!(
                row.trim_start_matches('│').trim_start().starts_with("0x"),
                "{row}"
            );
        }
    }
}

#[test]
fn step_labels_never_garble_at_any_width() {
    let data = Dataset::new(
        fixture::training_snapshot_with(240),
        Origin::File("long.json".into()),
    );
    let mut app = App::new(data);
    app.theme = Theme::plain();
    app.panel = Panel::Timeline;
    app.cursor = Some(app.data.len());
    for w in [40u16, 80, 97, 120, 200] {
        let s = screen(&mut app, w, 24);
        let row = s
            .lines()
            .find(|l| l.contains("     step "))
            .expect("a step row")
            .to_string();
        // Every label is a whole step number that starts a step: after a mark, and a
        // multiple of one interval.
        let labels: Vec<u64> = row
            .split(['╵', ' ', '│', '▲'])
            .filter_map(|t| t.parse().ok())
            .collect();
        assert!(labels.len() >= 2, "{w}: {row}");
        let every = labels[1] - labels[0];
        for pair in labels.windows(2) {
            assert_eq!(pair[1] - pair[0], every, "{w}: {row}");
        }
        assert!(labels.iter().all(|l| (1..=240).contains(l)), "{w}: {row}");
    }
}

/// A trace that allocated over blocks it had not freed lost those frees: the header says how
/// many, with the count the report gives, and a whole trace's header does not mention it.
#[test]
fn the_header_counts_the_frees_a_trace_lost() {
    let mut snapshot = fixture::training_snapshot();
    assert!(fixture::lose_frees(&mut snapshot, 2) > 0);
    let report = vramscope_analysis::report::build_report(&snapshot, &Default::default());
    assert!(report.stats.lost_frees > 0);
    let mut app = App::new(Dataset::new(snapshot, Origin::File("run.json".into())));
    app.theme = Theme::plain();
    assert_eq!(app.data.lost_frees(), report.stats.lost_frees);
    let s = screen(&mut app, 160, 48);
    assert!(
        s.contains(&format!("lost frees {}", report.stats.lost_frees)),
        "{s}"
    );
    assert!(!screen(&mut self::app(), 160, 48).contains("lost frees"));
}

/// The help overlay fits 80×24 and 120×40 with every description whole: no word is cut at
/// the popup's edge (issue 42, item 12).
#[test]
fn the_help_overlay_fits_without_cut_words() {
    let mut app = app();
    app.help = true;
    for (w, h) in [(80, 24), (120, 40)] {
        let s = screen(&mut app, w, h);
        for (key, what) in ui::help::ALL_KEYS {
            assert!(
                s.lines().any(|l| l.contains(what)),
                "{w}x{h}: {key}'s description is whole on one line: {what}\n{s}"
            );
        }
        assert!(
            s.contains("Memory states:"),
            "{w}x{h}: the legend fits\n{s}"
        );
        if (w, h) == (120, 40) {
            insta::assert_snapshot!("help_overlay_120x40", s);
        }
    }
}

/// Enter on a sync finding opens the event log on its waits (the copies and syncs at its
/// site), not the call-site detail of a site that holds no memory (issue 42, item 12).
#[test]
fn enter_on_a_sync_finding_shows_its_waits() {
    use vramscope_analysis::detect::FindingKind;
    use vramscope_model::EventKind;
    let mut app = app();
    app.panel = Panel::Findings;
    app.prepare();
    let analysis = app.analysis.clone().unwrap();
    let row = app
        .view()
        .findings
        .iter()
        .position(|&i| analysis.findings[i].kind == FindingKind::SyncInLoop)
        .expect("the fixture has a sync finding");
    let site = analysis.findings[app.view().findings[row]]
        .site
        .clone()
        .expect("a site");
    app.findings.selected = row;
    app.handle_key(KeyEvent::from(KeyCode::Enter));
    app.prepare();
    assert_eq!(app.panel, Panel::Events);
    assert_eq!(app.events.filter, site);
    let rows = app.view().events.clone();
    assert!(!rows.is_empty(), "the waits at {site} are listed");
    for i in rows {
        let e = app.data.snapshot().events[i as usize];
        assert!(
            matches!(e.kind, EventKind::Sync | EventKind::Transfer(_)),
            "event {i} is a wait or a copy: {:?}",
            e.kind
        );
    }
    let s = screen(&mut app, 80, 24);
    assert!(s.contains(&site), "{s}");
}

/// A file that runs out of memory after its peak, through `view_app` as `vramscope view` opens
/// it.
fn oom_after_peak_file() -> std::path::PathBuf {
    use vramscope_testkit::{Trace, MIB};
    let mut t = Trace::new().capacity(256 * MIB);
    let weights = t.site("train.py", 10, "setup");
    let batch = t.site("train.py", 20, "step");
    let big = t.site("models.py", 181, "forward");
    t.alloc(weights, 64 * MIB);
    // The peak: a large batch, freed.
    let a = t.alloc(batch, 128 * MIB);
    t.free(a, 128 * MIB);
    for _ in 0..20 {
        let b = t.alloc(batch, 8 * MIB);
        t.free(b, 8 * MIB);
    }
    // Later, below the peak, an allocation that cannot fit fails.
    t.oom(big, 512 * MIB, 192 * MIB);
    // A name of its own in a folder of this process's, so that the header shows the same name
    // on every run.
    let dir = std::env::temp_dir().join(format!("vramscope-tui-oom-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("oom.json");
    t.finish().save(&path).unwrap();
    path
}

/// A file whose OOM happens after its peak opens at the OOM, so that its first screen shows
/// the OOM and its error, not "OOMs 0" and no errors; a clean file still opens at its peak
/// (issue 42, item 12).
#[test]
fn a_file_opens_where_its_worst_finding_is() {
    let path = oom_after_peak_file();
    let mut app =
        vramscope_tui::view_app(&path, &vramscope_import::ImportOptions::default()).unwrap();
    std::fs::remove_dir_all(path.parent().unwrap()).ok();
    app.theme = Theme::plain();
    app.now_unix_ns = fixture::EPOCH_UNIX_NS;
    let oom = app.data.ooms()[0];
    assert!(
        oom + 1 > app.data.peak_allocated_pos(),
        "the OOM comes after the peak"
    );
    assert_eq!(
        app.cursor,
        Some(oom + 1),
        "the dashboard opens just after the OOM"
    );
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("OOMs 1"), "{s}");
    assert!(
        s.contains("ERROR"),
        "the OOM's error is on the first screen: {s}"
    );
    assert!(
        s.contains("at the first OOM"),
        "it says why it opened there: {s}"
    );
    insta::assert_snapshot!("file_with_a_late_oom_80x24", s);
    // Moved to the peak, the header still counts the file's OOM beside the cursor's, and the
    // findings panel the file's error.
    app.handle_key(KeyEvent::from(KeyCode::Char('P')));
    app.analyze_now();
    let s = screen(&mut app, 80, 24);
    assert!(s.contains("OOMs 0 of 1"), "{s}");
    assert!(s.contains("file: 1 errors"), "{s}");
}

/// A 3-GPU dump whose cuda:1 ran out of memory opens at cuda:1, at its OOM.
#[test]
fn a_multi_device_file_opens_at_its_worst_device() {
    let path = std::env::temp_dir().join(format!("vramscope-tui-3gpu-{}.json", std::process::id()));
    vramscope_testkit::three_devices_oom_on_1()
        .save(&path)
        .unwrap();
    let app = vramscope_tui::view_app(&path, &vramscope_import::ImportOptions::default()).unwrap();
    std::fs::remove_file(&path).ok();
    let switch = app.devices.as_ref().expect("several devices");
    assert_eq!(switch.devices[switch.current], 1, "the device with the OOM");
    assert_eq!(app.data.ooms().len(), 1);
    assert_eq!(app.cursor, Some(app.data.ooms()[0] + 1));
}

/// An empty dump is refused in the words `report` says, not opened as an empty dashboard.
#[test]
fn an_empty_dump_is_said_not_shown() {
    use vramscope_model::{DeviceInfo, Snapshot, SnapshotSource};
    let path =
        std::env::temp_dir().join(format!("vramscope-tui-empty-{}.json", std::process::id()));
    let empty = Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default());
    empty.save(&path).unwrap();
    let result = vramscope_tui::view_app(&path, &vramscope_import::ImportOptions::default());
    std::fs::remove_file(&path).ok();
    let error = result
        .err()
        .expect("an empty dump does not open")
        .to_string();
    let words = vramscope_analysis::report::nothing_to_analyse(&empty, &path.display().to_string())
        .unwrap();
    assert_eq!(error, words);
}

/// The nodes the memory panel opens by default are the ones its rows show: at every size, the
/// legend packed into one, two or more rows, the open tree fits the rows left below the bar
/// (the panel's own geometry, which the drawing uses), so no row opened by default is hidden.
#[test]
fn the_memory_trees_default_opening_fits_the_panels_rows() {
    use vramscope_tui::ui::layout;
    use vramscope_tui::ui::memory::{CategoryBar, MemoryGeometry};
    let mut app = planted_mid_forward();
    let mut legends = std::collections::BTreeSet::new();
    for width in [40u16, 52, 60, 70, 80, 100, 120, 160] {
        for height in [14u16, 18, 20, 24, 30, 48] {
            let shown = screen(&mut app, width, height);
            let area = layout(Rect::new(0, 0, width, height), Panel::Memory).body;
            let bar = CategoryBar {
                bytes: &app.view().categories,
                theme: app.theme,
            };
            legends.insert(bar.legend_rows(area.width.saturating_sub(2)));
            let rows = MemoryGeometry::of(area, &bar).tree_list_rows();
            let memory = &app.view().memory;
            if rows == 0 {
                continue;
            }
            assert!(
                memory.len() <= rows.max(memory.iter().filter(|r| r.depth == 0).count()),
                "{width}x{height}: {} rows opened for {rows} on the screen\n{shown}",
                memory.len()
            );
        }
    }
    assert!(
        legends.len() >= 2,
        "the sizes pack the legend into different numbers of rows: {legends:?}"
    );
}

/// The memory panel's bar is the report's: at the peak of a planted training run, its
/// categories are the model view's at the peak, byte for byte, and add up to the header's
/// allocated figure.
#[test]
fn the_memory_panel_at_the_peak_is_the_reports() {
    use vramscope_analysis::model_view::ModelView;
    use vramscope_testkit::planted::{cases, StackMode};
    for case in [
        cases::adamw_training(StackMode::All, 3),
        cases::late_recording(StackMode::Python, 2, 2),
    ] {
        let view = ModelView::new(&case.snapshot);
        let expected = *view.categories_at_peak();
        let mut app = App::new(Dataset::new(
            case.snapshot.clone(),
            Origin::File("train.pickle".into()),
        ));
        app.theme = Theme::plain();
        app.panel = Panel::Memory;
        app.cursor = Some(app.data.peak_allocated_pos());
        app.area = Rect::new(0, 0, 120, 40);
        app.prepare();
        assert_eq!(app.view().categories, expected, "{}", case.name);
        assert_eq!(
            app.view().categories.total(),
            app.data.usage_at(app.pos()).allocated,
            "{}",
            case.name
        );
    }
}
