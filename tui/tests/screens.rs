//! Screen tests of the dashboard: every panel drawn on the fixed data of
//! `vramscope_tui::fixture` into ratatui's `TestBackend`, at 80×24 and 160×48, compared with
//! the insta snapshots in `tests/snapshots`; plus the detail and tree views, the help overlay,
//! the help bar while typing a filter, the time cursor in the past, a lost connection, and
//! `NO_COLOR`.

use ratatui::backend::TestBackend;
use ratatui::buffer::Buffer;
use ratatui::layout::Rect;
use ratatui::style::Color;
use ratatui::Terminal;
use vramscope_tui::app::{App, Panel};
use vramscope_tui::data::{Dataset, Link, Origin};
use vramscope_tui::fixture;
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
    app.sites.hide_framework = true;
    insta::assert_snapshot!(
        "call_site_detail_no_framework_160x48",
        screen(&mut app, 160, 48)
    );
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
            .contains("disconnected since 22:12:38 (42s ago), retrying"),
        "{s}"
    );
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
    let empty = vramscope_allocator::Snapshot::empty(
        vramscope_allocator::SnapshotSource::Vramscope,
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
