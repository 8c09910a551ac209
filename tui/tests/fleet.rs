//! The fleet view of `vramscope top ADDR ADDR...`: two allocators in this process drawn as one
//! row each with their figures (an insta snapshot at 120×40), a process that goes down shown as
//! `down: <reason>` while the selection and Enter open the right process's full dashboard, and
//! two real telemetry publishers followed, one lost and found again.

use std::time::{Duration, Instant};

use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::layout::Rect;
use ratatui::Terminal;
use vramscope_allocator::{CachingAllocator, SimDevice, StreamId, Telemetry};
use vramscope_model::{format_bytes, AllocatorConfig, DeviceInfo, Snapshot, SnapshotSource};
use vramscope_telemetry::TelemetryAddr;
use vramscope_testkit::fixture;
use vramscope_tui::data::{Dataset, Link, Origin};
use vramscope_tui::fleet::{Fleet, Member};
use vramscope_tui::source::{InProcessSource, Source, Update};
use vramscope_tui::ui::{self, Theme};

const MIB: u64 = 1 << 20;

fn empty(origin: Origin) -> Dataset {
    Dataset::new(
        Snapshot::empty(SnapshotSource::Vramscope, DeviceInfo::default()),
        origin,
    )
}

fn screen(fleet: &mut Fleet, width: u16, height: u16) -> String {
    fleet.prepare(Rect::new(0, 0, width, height));
    let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
    terminal.draw(|f| ui::fleet::draw(f, fleet)).unwrap();
    let buf = terminal.backend().buffer().clone();
    let mut out = String::new();
    for y in 0..height {
        let line: String = (0..width).map(|x| buf[(x, y)].symbol()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn key(fleet: &mut Fleet, code: KeyCode) {
    fleet.handle_key(KeyEvent::new(code, KeyModifiers::NONE));
}

/// The screen line that names `label`.
fn line_of<'a>(screen: &'a str, label: &str) -> &'a str {
    screen
        .lines()
        .find(|l| l.contains(label))
        .unwrap_or_else(|| panic!("no row for {label}:\n{screen}"))
}

/// Two allocators on phantom devices: rank0 holds 64 MiB; rank1 allocated 3 × 256 MiB and
/// freed one, so it holds 512 MiB after a peak of 768 MiB. The blocks are returned to keep
/// them alive.
fn two_ranks() -> (Fleet, Vec<CachingAllocator<SimDevice>>, Vec<u64>) {
    let rank0 = CachingAllocator::new(SimDevice::phantom(1 << 36), AllocatorConfig::default());
    let rank1 = CachingAllocator::new(SimDevice::phantom(1 << 36), AllocatorConfig::default());
    let mut kept = vec![rank0.alloc_ptr(64 * MIB, StreamId::DEFAULT).unwrap()];
    rank1.mark_step();
    for _ in 0..3 {
        kept.push(rank1.alloc_ptr(256 * MIB, StreamId::DEFAULT).unwrap());
    }
    rank1.free_ptr(kept.pop().unwrap()).unwrap();
    rank1.mark_step();
    let members = [("rank0", &rank0), ("rank1", &rank1)]
        .into_iter()
        .map(|(name, alloc)| {
            Member::with_source(
                empty(Origin::InProcess(name.into())),
                Box::new(InProcessSource::new(alloc.clone())),
            )
        })
        .collect();
    let mut fleet = Fleet::new(members);
    fleet.theme = Theme::plain();
    for m in &mut fleet.members {
        m.app.theme = Theme::plain();
    }
    fleet.set_now(fixture::EPOCH_UNIX_NS);
    (fleet, vec![rank0, rank1], kept)
}

#[test]
fn two_in_process_sources_show_a_row_each_with_their_figures() {
    let (mut fleet, _allocs, _kept) = two_ranks();
    for _ in 0..3 {
        fleet.tick();
    }
    fleet.analyze_now();
    // Seven seconds later, with nothing new.
    fleet.set_now(fixture::EPOCH_UNIX_NS + 7_000_000_000);

    let rows = fleet.rows();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].allocated, rows[0].peak_allocated),
        (64 * MIB, 64 * MIB)
    );
    assert_eq!(
        (rows[1].allocated, rows[1].peak_allocated),
        (512 * MIB, 768 * MIB)
    );
    assert!(rows[0].reserved >= 64 * MIB && rows[1].reserved >= 768 * MIB);
    assert!(rows.iter().all(|r| r.link == "up"));
    assert_eq!(rows[1].step, 2);
    // Each holds one site's memory at the end: the top-holders finding, once analysed.
    assert!(rows.iter().all(|r| r.findings == Some(1)), "{rows:?}");

    let s = screen(&mut fleet, 120, 40);
    assert!(s.contains("2 processes, 2 up"), "{s}");
    let r0 = line_of(&s, "rank0");
    let r1 = line_of(&s, "rank1");
    assert!(r0.contains(&format_bytes(64 * MIB)), "{r0}");
    assert!(r1.contains(&format_bytes(512 * MIB)), "{r1}");
    assert!(r1.contains(&format_bytes(768 * MIB)), "{r1}");
    assert!(r0.contains(" up ") && r1.contains(" up "), "{s}");
    assert!(r0.contains("7s ago") && r1.contains("7s ago"), "{s}");
    assert!(
        s.contains(&format!("in all: {} allocated", format_bytes(576 * MIB))),
        "{s}"
    );
    insta::assert_snapshot!("fleet_two_ranks_120x40", s);

    // The rows stay live: rank0 allocates more, and the next tick shows it.
    let rank0 = &_allocs[0];
    let more = rank0.alloc_ptr(32 * MIB, StreamId::DEFAULT).unwrap();
    fleet.tick();
    assert_eq!(fleet.rows()[0].allocated, 96 * MIB);
    let s = screen(&mut fleet, 120, 40);
    assert!(
        line_of(&s, "rank0").contains(&format_bytes(96 * MIB)),
        "{s}"
    );
    assert!(line_of(&s, "rank0").contains("0s ago"), "{s}");
    rank0.free_ptr(more).unwrap();
}

/// A publisher that says hello and then goes away.
struct Gone {
    sent: bool,
}

impl Source for Gone {
    fn poll(&mut self, out: &mut Vec<Update>) {
        if !self.sent {
            self.sent = true;
            out.push(Update::Connected("train.py (pid 4242) on sim".into()));
            out.push(Update::Disconnected {
                since_unix_ns: fixture::EPOCH_UNIX_NS,
                reason: "the program ended".into(),
            });
        }
    }
}

#[test]
fn a_process_that_goes_down_says_why_and_enter_opens_the_right_one() {
    let (mut fleet, _allocs, _kept) = two_ranks();
    fleet.members.push(Member::with_source(
        empty(Origin::Live("unix:/tmp/rank2.sock".into())),
        Box::new(Gone { sent: false }),
    ));
    fleet.members[2].app.theme = Theme::plain();
    fleet.set_now(fixture::EPOCH_UNIX_NS);
    fleet.tick();
    fleet.tick();

    let rows = fleet.rows();
    assert!(rows[2].down);
    assert_eq!(rows[2].link, "down: the program ended");
    assert_eq!(rows[2].program.as_deref(), Some("train.py (pid 4242)"));
    let s = screen(&mut fleet, 120, 40);
    assert!(s.contains("3 processes, 2 up, 1 down"), "{s}");
    let r2 = line_of(&s, "rank2.sock");
    assert!(r2.contains("down: the program ended"), "{r2}");
    assert!(
        r2.contains("train.py (pi…"),
        "the program gives way first: {r2}"
    );
    // A wider terminal shows it whole.
    let wide = screen(&mut fleet, 160, 40);
    assert!(
        line_of(&wide, "unix:/tmp/rank2.sock").contains("train.py (pid 4242)"),
        "{wide}"
    );
    assert!(line_of(&s, "rank1").contains(" up "), "{s}");

    // Down twice and Enter open the third process, the one that is down.
    key(&mut fleet, KeyCode::Down);
    key(&mut fleet, KeyCode::Down);
    key(&mut fleet, KeyCode::Down);
    assert_eq!(fleet.selected, 2, "the selection stops at the last row");
    key(&mut fleet, KeyCode::Enter);
    assert_eq!(fleet.open, Some(2));
    let s = screen(&mut fleet, 120, 40);
    let header = s.lines().next().unwrap();
    // The reason takes room in the header: the address gives way from the front.
    assert!(header.contains("rank2.sock"), "{s}");
    assert!(
        header.contains("disconnected since") && header.contains("retrying: the program ended"),
        "{s}"
    );
    assert!(!s.contains("Processes"), "the table is not shown: {s}");

    // `q` in an open dashboard comes back to the table, and does not quit.
    key(&mut fleet, KeyCode::Char('q'));
    assert_eq!(fleet.open, None);
    assert!(!fleet.quit);
    assert!(screen(&mut fleet, 120, 40).contains("Processes"));

    // Up and Enter open rank1, whose header shows its figures; Esc comes back.
    key(&mut fleet, KeyCode::Up);
    key(&mut fleet, KeyCode::Enter);
    assert_eq!(fleet.open, Some(1));
    let s = screen(&mut fleet, 120, 40);
    assert!(
        s.lines().next().unwrap().contains("in-process rank1"),
        "{s}"
    );
    assert!(s.contains(&format_bytes(512 * MIB)), "{s}");
    assert!(s.contains("Esc or q: back to the 3 processes"), "{s}");
    key(&mut fleet, KeyCode::Esc);
    assert_eq!(fleet.open, None);
    assert!(!fleet.quit);

    // Ctrl-C quits even from an open dashboard; `q` at the table quits.
    key(&mut fleet, KeyCode::Enter);
    fleet.handle_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
    assert!(fleet.quit);
    fleet.quit = false;
    fleet.open = None;
    key(&mut fleet, KeyCode::Char('q'));
    assert!(fleet.quit);
}

/// Ticks the fleet until `done` holds, failing after 20 seconds.
fn tick_until(fleet: &mut Fleet, what: &str, mut done: impl FnMut(&Fleet) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done(fleet) {
        assert!(Instant::now() < deadline, "never: {what}");
        fleet.tick();
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn two_live_publishers_are_followed_and_one_that_leaves_comes_back() {
    let dir = std::env::temp_dir().join(format!("vramscope-tui-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let addrs = [dir.join("rank0.sock"), dir.join("rank1.sock")].map(TelemetryAddr::Unix);
    let a0 = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let a1 = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let b0 = a0.alloc(2 * MIB).unwrap();
    let b1 = a1.alloc(6 * MIB).unwrap();
    let t0 = Telemetry::serve(&a0, &addrs[0]).unwrap();
    let _t1 = Telemetry::serve(&a1, &addrs[1]).unwrap();

    let mut fleet = Fleet::live(addrs.to_vec());
    fleet.theme = Theme::plain();
    tick_until(&mut fleet, "both histories arrive", |f| {
        let r = f.rows();
        r[0].allocated == 2 * MIB && r[1].allocated == 6 * MIB
    });
    assert!(fleet.rows().iter().all(|r| r.link == "up"));
    let s = screen(&mut fleet, 120, 40);
    assert!(s.contains("2 processes, 2 up"), "{s}");
    assert!(
        line_of(&s, "rank0.sock").contains(&format_bytes(2 * MIB)),
        "{s}"
    );
    assert!(
        line_of(&s, "rank1.sock").contains(&format_bytes(6 * MIB)),
        "{s}"
    );

    // rank0 goes away: its row says so, rank1's does not.
    drop(t0);
    tick_until(&mut fleet, "the loss is noticed", |f| f.rows()[0].down);
    assert!(!fleet.rows()[1].down);
    assert!(matches!(
        fleet.members[0].app.data.link_state,
        Link::Down { .. }
    ));
    let s = screen(&mut fleet, 120, 40);
    assert!(line_of(&s, "rank0.sock").contains("down: "), "{s}");

    // It comes back, holding more, and the fleet reconnects by itself.
    let more = a0.alloc(MIB).unwrap();
    let _t0 = Telemetry::serve(&a0, &addrs[0]).unwrap();
    tick_until(&mut fleet, "rank0 reconnects", |f| {
        let r = &f.rows()[0];
        r.link == "up" && r.allocated == 3 * MIB
    });
    drop((b0, b1, more));
    std::fs::remove_dir_all(dir).ok();
}
