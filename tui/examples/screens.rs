//! Prints every panel of the dashboard on the fixture data, as the screen tests see it.
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use vramscope_testkit::fixture;
use vramscope_tui::app::{App, Panel};
use vramscope_tui::data::{Dataset, Origin};
use vramscope_tui::ui;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let w: u16 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(80);
    let h: u16 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(24);
    let data = Dataset::new(
        fixture::training_snapshot(),
        Origin::File("fixture.json".into()),
    );
    let mut app = App::new(data);
    app.theme = ui::Theme::plain();
    app.now_unix_ns = fixture::EPOCH_UNIX_NS;
    app.analyze_now();
    for p in Panel::ALL {
        app.panel = p;
        app.area = ratatui::layout::Rect::new(0, 0, w, h);
        app.prepare();
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| ui::draw(f, &app)).unwrap();
        let buf = t.backend().buffer().clone();
        println!("==== {:?}", p);
        for y in 0..h {
            let line: String = (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect();
            println!("{line}");
        }
    }
}
