//! Measures how long the dashboard takes to draw one frame at 200×60 with 100,000 live blocks:
//! for each panel, the first frame after the time cursor moved (state rebuilt, call sites
//! regrouped) and a redraw with nothing changed.
//!
//! `cargo run --release -p vramscope-tui --example draw_bench [BLOCKS]`

use std::time::Instant;

use ratatui::backend::TestBackend;
use ratatui::layout::Rect;
use ratatui::Terminal;
use vramscope_tui::app::{App, Panel};
use vramscope_tui::data::{Dataset, Origin};
use vramscope_tui::{fixture, ui};

fn main() {
    let blocks: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
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
        t.elapsed().as_secs_f64() * 1e3
    );
    let mut app = App::new(data);
    app.analyze_now();
    let (w, h) = (200, 60);
    app.area = Rect::new(0, 0, w, h);
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
            app.prepare();
            terminal.draw(|f| ui::draw(f, &app)).unwrap();
            moved.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            app.prepare();
            terminal.draw(|f| ui::draw(f, &app)).unwrap();
            still.push(t.elapsed().as_secs_f64() * 1e3);
        }
        let stats = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() / 2], v[v.len() - 1])
        };
        let (mm, mx) = stats(&mut moved);
        let (sm, sx) = stats(&mut still);
        println!(
            "{:<10} cursor moved: median {mm:>6.2} ms, max {mx:>6.2} ms   redraw: median {sm:>6.2} ms, max {sx:>6.2} ms",
            panel.title()
        );
    }
}
