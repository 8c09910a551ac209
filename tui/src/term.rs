//! The terminal: raw mode and the alternate screen on the way in, and always restored on the
//! way out (normal exit, error, Ctrl-C, panic), with the loop that draws and then waits for
//! input.
//!
//! [`run`] is what the entry points of the crate root call with a prepared `crate::app::App`.
//! The loop takes in data with `App::tick`, draws a frame with `crate::ui::draw` when something
//! changed (at most twenty times a second for live data), and hands keys and mouse events to
//! the app. Raw mode turns Ctrl-C into a key, which quits like `q`. A panic hook restores the
//! terminal before the panic message is printed, so the message stays readable.

use std::io::{self, Stdout, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;
use std::time::{Duration, Instant};

use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::cursor::Show;
use ratatui::crossterm::event::{self, DisableMouseCapture, EnableMouseCapture, Event};
use ratatui::crossterm::execute;
use ratatui::crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::layout::Rect;
use ratatui::Terminal;

use crate::app::App;
use crate::source::unix_now_ns;
use crate::ui;

/// Set while the terminal is in raw mode on the alternate screen.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();

/// Puts the terminal back as it was. Safe to call more than once.
pub fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = disable_raw_mode();
        let mut out = io::stdout();
        let _ = execute!(out, LeaveAlternateScreen, DisableMouseCapture, Show);
        let _ = out.flush();
    }
}

/// Restores the terminal when dropped, on every way out of [`run`].
struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
    }
}

fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

fn enter() -> io::Result<Terminal<CrosstermBackend<Stdout>>> {
    install_panic_hook();
    enable_raw_mode()?;
    ACTIVE.store(true, Ordering::SeqCst);
    let mut out = io::stdout();
    execute!(out, EnterAlternateScreen, EnableMouseCapture)?;
    Terminal::new(CrosstermBackend::new(out))
}

/// Runs the dashboard in the terminal until the user quits.
pub fn run(app: &mut App) -> io::Result<()> {
    let _guard = Guard;
    let mut terminal = enter()?;
    terminal.hide_cursor()?;
    let result = event_loop(&mut terminal, app);
    app.shutdown();
    drop(terminal);
    restore();
    result
}

fn event_loop(terminal: &mut Terminal<CrosstermBackend<Stdout>>, app: &mut App) -> io::Result<()> {
    let min_frame = Duration::from_millis(50);
    let mut dirty = true;
    let mut last_draw: Option<Instant> = None;
    loop {
        app.now_unix_ns = unix_now_ns();
        dirty |= app.tick();
        let stale = last_draw.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        let may_draw = last_draw.is_none_or(|t| t.elapsed() >= min_frame);
        if (dirty && may_draw) || stale {
            let size = terminal.size()?;
            app.area = Rect::new(0, 0, size.width, size.height);
            let layout = ui::layout(app.area, app.panel);
            app.page_rows = usize::from(layout.body.height.saturating_sub(3)).max(1);
            app.prepare();
            terminal.draw(|frame| ui::draw(frame, app))?;
            last_draw = Some(Instant::now());
            dirty = false;
        }
        if app.quit {
            return Ok(());
        }
        let wait = if dirty {
            min_frame / 2
        } else {
            Duration::from_millis(100)
        };
        if event::poll(wait)? {
            // Take every event that is already there before drawing again.
            loop {
                match event::read()? {
                    Event::Key(key) => app.handle_key(key),
                    Event::Mouse(mouse) => app.handle_mouse(mouse),
                    _ => {}
                }
                if app.quit || !event::poll(Duration::ZERO)? {
                    break;
                }
            }
            dirty = true;
            // Answer keys at once rather than at the next frame.
            last_draw = last_draw.and_then(|t| t.checked_sub(min_frame));
        }
    }
}
