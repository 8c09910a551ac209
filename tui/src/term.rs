//! The terminal: raw mode and the alternate screen on the way in, and always restored on the
//! way out (normal exit, error, Ctrl-C, panic), with the loop that draws and then waits for
//! input.
//!
//! [`run`] is what the entry points of the crate root call with a prepared `crate::app::App`,
//! and [`run_fleet`] with a `crate::fleet::Fleet` (several processes behind one table); both
//! share the loop, the panic hook and the restoring.
//! The loop takes in data with `App::tick`, draws a frame with `crate::ui::draw` when something
//! changed (at most twenty times a second for live data), and hands keys and mouse events to
//! the app. Raw mode turns Ctrl-C into a key, which quits like `q`. A panic hook, installed when the
//! terminal is set up, restores it before the panic message is printed, so the message stays
//! readable; a panic on another thread (the analysis's, the source's) also ends the loop. SIGTERM,
//! SIGINT and SIGQUIT from outside (`kill`, `timeout`, a supervisor) end the loop within one
//! wait like `q` does, so the terminal is restored instead of left in raw mode;
//! [`stop_signal`] then tells the caller which one came. A second such signal, and any that
//! comes while no dashboard runs, takes its default action. SIGHUP is left alone: it means the
//! terminal is gone, so there is nothing to restore, and a loop reading a vanished terminal
//! might never look at a flag.

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
use vramscope_import::{Progress, ProgressState};

use crate::app::App;
use crate::fleet::Fleet;
use crate::source::unix_now_ns;
use crate::ui;

/// Set while the terminal is in raw mode on the alternate screen.
static ACTIVE: AtomicBool = AtomicBool::new(false);
static HOOK: Once = Once::new();
/// The state the stop-signal handlers share with the loop, made once per process.
struct StopSignals {
    /// The number of the last stop signal received while a dashboard ran (0: none).
    received: Arc<AtomicUsize>,
    /// Set while no dashboard runs: a stop signal then takes its default action, as if no
    /// handler were installed.
    idle: Arc<AtomicBool>,
    /// Set by the first stop signal of a run: a second one takes its default action, so a
    /// process whose loop does not stop still ends.
    armed: Arc<AtomicBool>,
}

static STOP: OnceLock<StopSignals> = OnceLock::new();

/// The signals that stop the dashboard.
#[cfg(unix)]
const STOP_SIGNALS: [i32; 3] = [
    signal_hook::consts::SIGTERM,
    signal_hook::consts::SIGINT,
    signal_hook::consts::SIGQUIT,
];

/// Installs, once, the handlers of the stop signals. For each signal they run in order: the
/// default action if no dashboard runs, the default action if a stop signal already came,
/// then the two flags. A signal whose handlers cannot be installed keeps its default action.
fn stop_signals() -> &'static StopSignals {
    STOP.get_or_init(|| {
        let state = StopSignals {
            received: Arc::new(AtomicUsize::new(0)),
            idle: Arc::new(AtomicBool::new(true)),
            armed: Arc::new(AtomicBool::new(false)),
        };
        #[cfg(unix)]
        for signal in STOP_SIGNALS {
            use signal_hook::flag;
            let _ = flag::register_conditional_default(signal, Arc::clone(&state.idle));
            let _ = flag::register_conditional_default(signal, Arc::clone(&state.armed));
            let _ = flag::register(signal, Arc::clone(&state.armed));
            let _ = flag::register_usize(signal, Arc::clone(&state.received), signal as usize);
        }
        state
    })
}

/// The signal (SIGTERM, SIGINT or SIGQUIT) that ended the last dashboard, if one did. A
/// program that ran the dashboard exits with `128 + signal` after it, as a shell expects.
pub fn stop_signal() -> Option<i32> {
    let received = STOP.get()?.received.load(Ordering::SeqCst);
    (received != 0).then_some(received as i32)
}

/// Set by the panic hook when a thread of the dashboard panicked while it ran: the terminal
/// was restored for the message, so the loop ends instead of drawing on.
static PANICKED: AtomicBool = AtomicBool::new(false);

/// Where [`restore`] writes in this crate's tests, instead of standard output.
#[cfg(test)]
static TEST_OUT: std::sync::Mutex<Option<Vec<u8>>> = std::sync::Mutex::new(None);

/// Writes what puts a terminal back after the dashboard: leave the alternate screen, stop
/// reporting the mouse, show the cursor.
pub fn write_restore(out: &mut impl Write) -> io::Result<()> {
    execute!(out, LeaveAlternateScreen, DisableMouseCapture, Show)?;
    out.flush()
}

/// Puts the terminal back as it was (the sequences of [`write_restore`], then raw mode
/// off), if a dashboard has it. Safe to call more than once, and from any thread.
pub fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        #[cfg(test)]
        if let Some(out) = TEST_OUT.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = write_restore(out);
            return;
        }
        let _ = write_restore(&mut io::stdout());
        let _ = disable_raw_mode();
    }
}

/// Restores the terminal when dropped, on every way out of [`run`], and gives the stop
/// signals their default action back.
struct Guard;

impl Drop for Guard {
    fn drop(&mut self) {
        restore();
        stop_signals().idle.store(true, Ordering::SeqCst);
    }
}

/// Installs, once per process, the panic hook that restores the terminal before the panic
/// message is printed (by the hook that was there before), whichever thread panics; a panic
/// while a dashboard runs also ends its loop.
fn install_panic_hook() {
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if ACTIVE.load(Ordering::SeqCst) {
                PANICKED.store(true, Ordering::SeqCst);
            }
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

extern "C" {
    fn tcgetpgrp(fd: i32) -> i32;
    fn getpgrp() -> i32;
}

/// Whether this process may take the terminal: standard input and output are terminals, and
/// this process's group is the terminal's foreground group. A background process (`timeout`
/// runs its command in a group of its own; `cmd &`) that touched the terminal would be
/// stopped by the kernel (`SIGTTOU`, state `T`) and wait forever; the reason it cannot is
/// returned instead.
pub fn check_foreground() -> Result<(), String> {
    use std::io::IsTerminal;
    if !io::stdin().is_terminal() || !io::stdout().is_terminal() {
        return Err("standard input and output are not a terminal".to_string());
    }
    // SAFETY: both calls only read process and terminal state; `tcgetpgrp` on a descriptor
    // that is a terminal (checked above) returns its foreground group, or -1 on error.
    let (foreground, own) = unsafe { (tcgetpgrp(0), getpgrp()) };
    if foreground >= 0 && foreground != own {
        return Err(format!(
            "this process runs in the background (its process group {own} is not the terminal's foreground group {foreground})"
        ));
    }
    Ok(())
}

/// What the loop drives: one dashboard, or a fleet of them behind a table.
trait Screen {
    /// Sets the time.
    fn set_now(&mut self, now_unix_ns: u64);
    /// Takes in new data; returns whether anything changed.
    fn tick(&mut self) -> bool;
    /// Whether the last tick stopped at its bound with data left to take in.
    fn saturated(&self) -> bool;
    /// Draws a frame.
    fn draw(&mut self, terminal: &mut Terminal<CrosstermBackend<Stdout>>) -> io::Result<()>;
    /// Whether the user asked to quit.
    fn quit(&self) -> bool;
    /// Reacts to a key.
    fn key(&mut self, key: event::KeyEvent);
    /// Reacts to the mouse.
    fn mouse(&mut self, mouse: event::MouseEvent);
    /// Stops the sources (on quit).
    fn shutdown(&mut self);
}

impl Screen for App {
    fn set_now(&mut self, now_unix_ns: u64) {
        self.now_unix_ns = now_unix_ns;
    }

    fn tick(&mut self) -> bool {
        App::tick(self)
    }

    fn saturated(&self) -> bool {
        App::saturated(self)
    }

    fn draw(&mut self, terminal: &mut Terminal<CrosstermBackend<Stdout>>) -> io::Result<()> {
        let size = terminal.size()?;
        self.prepare_frame(Rect::new(0, 0, size.width, size.height));
        terminal.draw(|frame| ui::draw(frame, self))?;
        Ok(())
    }

    fn quit(&self) -> bool {
        self.quit
    }

    fn key(&mut self, key: event::KeyEvent) {
        self.handle_key(key);
    }

    fn mouse(&mut self, mouse: event::MouseEvent) {
        self.handle_mouse(mouse);
    }

    fn shutdown(&mut self) {
        App::shutdown(self);
    }
}

impl Screen for Fleet {
    fn set_now(&mut self, now_unix_ns: u64) {
        Fleet::set_now(self, now_unix_ns);
    }

    fn tick(&mut self) -> bool {
        Fleet::tick(self)
    }

    fn saturated(&self) -> bool {
        Fleet::saturated(self)
    }

    fn draw(&mut self, terminal: &mut Terminal<CrosstermBackend<Stdout>>) -> io::Result<()> {
        let size = terminal.size()?;
        self.prepare(Rect::new(0, 0, size.width, size.height));
        terminal.draw(|frame| ui::fleet::draw(frame, self))?;
        Ok(())
    }

    fn quit(&self) -> bool {
        self.quit
    }

    fn key(&mut self, key: event::KeyEvent) {
        self.handle_key(key);
    }

    fn mouse(&mut self, mouse: event::MouseEvent) {
        self.handle_mouse(mouse);
    }

    fn shutdown(&mut self) {
        Fleet::shutdown(self);
    }
}

/// How long work may take before [`wait_with_cancel`] shows that it is waiting.
const SHOW_WAITING_AFTER: Duration = Duration::from_millis(300);

/// Runs `work` on a thread of its own and waits for it. When it takes longer than a moment,
/// the terminal shows `what` with the time spent, where the work is (`progress`, when it
/// reports there) and a way out: `q`, Esc or Ctrl-C (or a stop signal) gives up waiting and
/// returns `None` (the work is left to finish on its own, and the process that called this
/// usually exits then). A quick result never touches the terminal.
pub fn wait_with_cancel<T: Send + 'static>(
    what: &str,
    progress: Option<&Progress>,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<Option<T>> {
    let (done, result) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("vramscope-load".to_string())
        .spawn(move || {
            let _ = done.send(work());
        })?;
    if let Ok(value) = result.recv_timeout(SHOW_WAITING_AFTER) {
        return Ok(Some(value));
    }
    let signals = stop_signals();
    signals.received.store(0, Ordering::SeqCst);
    signals.idle.store(false, Ordering::SeqCst);
    let _guard = Guard;
    let mut terminal = enter()?;
    terminal.hide_cursor()?;
    let started = Instant::now();
    loop {
        if let Ok(value) = result.try_recv() {
            return Ok(Some(value));
        }
        if signals.received.load(Ordering::SeqCst) != 0 {
            return Ok(None);
        }
        let lines = loading_lines(what, started.elapsed(), progress.map(Progress::state));
        terminal.draw(|frame| draw_loading(frame, &lines))?;
        if event::poll(Duration::from_millis(100))? {
            if let Event::Key(key) = event::read()? {
                use ratatui::crossterm::event::{KeyCode, KeyModifiers};
                let ctrl_c =
                    key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL);
                if matches!(key.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c {
                    return Ok(None);
                }
            }
        }
    }
}

/// The loading screen's lines: what is loading and for how long, where the load is (with a
/// bar when the stage knows its total), and how to give up.
fn loading_lines(what: &str, elapsed: Duration, state: Option<ProgressState>) -> Vec<String> {
    let mut lines = vec![format!(
        " Loading {} ... {:.0} s",
        vramscope_model::terminal::sanitize(what),
        elapsed.as_secs_f64()
    )];
    if let Some(state) = state {
        lines.push(format!(" {state}"));
        if let Some(fraction) = state.fraction() {
            const WIDTH: usize = 40;
            let filled = ((fraction * WIDTH as f64) as usize).min(WIDTH);
            lines.push(format!(
                " [{}{}]",
                "#".repeat(filled),
                "-".repeat(WIDTH - filled)
            ));
        }
    }
    lines.push(" q, Esc or Ctrl-C to give up".to_string());
    lines
}

/// Draws the loading screen's `lines` in the middle of the terminal.
fn draw_loading(frame: &mut ratatui::Frame<'_>, lines: &[String]) {
    let area = frame.area();
    let top = (area.height / 2).saturating_sub(lines.len() as u16 / 2);
    for (i, line) in lines.iter().enumerate() {
        let y = top.saturating_add(i as u16);
        if y >= area.bottom() {
            break;
        }
        let text = ratatui::widgets::Paragraph::new(line.as_str());
        frame.render_widget(text, Rect::new(area.x, y, area.width, 1));
    }
}

/// Runs the dashboard in the terminal until the user quits.
pub fn run(app: &mut App) -> io::Result<()> {
    run_screen(app)
}

/// Runs the fleet's table, and the dashboards it opens, in the terminal until the user quits
/// at the table.
pub fn run_fleet(fleet: &mut Fleet) -> io::Result<()> {
    run_screen(fleet)
}

fn run_screen(screen: &mut impl Screen) -> io::Result<()> {
    PANICKED.store(false, Ordering::SeqCst);
    // A signal that stopped an earlier dashboard in this process does not stop this one.
    let signals = stop_signals();
    signals.received.store(0, Ordering::SeqCst);
    signals.armed.store(false, Ordering::SeqCst);
    signals.idle.store(false, Ordering::SeqCst);
    let _guard = Guard;
    let mut terminal = enter()?;
    terminal.hide_cursor()?;
    let result = event_loop(&mut terminal, screen);
    screen.shutdown();
    drop(terminal);
    restore();
    result
}

fn event_loop(
    terminal: &mut Terminal<CrosstermBackend<Stdout>>,
    screen: &mut impl Screen,
) -> io::Result<()> {
    let stop = &stop_signals().received;
    let min_frame = Duration::from_millis(50);
    let mut dirty = true;
    let mut last_draw: Option<Instant> = None;
    loop {
        screen.set_now(unix_now_ns());
        dirty |= screen.tick();
        let stale = last_draw.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
        let may_draw = last_draw.is_none_or(|t| t.elapsed() >= min_frame);
        if (dirty && may_draw) || stale {
            screen.draw(terminal)?;
            last_draw = Some(Instant::now());
            dirty = false;
        }
        if screen.quit() || stop.load(Ordering::SeqCst) != 0 {
            return Ok(());
        }
        if PANICKED.load(Ordering::SeqCst) {
            // Another thread of the dashboard panicked; its message is on the restored
            // terminal, which drawing on would scribble over.
            return Err(io::Error::other("a thread of the dashboard panicked"));
        }
        // Data waiting to be taken in: read the keys that are there, then tick again at once
        // (each tick's work is bounded, so keys are read every few milliseconds).
        let wait = if screen.saturated() {
            Duration::ZERO
        } else if dirty {
            min_frame / 2
        } else {
            Duration::from_millis(100)
        };
        if event::poll(wait)? {
            // Take every event that is already there before drawing again.
            loop {
                match event::read()? {
                    Event::Key(key) => screen.key(key),
                    Event::Mouse(mouse) => screen.mouse(mouse),
                    _ => {}
                }
                if screen.quit() || !event::poll(Duration::ZERO)? {
                    break;
                }
            }
            dirty = true;
            // Answer keys at once rather than at the next frame.
            last_draw = last_draw.and_then(|t| t.checked_sub(min_frame));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ratatui::backend::TestBackend;
    use vramscope_import::Stage;

    #[test]
    fn the_loading_screen_says_where_a_big_load_is() {
        let progress = Progress::new();
        progress.begin(Stage::Reading, 1000 << 20);
        progress.add(430 << 20);
        let lines = loading_lines(
            "big\u{1b}]0;owned\u{7}.pickle",
            Duration::from_secs(3),
            Some(progress.state()),
        );
        assert_eq!(
            lines,
            [
                " Loading big\\u{1b}]0;owned\\u{7}.pickle ... 3 s",
                " reading the file: 430 MiB of 1000 MiB (43 %)",
                " [#################-----------------------]",
                " q, Esc or Ctrl-C to give up",
            ]
        );
        // A stage without a total has no bar.
        progress.begin(Stage::BuildingTimeline, 0);
        let lines = loading_lines("f", Duration::ZERO, Some(progress.state()));
        assert_eq!(lines[1], " building the timeline");
        assert_eq!(lines.len(), 3);

        let mut terminal = Terminal::new(TestBackend::new(60, 9)).expect("test terminal");
        terminal
            .draw(|frame| draw_loading(frame, &lines))
            .expect("draw");
        let screen: Vec<String> = terminal
            .backend()
            .buffer()
            .content()
            .chunks(60)
            .map(|row| row.iter().map(|c| c.symbol()).collect::<String>())
            .collect();
        assert_eq!(screen[3].trim_end(), " Loading f ... 0 s");
        assert_eq!(screen[4].trim_end(), " building the timeline");
        assert_eq!(screen[5].trim_end(), " q, Esc or Ctrl-C to give up");
    }

    /// Issue 33, item 7: a panic anywhere while the dashboard has the terminal restores it
    /// (alternate screen left, mouse reporting off, cursor shown) before the panic message
    /// is printed, and tells the loop to end.
    #[test]
    fn a_panic_restores_the_terminal_before_its_message() {
        let mut expected = Vec::new();
        write_restore(&mut expected).unwrap();
        let text = String::from_utf8_lossy(&expected).to_string();
        assert!(
            text.contains("\x1b[?1049l"),
            "leaves the alternate screen: {text:?}"
        );
        assert!(
            text.contains("\x1b[?1000l"),
            "stops mouse reporting: {text:?}"
        );
        assert!(text.contains("\x1b[?25h"), "shows the cursor: {text:?}");

        *TEST_OUT.lock().unwrap() = Some(Vec::new());
        // The hook found before ours writes the message: it must come after the restoring.
        std::panic::set_hook(Box::new(|_| {
            if let Some(out) = TEST_OUT.lock().unwrap().as_mut() {
                out.extend_from_slice(b"MESSAGE");
            }
        }));
        install_panic_hook();
        ACTIVE.store(true, Ordering::SeqCst);
        let panicked = std::thread::spawn(|| panic!("boom in the analysis thread")).join();
        assert!(panicked.is_err());
        let written = TEST_OUT.lock().unwrap().take().unwrap();
        let _ = std::panic::take_hook();
        assert!(!ACTIVE.load(Ordering::SeqCst));
        assert!(PANICKED.swap(false, Ordering::SeqCst));
        let message = written
            .windows(7)
            .position(|w| w == b"MESSAGE")
            .expect("the message was printed");
        assert_eq!(&written[..message], &expected[..], "restored first");
        assert_eq!(written.len(), message + 7);
    }
}
