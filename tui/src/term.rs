//! The terminal: raw mode and the alternate screen on the way in, and always restored on the
//! way out (normal exit, error, Ctrl-C, panic), with the loop that draws and then waits for
//! input.
//!
//! [`run`] is what the entry points of the crate root call with a prepared `crate::app::App`.
//! The loop takes in data with `App::tick`, draws a frame with `crate::ui::draw` when something
//! changed (at most twenty times a second for live data), and hands keys and mouse events to
//! the app. Raw mode turns Ctrl-C into a key, which quits like `q`. A panic hook restores the
//! terminal before the panic message is printed, so the message stays readable. SIGTERM,
//! SIGHUP, SIGINT and SIGQUIT from outside (`kill`, a closed tmux pane or SSH session) end the
//! loop within one wait like `q` does, so the terminal is restored instead of left in raw
//! mode; [`stop_signal`] then tells the caller which one came.

use std::io::{self, Stdout, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Once, OnceLock};
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
/// The number of the last stop signal received while the dashboard ran (0: none), written by
/// the signal handlers that [`watch_stop_signals`] installs.
static STOP_SIGNAL: OnceLock<Arc<AtomicUsize>> = OnceLock::new();

/// The signals that stop the dashboard.
#[cfg(unix)]
const STOP_SIGNALS: [i32; 4] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGHUP,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGQUIT,
];

/// Installs, once, handlers that record a stop signal instead of letting it kill the process
/// with the terminal in raw mode. A signal whose handler cannot be installed keeps its
/// default action.
fn watch_stop_signals() -> &'static AtomicUsize {
    STOP_SIGNAL.get_or_init(|| {
        let received = Arc::new(AtomicUsize::new(0));
        #[cfg(unix)]
        for signal in STOP_SIGNALS {
            let _ =
                signal_hook::flag::register_usize(signal, Arc::clone(&received), signal as usize);
        }
        received
    })
}

/// The signal (SIGTERM, SIGHUP, SIGINT or SIGQUIT) that ended the last dashboard, if one did.
/// A program that ran the dashboard exits with `128 + signal` after it, as a shell expects.
pub fn stop_signal() -> Option<i32> {
    let received = STOP_SIGNAL.get()?.load(Ordering::SeqCst);
    (received != 0).then_some(received as i32)
}

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
    watch_stop_signals();
    enable_raw_mode()?;
    ACTIVE.store(true, Ordering::SeqCst);
    let mut out = io::stdout();
    execute!(out, EnterAlternateScreen, EnableMouseCapture)?;
    Terminal::new(CrosstermBackend::new(out))
}

/// Runs the dashboard in the terminal until the user quits.
pub fn run(app: &mut App) -> io::Result<()> {
    // A signal that stopped an earlier dashboard in this process does not stop this one.
    watch_stop_signals().store(0, Ordering::SeqCst);
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
    let stop = watch_stop_signals();
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
        if app.quit || stop.load(Ordering::SeqCst) != 0 {
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
