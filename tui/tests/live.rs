//! The dashboard's live sources end to end: a `LiveSource` attached to a real telemetry
//! publisher (history, new events, new call sites, statistics), the program going away
//! ("disconnected since …") and coming back (reconnect), and an `InProcessSource` with a
//! workload that the dashboard pauses and stops.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use vramscope_allocator::{CachingAllocator, SimDevice, Telemetry};
use vramscope_model::{AllocatorConfig, DeviceInfo, Snapshot, SnapshotSource};
use vramscope_telemetry::TelemetryAddr;
use vramscope_tui::app::App;
use vramscope_tui::data::{Dataset, Link, Origin};
use vramscope_tui::source::{Control, InProcessSource, LiveSource};

fn empty_app(origin: Origin, source: Box<dyn vramscope_tui::Source>) -> App {
    let empty = Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default());
    App::new(Dataset::new(empty, origin)).with_source(source)
}

/// Ticks the app until `done` holds, failing after 20 seconds.
fn tick_until(app: &mut App, what: &str, mut done: impl FnMut(&App) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(app) {
        assert!(Instant::now() < deadline, "never: {what}");
        app.tick();
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_live_dashboard_follows_loses_and_finds_its_program_again() {
    let dir = std::env::temp_dir().join(format!("vramscope-tui-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let addr = TelemetryAddr::Unix(dir.join("app.sock"));
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let before = alloc.tagged("before").alloc(1 << 20).unwrap();
    let telemetry = Telemetry::serve(&alloc, &addr).unwrap();

    let source = LiveSource::connect(addr.clone(), Duration::from_millis(20));
    let mut app = empty_app(Origin::Live(addr.to_string()), Box::new(source));
    tick_until(&mut app, "the history arrives", |a| !a.data.is_empty());
    assert_eq!(app.data.link_state, Link::Up);
    assert_eq!(
        app.data.head().allocated,
        1 << 20,
        "the state before attaching"
    );

    // New events with a new call site and tag.
    alloc.mark_step();
    let late = alloc.tagged("late").alloc(3 << 20).unwrap();
    tick_until(&mut app, "the new allocation arrives", |a| {
        a.data.head().allocated >= 4 << 20
    });
    assert!(app.data.snapshot().tags.iter().any(|t| t == "late"));
    tick_until(&mut app, "statistics arrive", |a| {
        a.data.live.stats.is_some()
    });
    app.prepare();
    assert_eq!(app.view().live_blocks, 2);

    // The program goes away.
    drop(telemetry);
    tick_until(&mut app, "the loss is noticed", |a| {
        matches!(a.data.link_state, Link::Down { .. })
    });
    let events_then = app.data.len();

    // It comes back: the dashboard reconnects and starts over from its snapshot.
    drop(late);
    let _again = Telemetry::serve(&alloc, &addr).unwrap();
    tick_until(&mut app, "the dashboard reconnects", |a| {
        a.data.link_state == Link::Up
    });
    tick_until(&mut app, "the new state arrives", |a| {
        a.data.head().allocated == 1 << 20 && a.data.len() > events_then
    });
    drop(before);
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn an_in_process_workload_is_followed_paused_and_stopped() {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let handle = alloc.clone();
    let (steps_tx, steps_rx) = mpsc::channel();
    let source = InProcessSource::new(alloc).with_workload(move |control: Control| {
        let mut kept = Vec::new();
        while control.proceed() {
            handle.mark_step();
            kept.push(handle.alloc(1 << 20).unwrap());
            let _ = steps_tx.send(kept.len());
            if !control.pace(Duration::from_millis(2)) {
                break;
            }
        }
    });
    let mut app = empty_app(Origin::InProcess("test".into()), Box::new(source));
    tick_until(&mut app, "steps arrive", |a| {
        a.data.step_starts().len() >= 3
    });
    app.prepare();
    assert!(app.following());

    // `p` pauses the workload and pins the view.
    app.handle_key(ratatui::crossterm::event::KeyEvent::from(
        ratatui::crossterm::event::KeyCode::Char('p'),
    ));
    assert!(app.paused);
    let pinned = app.pos();
    // Once paused, the workload sends no more steps.
    while steps_rx.recv_timeout(Duration::from_millis(200)).is_ok() {}
    app.tick();
    let len = app.data.len();
    assert_eq!(app.pos(), pinned, "the view stays put while data arrives");
    assert!(steps_rx.recv_timeout(Duration::from_millis(100)).is_err());
    app.tick();
    assert_eq!(app.data.len(), len, "nothing happened while paused");

    app.handle_key(ratatui::crossterm::event::KeyEvent::from(
        ratatui::crossterm::event::KeyCode::Char('p'),
    ));
    assert!(!app.paused && app.following());
    steps_rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the workload resumes");
    tick_until(&mut app, "more events", |a| a.data.len() > len);

    // Quitting stops the workload.
    app.shutdown();
    while steps_rx.try_recv().is_ok() {}
    assert!(steps_rx.recv_timeout(Duration::from_millis(100)).is_err());
    tick_until(&mut app, "the end is noticed", |a| {
        a.data.link_state == Link::Ended
    });
}

#[test]
fn control_blocks_while_paused_and_releases_on_stop() {
    let control = Control::new();
    assert!(control.proceed());
    control.set_paused(true);
    let (tx, rx) = mpsc::channel();
    let c = control.clone();
    let waiter = std::thread::spawn(move || tx.send(c.proceed()).unwrap());
    assert!(
        rx.recv_timeout(Duration::from_millis(100)).is_err(),
        "waits while paused"
    );
    control.stop();
    assert_eq!(rx.recv_timeout(Duration::from_secs(20)), Ok(false));
    waiter.join().unwrap();
    assert!(control.stopped());
    assert!(
        !control.pace(Duration::from_secs(60)),
        "a stopped control never sleeps"
    );
}
