//! Key and mouse handling of the dashboard (`vramscope_tui::app::App::handle_key` and
//! `handle_mouse`), and the context help bar, on the fixed data of `vramscope_tui::fixture`.

use ratatui::crossterm::event::{
    KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};
use ratatui::layout::Rect;
use vramscope_testkit::fixture;
use vramscope_tui::app::{App, KindFilter, Panel, SiteSort};
use vramscope_tui::data::{Dataset, Origin};
use vramscope_tui::ui::{self, help::keys_for, Theme};

fn fresh() -> App {
    let data = Dataset::new(
        fixture::training_snapshot(),
        Origin::File("run.json".into()),
    );
    let mut app = App::new(data);
    app.theme = Theme::plain();
    app.now_unix_ns = fixture::EPOCH_UNIX_NS;
    app.cursor = Some(app.data.len());
    app.area = Rect::new(0, 0, 80, 24);
    app.analyze_now();
    app.prepare();
    app
}

fn key(app: &mut App, code: KeyCode) {
    app.handle_key(KeyEvent::new(code, KeyModifiers::NONE));
    app.prepare();
}

fn chars(app: &mut App, text: &str) {
    for c in text.chars() {
        key(app, KeyCode::Char(c));
    }
}

#[test]
fn tab_and_digits_choose_panels() {
    let mut app = fresh();
    assert_eq!(app.panel, Panel::Overview);
    for expected in Panel::ALL.iter().cycle().skip(1).take(Panel::ALL.len() + 1) {
        key(&mut app, KeyCode::Tab);
        assert_eq!(app.panel, *expected);
    }
    key(&mut app, KeyCode::BackTab);
    assert_eq!(app.panel, Panel::Overview);
    for (i, p) in Panel::ALL.iter().enumerate() {
        key(&mut app, KeyCode::Char(char::from(b'1' + i as u8)));
        assert_eq!(app.panel, *p);
    }
}

#[test]
fn q_esc_and_ctrl_c_quit_but_esc_closes_things_first() {
    let mut app = fresh();
    key(&mut app, KeyCode::Char('q'));
    assert!(app.quit);

    let mut app = fresh();
    key(&mut app, KeyCode::Char('?'));
    assert!(app.help);
    key(&mut app, KeyCode::Esc);
    assert!(!app.help && !app.quit, "Esc closes the help");

    key(&mut app, KeyCode::Char('4'));
    key(&mut app, KeyCode::Enter);
    assert!(app.sites.detail);
    key(&mut app, KeyCode::Esc);
    assert!(!app.sites.detail && !app.quit, "Esc closes the detail view");

    app.sites.filter = "train".to_string();
    key(&mut app, KeyCode::Esc);
    assert!(
        app.sites.filter.is_empty() && !app.quit,
        "Esc clears the filter"
    );
    key(&mut app, KeyCode::Esc);
    assert!(app.quit, "then Esc quits");

    let mut app = fresh();
    key(&mut app, KeyCode::Char('/'));
    assert!(app.input.is_some());
    app.handle_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
    assert!(app.quit, "Ctrl-C quits even while typing");
}

#[test]
fn slash_filters_call_sites_and_events() {
    let mut app = fresh();
    key(&mut app, KeyCode::Char('4'));
    let all = app.view().sites.len();
    key(&mut app, KeyCode::Char('/'));
    chars(&mut app, "data.py");
    assert_eq!(app.view().sites.len(), 1, "filters as you type");
    key(&mut app, KeyCode::Enter);
    assert!(app.input.is_none());
    assert_eq!(app.sites.filter, "data.py");
    key(&mut app, KeyCode::Char('/'));
    key(&mut app, KeyCode::Backspace);
    key(&mut app, KeyCode::Esc);
    assert_eq!(app.view().sites.len(), 1, "Esc leaves the applied filter");
    key(&mut app, KeyCode::Esc);
    assert_eq!(app.view().sites.len(), all);

    // In panels without a filter of their own, `/` filters the event log.
    key(&mut app, KeyCode::Char('2'));
    key(&mut app, KeyCode::Char('/'));
    assert_eq!(app.panel, Panel::Events);
    chars(&mut app, "transfer_d2h");
    key(&mut app, KeyCode::Enter);
    let events = app.data.events().to_vec();
    assert!(!app.view().events.is_empty());
    assert!(app
        .view()
        .events
        .iter()
        .all(|&i| events[i as usize].kind.name() == "transfer_d2h"));
    // `e` cycles the kind filter.
    key(&mut app, KeyCode::Esc);
    key(&mut app, KeyCode::Char('e'));
    assert_eq!(app.events.kind, KindFilter::Blocks);
    assert!(app.view().events.iter().all(|&i| {
        let name = events[i as usize].kind.name();
        name.contains("alloc") || name.contains("free")
    }));
}

#[test]
fn the_time_cursor_moves_by_step_event_and_column() {
    let mut app = fresh();
    let n = app.data.len();
    let starts: Vec<usize> = app.data.step_starts().iter().map(|s| s.1).collect();
    key(&mut app, KeyCode::Home);
    assert_eq!(app.pos(), 0);
    key(&mut app, KeyCode::Char(']'));
    assert_eq!(app.pos(), starts[0]);
    key(&mut app, KeyCode::Char(']'));
    assert_eq!(app.pos(), starts[1]);
    key(&mut app, KeyCode::Char('['));
    assert_eq!(app.pos(), starts[0]);
    key(&mut app, KeyCode::Char('.'));
    assert_eq!(app.pos(), starts[0] + 1);
    key(&mut app, KeyCode::Char(','));
    assert_eq!(app.pos(), starts[0]);
    key(&mut app, KeyCode::Right);
    assert!(app.pos() > starts[0], "a column to the right");
    key(&mut app, KeyCode::Char('L'));
    let far = app.pos();
    key(&mut app, KeyCode::Char('H'));
    assert!(app.pos() < far);
    key(&mut app, KeyCode::End);
    assert_eq!(app.pos(), n);
    // Outside the timeline, left and right move by steps.
    key(&mut app, KeyCode::Char('3'));
    key(&mut app, KeyCode::Left);
    assert_eq!(app.pos(), *starts.last().unwrap());
    // The state follows the cursor.
    let at_start = app.data.usage_at(starts[0]);
    key(&mut app, KeyCode::Home);
    key(&mut app, KeyCode::Char(']'));
    assert_eq!(app.state_for_draw().usage(), at_start);
}

#[test]
fn zoom_narrows_the_window_around_the_cursor() {
    let mut app = fresh();
    let n = app.data.len();
    assert_eq!(app.window(60), (0, n));
    key(&mut app, KeyCode::Char('2'));
    app.cursor = Some(n / 2);
    key(&mut app, KeyCode::Char('+'));
    let (a, b) = app.window(60);
    assert_eq!(b - a, n / 2);
    assert!(a <= n / 2 && n / 2 <= b);
    for _ in 0..40 {
        key(&mut app, KeyCode::Char('+'));
    }
    let (a, b) = app.window(60);
    assert!(b - a >= 16, "zoom stops at a useful width");
    for _ in 0..40 {
        key(&mut app, KeyCode::Char('-'));
    }
    assert_eq!(app.window(60), (0, n));
}

#[test]
fn sort_tree_and_framework_keys_change_the_call_site_panel() {
    let mut app = fresh();
    key(&mut app, KeyCode::Char('4'));
    assert_eq!(app.sites.sort, SiteSort::Bytes);
    let bytes: Vec<u64> = app.view().sites.iter().map(|r| r.bytes).collect();
    assert!(bytes.windows(2).all(|w| w[0] >= w[1]));
    key(&mut app, KeyCode::Char('o'));
    key(&mut app, KeyCode::Char('o'));
    assert_eq!(app.sites.sort, SiteSort::Growth);
    let top = &app.view().sites[0];
    assert_eq!(
        app.data.groups().get(top.group).label(),
        "train.py:77",
        "the leak grows fastest"
    );
    key(&mut app, KeyCode::Char('t'));
    assert!(app.sites.tree && !app.view().tree.is_empty());
    let with = app.view().tree.len();
    key(&mut app, KeyCode::Char('f'));
    assert!(app.view().tree.len() < with, "framework frames hidden");
    assert!(app.view().tree.iter().all(|r| !r.framework));
    key(&mut app, KeyCode::Down);
    assert_eq!(app.sites.selected, 1);
}

#[test]
fn enter_folds_and_unfolds_a_frame_of_the_stack_tree() {
    let mut app = fresh();
    key(&mut app, KeyCode::Char('4'));
    key(&mut app, KeyCode::Char('t'));
    let open = app.view().tree.clone();
    let parent = open
        .iter()
        .position(|r| r.has_children)
        .expect("a frame with frames below it");
    let below = open[parent + 1..]
        .iter()
        .take_while(|r| r.depth > open[parent].depth)
        .count();
    assert!(below > 0);
    // Enter on a frame without frames below it changes nothing.
    app.sites.selected = open
        .iter()
        .position(|r| !r.has_children)
        .expect("a leaf frame");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.view().tree, open);
    app.sites.selected = parent;
    // Straight through `handle_key`, as a batch of keys arrives between two frames: the
    // tree is rebuilt at once, so the next key of the batch sees the rows as they now are.
    app.handle_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::NONE));
    let folded = app.view().tree.clone();
    assert_eq!(
        folded.len(),
        open.len() - below,
        "the frames below are hidden"
    );
    assert!(folded[parent].collapsed && folded[parent].has_children);
    assert_eq!(
        folded[parent].bytes, open[parent].bytes,
        "a folded frame keeps its bytes"
    );
    assert_eq!(keys_for(&app)[4], ("Enter", "fold"));
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.view().tree, open, "unfolded again");
}

#[test]
fn enter_on_a_finding_opens_its_site_and_on_an_event_moves_the_cursor() {
    let mut app = fresh();
    key(&mut app, KeyCode::Char('5'));
    // The first finding is the leak; the detector names its site.
    let first = {
        let analysis = app.analysis.as_ref().expect("analysed");
        &analysis.findings[app.view().findings[0]]
    };
    assert_eq!(first.kind.as_str(), "retained_per_step");
    let site = first.site.clone().expect("the leak has a site");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.panel, Panel::Sites);
    assert!(app.sites.detail);
    assert_eq!(app.sites.filter, site, "Enter opens the finding's site");

    key(&mut app, KeyCode::Char('6'));
    key(&mut app, KeyCode::Up);
    key(&mut app, KeyCode::Up);
    let selected = app.events.selected.expect("a selected event");
    key(&mut app, KeyCode::Enter);
    assert_eq!(app.pos(), selected + 1);
}

#[test]
fn s_saves_the_state_at_the_cursor() {
    let dir = std::env::temp_dir().join(format!("vramscope-tui-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut app = fresh();
    app.save_dir = dir.clone();
    let (_, at) = app.data.step_starts()[3];
    app.cursor = Some(at);
    key(&mut app, KeyCode::Char('s'));
    let status = app.status_text().expect("a status message").to_string();
    assert!(
        status.starts_with(&format!("saved {at} events")),
        "{status}"
    );
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let saved = vramscope_model::Snapshot::load(&file).unwrap();
    assert_eq!(saved.events.len(), at);
    let state = vramscope_engine::MemoryState::from_segments(&saved.segments);
    assert_eq!(state.usage(), app.data.usage_at(at));
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_mouse_picks_tabs_and_timeline_positions() {
    let mut app = fresh();
    let layout = ui::layout(app.area, app.panel);
    let click = |column, row| MouseEvent {
        kind: MouseEventKind::Down(MouseButton::Left),
        column,
        row,
        modifiers: KeyModifiers::NONE,
    };
    // The third tab.
    let x = (0..80)
        .find(|&x| ui::tab_at(layout.tabs, x) == Some(Panel::Segments))
        .unwrap();
    app.handle_mouse(click(x, layout.tabs.y));
    assert_eq!(app.panel, Panel::Segments);
    app.handle_mouse(MouseEvent {
        kind: MouseEventKind::ScrollDown,
        column: 10,
        row: 10,
        modifiers: KeyModifiers::NONE,
    });
    assert!(app.segment_scroll > 0);
    // Halfway along the timeline.
    key(&mut app, KeyCode::Char('2'));
    let layout = ui::layout(app.area, app.panel);
    let plot = ui::timeline::plot_area(layout.timeline.unwrap());
    app.handle_mouse(click(plot.x + plot.width / 2, plot.y + 1));
    let n = app.data.len();
    assert!(
        app.pos() > n / 3 && app.pos() < 2 * n / 3,
        "{} of {n}",
        app.pos()
    );
}

#[test]
fn the_help_bar_lists_the_keys_that_apply() {
    let mut app = fresh();
    let names = |app: &App| keys_for(app).iter().map(|(k, _)| *k).collect::<Vec<_>>();
    assert!(names(&app).contains(&"+-"));
    assert!(!names(&app).contains(&"p"), "no pause for a file");
    key(&mut app, KeyCode::Char('4'));
    let keys = names(&app);
    for k in ["Enter", "o", "t", "f", "/"] {
        assert!(keys.contains(&k), "{k} in {keys:?}");
    }
    key(&mut app, KeyCode::Enter);
    assert!(names(&app).contains(&"Esc"));
    key(&mut app, KeyCode::Char('6'));
    assert!(names(&app).contains(&"e"));
    // Everything the bar shows fits at 80 columns or is dropped whole, never cut.
    let mut terminal = ratatui::Terminal::new(ratatui::backend::TestBackend::new(80, 24)).unwrap();
    app.prepare();
    terminal.draw(|f| ui::draw(f, &app)).unwrap();
    let buf = terminal.backend().buffer();
    let bar: String = (0..80).map(|x| buf[(x, 23)].symbol()).collect();
    assert!(
        bar.trim_end().ends_with("filter") || bar.trim_end().ends_with("save"),
        "{bar}"
    );
}

#[test]
fn d_switches_between_the_devices_of_a_file() {
    use vramscope_testkit::{device_run, merge_devices};
    let (a, b) = (device_run(0, 64 << 20), device_run(1, 300 << 20));
    let both = merge_devices(&[a.clone(), b.clone()]);
    let path = std::env::temp_dir().join(format!(
        "vramscope-keys-devices-{}.json",
        std::process::id()
    ));
    both.save(&path).unwrap();

    let mut app =
        vramscope_tui::view_app(&path, &vramscope_import::ImportOptions::default()).unwrap();
    let _ = std::fs::remove_file(&path);
    let peak = |app: &App| app.data.usage_at(app.data.peak_allocated_pos()).allocated;
    // It opens at the first device, at its peak.
    assert_eq!(app.data.len(), a.events.len());
    assert_eq!(peak(&app), 96 << 20);
    assert_eq!(app.cursor, Some(app.data.peak_allocated_pos()));
    key(&mut app, KeyCode::Char('D'));
    assert_eq!(app.data.len(), b.events.len());
    assert_eq!(peak(&app), 450 << 20);
    assert!(app.status_text().is_some_and(|s| s.contains("cuda:1")));
    key(&mut app, KeyCode::Char('D'));
    assert_eq!(
        app.data.len(),
        a.events.len(),
        "D goes round to the first device"
    );
}
