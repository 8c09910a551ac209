//! Tests of the live telemetry publisher and client (`vramscope_allocator::telemetry`): what a
//! dashboard receives, private sockets, loopback-only TCP, several dashboards, a dashboard that
//! disconnects mid-frame, malformed and oversized frames, a slow consumer whose lost events are
//! counted while the application runs on, reconnecting to a restarted publisher, and
//! connections that never read, which time out or give up their place to a dashboard.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use vramscope_allocator::{CachingAllocator, SimDevice};
use vramscope_allocator::{ServeOptions, Telemetry};
use vramscope_model::{AllocatorConfig, EventKind};
use vramscope_telemetry::{
    wire::encode_events, wire::encode_frame, wire::HEADER_BYTES, wire::MAX_FRAME_BYTES, Frame,
    FrameKind, FrameReader, TelemetryAddr, TelemetryClient, TelemetryError,
};

fn socket_path(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("vramscope-telemetry-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(format!("{name}.sock"))
}

fn allocator() -> CachingAllocator<SimDevice> {
    CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default())
}

/// Reads frames until `want` matches one, failing after 20 seconds.
fn read_until(client: &mut TelemetryClient, mut want: impl FnMut(&Frame) -> bool) -> Frame {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        assert!(Instant::now() < deadline, "the expected frame never came");
        let frame = client.next_frame().expect("a frame");
        if want(&frame) {
            return frame;
        }
    }
}

/// Reads the attach sequence: `Hello`, then the snapshot.
fn attach(client: &mut TelemetryClient) -> (u64, Box<vramscope_model::Snapshot>) {
    assert!(matches!(client.next_frame().unwrap(), Frame::Hello(_)));
    match client.next_frame().unwrap() {
        Frame::Snapshot { next_seq, snapshot } => (next_seq, snapshot),
        other => panic!("expected a snapshot, got {other:?}"),
    }
}

#[test]
fn a_dashboard_gets_hello_snapshot_history_events_tables_stats_and_bye() {
    let alloc = allocator();
    let early = alloc.alloc(4096).unwrap();
    alloc.mark_step();
    let path = socket_path("basic");
    let telemetry = Telemetry::serve(&alloc, &TelemetryAddr::Unix(path.clone())).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the socket is private");

    let mut client = TelemetryClient::connect(telemetry.addr()).unwrap();
    match client.next_frame().unwrap() {
        Frame::Hello(hello) => {
            assert_eq!(hello.pid, std::process::id());
            assert_eq!(hello.device.capacity, 1 << 34);
            assert_eq!(hello.device.backend, "sim");
        }
        other => panic!("expected hello, got {other:?}"),
    }
    let (next_seq, snapshot) = match client.next_frame().unwrap() {
        Frame::Snapshot { next_seq, snapshot } => (next_seq, snapshot),
        other => panic!("expected a snapshot, got {other:?}"),
    };
    // The history holds what happened before the dashboard attached.
    let kinds: Vec<EventKind> = snapshot.events.iter().map(|e| e.kind).collect();
    assert!(kinds.contains(&EventKind::Alloc) && kinds.contains(&EventKind::Step));
    assert_eq!(snapshot.events.last().unwrap().seq + 1, next_seq);
    assert_eq!(snapshot.segments.len(), 1);
    assert!(!snapshot.sites.is_empty());

    // A new call site: the tables come before the events that use it.
    let late = alloc.tagged("late").alloc(8 << 20).unwrap();
    let mut saw_tables = false;
    let events = loop {
        match client.next_frame().unwrap() {
            Frame::Tables(t) => {
                assert!(t.tags.iter().any(|tag| tag == "late"));
                saw_tables = true;
            }
            Frame::Events(events) if events.iter().any(|e| e.size >= 8 << 20) => break events,
            Frame::Events(events) => assert!(events.iter().all(|e| e.seq >= next_seq)),
            Frame::Stats(_) => {}
            other => panic!("unexpected frame {other:?}"),
        }
    };
    assert!(saw_tables, "tables announced before use");
    assert!(events.iter().all(|e| e.seq >= next_seq), "no event twice");
    let stats = read_until(&mut client, |f| matches!(f, Frame::Stats(_)));
    let Frame::Stats(stats) = stats else {
        unreachable!()
    };
    assert_eq!(stats.dropped_events, 0);
    assert!(stats.stats.allocated_bytes.all.current >= 8 << 20);
    assert_eq!(stats.step, 1);

    drop((early, late));
    telemetry.shutdown();
    read_until(&mut client, |f| matches!(f, Frame::Bye));
    assert!(matches!(client.next_frame(), Err(TelemetryError::Closed)));
    assert!(!path.exists(), "the socket is removed on shutdown");
}

#[test]
fn tcp_is_loopback_only_unless_allowed() {
    let alloc = allocator();
    let open = TelemetryAddr::parse("tcp:0.0.0.0:0").unwrap();
    assert!(matches!(
        Telemetry::serve(&alloc, &open),
        Err(TelemetryError::NotLoopback(_))
    ));
    let telemetry =
        Telemetry::serve(&alloc, &TelemetryAddr::parse("tcp:127.0.0.1:0").unwrap()).unwrap();
    let TelemetryAddr::Tcp(bound) = telemetry.addr() else {
        panic!("tcp")
    };
    assert_ne!(bound.port(), 0, "the chosen port is reported");
    let mut client = TelemetryClient::connect(telemetry.addr()).unwrap();
    attach(&mut client);
}

#[test]
fn several_dashboards_see_the_same_events() {
    let alloc = allocator();
    let path = socket_path("several");
    let telemetry = Telemetry::serve(&alloc, &TelemetryAddr::Unix(path)).unwrap();
    let mut a = TelemetryClient::connect(telemetry.addr()).unwrap();
    let mut b = TelemetryClient::connect(telemetry.addr()).unwrap();
    attach(&mut a);
    attach(&mut b);
    let buf = alloc.alloc(3 << 20).unwrap();
    for client in [&mut a, &mut b] {
        read_until(
            client,
            |f| matches!(f, Frame::Events(e) if e.iter().any(|e| e.kind == EventKind::Alloc && e.size == 3 << 20)),
        );
    }
    drop(buf);
    assert_eq!(telemetry.stats().clients, 2);
}

#[test]
fn a_dashboard_that_disconnects_mid_frame_costs_nothing() {
    let alloc = allocator();
    let path = socket_path("midframe");
    let telemetry = Telemetry::serve(&alloc, &TelemetryAddr::Unix(path.clone())).unwrap();
    // A raw connection that reads part of the first frame and hangs up.
    {
        let mut raw = UnixStream::connect(&path).unwrap();
        let mut half = [0u8; HEADER_BYTES + 3];
        raw.read_exact(&mut half).unwrap();
        assert_eq!(&half[..2], b"VS");
    }
    // The application goes on; a second dashboard still works.
    for _ in 0..1000 {
        drop(alloc.alloc(1 << 10).unwrap());
    }
    let mut client = TelemetryClient::connect(telemetry.addr()).unwrap();
    attach(&mut client);
    let buf = alloc.alloc(5 << 20).unwrap();
    read_until(
        &mut client,
        |f| matches!(f, Frame::Events(e) if e.iter().any(|e| e.size == 5 << 20)),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    while telemetry.stats().clients != 1 {
        assert!(
            Instant::now() < deadline,
            "the dead dashboard is never reaped"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(buf);

    // On the reading side, a stream cut inside a frame is `Truncated`, not a clean end.
    let frame = encode_events(&[]);
    let mut reader = FrameReader::new(&frame[..frame.len() - 1]);
    assert!(matches!(
        reader.next_frame(),
        Err(TelemetryError::Truncated { .. })
    ));
    let mut reader = FrameReader::new(&frame[..3]);
    assert!(matches!(
        reader.next_frame(),
        Err(TelemetryError::Truncated { .. })
    ));
}

#[test]
fn malformed_and_oversized_frames_are_rejected() {
    let read = |bytes: &[u8]| FrameReader::new(bytes).next_frame();

    let mut bad_magic = encode_frame(FrameKind::Bye, &[]);
    bad_magic[0] = b'X';
    assert!(matches!(read(&bad_magic), Err(TelemetryError::BadMagic(_))));

    let mut other_version = encode_frame(FrameKind::Bye, &[]);
    other_version[2] = 99;
    assert!(matches!(
        read(&other_version),
        Err(TelemetryError::Version(99))
    ));

    // An oversized length is refused from the header alone, before any payload is read.
    let mut oversized = encode_frame(FrameKind::Events, &[]);
    oversized[4..8].copy_from_slice(&((MAX_FRAME_BYTES + 1) as u32).to_le_bytes());
    assert!(matches!(
        read(&oversized),
        Err(TelemetryError::Oversized { .. })
    ));

    let mut events = encode_events(&[]);
    events[HEADER_BYTES..HEADER_BYTES + 4].copy_from_slice(&5u32.to_le_bytes());
    assert!(matches!(
        read(&events),
        Err(TelemetryError::Malformed {
            kind: FrameKind::Events,
            ..
        })
    ));

    let garbage = encode_frame(FrameKind::Stats, b"{not json");
    assert!(matches!(
        read(&garbage),
        Err(TelemetryError::Malformed {
            kind: FrameKind::Stats,
            ..
        })
    ));

    let snapshot = encode_frame(FrameKind::SnapshotEnd, b"{\"next_seq\": 1}");
    assert!(matches!(
        read(&snapshot),
        Err(TelemetryError::Malformed { .. })
    ));

    // A frame of an unknown kind is skipped: later versions may add kinds.
    let mut unknown = encode_frame(FrameKind::Bye, b"future");
    unknown[3] = 200;
    unknown.extend(encode_frame(FrameKind::Bye, &[]));
    assert!(matches!(read(&unknown), Ok(Frame::Bye)));
}

#[test]
fn a_slow_dashboard_loses_events_that_are_counted_while_the_app_runs_on() {
    let alloc = allocator();
    let path = socket_path("slow");
    let mut options = ServeOptions::default();
    options.client_queue_bytes = 64 << 10;
    let telemetry = Telemetry::serve_with(&alloc, &TelemetryAddr::Unix(path), options).unwrap();
    let mut client = TelemetryClient::connect(telemetry.addr()).unwrap();
    attach(&mut client);

    // The dashboard stops reading; the application allocates as fast as it can.
    let iterations = 200_000;
    for i in 0..iterations {
        let buf = alloc.alloc(512 + (i % 64) * 512).unwrap();
        drop(buf);
    }
    alloc.check_invariants().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while telemetry.stats().events_dropped == 0 {
        assert!(Instant::now() < deadline, "nothing was dropped");
        std::thread::sleep(Duration::from_millis(5));
    }
    let stats = telemetry.stats();
    assert!(stats.events_read > 0);
    assert!(
        stats.events_sent + stats.events_dropped <= stats.events_read + stats.ring_missed,
        "{stats:?}"
    );

    // When the dashboard reads again it is told what it lost and gets a fresh snapshot.
    let mut told = 0;
    let resynced = read_until(&mut client, |f| {
        if let Frame::Stats(s) = f {
            told = told.max(s.dropped_events);
        }
        matches!(f, Frame::Snapshot { .. })
    });
    let Frame::Snapshot { snapshot, .. } = resynced else {
        unreachable!()
    };
    assert_eq!(snapshot.segments.len(), alloc.snapshot().segments.len());
    let told = match read_until(&mut client, |f| matches!(f, Frame::Stats(_))) {
        Frame::Stats(s) => s.dropped_events.max(told),
        _ => unreachable!(),
    };
    assert!(told > 0, "the dashboard is told how many events it lost");
    assert!(telemetry.stats().snapshots >= 2);
}

#[test]
fn a_dashboard_reconnects_to_a_restarted_publisher() {
    let alloc = allocator();
    let path = socket_path("restart");
    let addr = TelemetryAddr::Unix(path.clone());
    let first = Telemetry::serve(&alloc, &addr).unwrap();
    let mut client = TelemetryClient::connect(&addr).unwrap();
    attach(&mut client);
    // A second publisher cannot take a live socket.
    assert!(matches!(
        Telemetry::serve(&alloc, &addr),
        Err(TelemetryError::InUse(_))
    ));
    drop(first);
    read_until(&mut client, |f| matches!(f, Frame::Bye));
    assert!(
        TelemetryClient::connect(&addr).is_err(),
        "nobody listens now"
    );

    let _second = Telemetry::serve(&alloc, &addr).unwrap();
    let mut client = TelemetryClient::connect(&addr).unwrap();
    let (_, snapshot) = attach(&mut client);
    assert!(snapshot
        .events
        .iter()
        .any(|e| e.kind == EventKind::Snapshot));
}

#[test]
fn a_stale_socket_is_replaced_but_another_file_is_never_touched() {
    let alloc = allocator();
    let path = socket_path("stale");
    {
        // A listener that goes away without removing its socket file.
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        drop(listener);
    }
    assert!(path.exists());
    let telemetry = Telemetry::serve(&alloc, &TelemetryAddr::Unix(path.clone())).unwrap();
    drop(telemetry);

    let file = socket_path("plain-file");
    std::fs::write(&file, b"precious").unwrap();
    assert!(Telemetry::serve(&alloc, &TelemetryAddr::Unix(file.clone())).is_err());
    assert_eq!(std::fs::read(&file).unwrap(), b"precious");
    std::fs::remove_file(file).unwrap();
}

#[test]
fn a_dashboard_turned_away_is_told_why() {
    let alloc = allocator();
    let mut options = ServeOptions::default();
    options.max_clients = 1;
    let telemetry =
        Telemetry::serve_with(&alloc, &TelemetryAddr::Unix(socket_path("full")), options).unwrap();
    let mut first = TelemetryClient::connect(telemetry.addr()).unwrap();
    attach(&mut first);
    let mut second = TelemetryClient::connect(telemetry.addr()).unwrap();
    assert!(matches!(second.next_frame().unwrap(), Frame::Hello(_)));
    match second.next_frame() {
        Err(e @ TelemetryError::Refused(_)) => {
            let text = e.to_string();
            assert!(text.contains("max_clients") && text.contains('1'), "{text}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while telemetry.stats().clients_refused == 0 {
        assert!(Instant::now() < deadline, "the refusal was not counted");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn dashboards_that_never_read_hold_no_more_than_their_bound() {
    let alloc = allocator();
    // A long history, so that the attach snapshot alone would pass the bound uncut.
    for i in 0..20_000u64 {
        drop(alloc.alloc(512 + (i % 64) * 512).unwrap());
    }
    let bound = 256 << 10;
    let mut options = ServeOptions::default();
    options.client_queue_bytes = bound;
    let telemetry =
        Telemetry::serve_with(&alloc, &TelemetryAddr::Unix(socket_path("idle")), options).unwrap();
    // Sockets that connect and never read.
    let TelemetryAddr::Unix(path) = telemetry.addr().clone() else {
        unreachable!()
    };
    let idle: Vec<UnixStream> = (0..4)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while telemetry.stats().clients < 4 || telemetry.stats().snapshots == 0 {
        assert!(Instant::now() < deadline, "the clients never attached");
        std::thread::sleep(Duration::from_millis(5));
    }
    for i in 0..200_000u64 {
        drop(alloc.alloc(512 + (i % 64) * 512).unwrap());
    }
    while telemetry.stats().events_dropped == 0 {
        assert!(
            Instant::now() < deadline,
            "nothing was counted as dropped: {:?}",
            telemetry.stats()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(200));
    let stats = telemetry.stats();
    // Every byte queued counts: at most the bound per client, plus one statistics frame.
    let slack = 16 << 10;
    assert!(
        stats.queued_bytes <= 4 * (bound as u64 + slack),
        "{} bytes queued for 4 clients with a bound of {bound}: {stats:?}",
        stats.queued_bytes
    );
    drop(idle);
}

#[test]
fn connection_churn_shares_rate_limited_snapshots() {
    let alloc = allocator();
    drop(alloc.alloc(4096).unwrap());
    let mut options = ServeOptions::default();
    options.attach_interval = Duration::from_secs(3600);
    options.max_clients = 100;
    let telemetry =
        Telemetry::serve_with(&alloc, &TelemetryAddr::Unix(socket_path("churn")), options).unwrap();
    let mut first = TelemetryClient::connect(telemetry.addr()).unwrap();
    attach(&mut first);
    assert_eq!(telemetry.stats().snapshots, 1);
    // Fifty clients come and go: none of them costs the program a snapshot within the
    // attach interval.
    for _ in 0..50 {
        let mut client = TelemetryClient::connect(telemetry.addr()).unwrap();
        assert!(matches!(client.next_frame().unwrap(), Frame::Hello(_)));
    }
    std::thread::sleep(Duration::from_millis(300));
    let stats = telemetry.stats();
    assert_eq!(stats.snapshots, 1, "{stats:?}");
    assert!(stats.clients_total >= 51);
}

/// Connects `n` Unix sockets to `telemetry` that never read, and waits until all are attached.
fn idle_connections(telemetry: &Telemetry, n: usize) -> Vec<UnixStream> {
    let TelemetryAddr::Unix(path) = telemetry.addr().clone() else {
        unreachable!()
    };
    let idle: Vec<UnixStream> = (0..n)
        .map(|_| UnixStream::connect(&path).unwrap())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    while telemetry.stats().clients < n as u64 {
        assert!(Instant::now() < deadline, "the idle clients never attached");
        std::thread::sleep(Duration::from_millis(5));
    }
    idle
}

#[test]
fn idle_connections_time_out_and_a_dashboard_attaches_past_sixteen_of_them() {
    let alloc = allocator();
    drop(alloc.alloc(4096).unwrap());
    let mut options = ServeOptions::default();
    // Long enough that a reading dashboard is never taken for idle on a loaded machine (a
    // test thread can be off the CPU for a few hundred milliseconds), short enough to wait.
    options.idle_timeout = Duration::from_millis(1000);
    let telemetry = Telemetry::serve_with(
        &alloc,
        &TelemetryAddr::Unix(socket_path("idle-timeout")),
        options,
    )
    .unwrap();
    let idle = idle_connections(&telemetry, 16);
    assert_eq!(telemetry.stats().clients_refused, 0);

    // Every place is taken by a connection that reads nothing; each is closed at its limit,
    // and a dashboard attaches.
    let deadline = Instant::now() + Duration::from_secs(20);
    while telemetry.stats().clients_idle < 16 {
        assert!(
            Instant::now() < deadline,
            "the idle clients were not closed: {:?}",
            telemetry.stats()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut dashboard = TelemetryClient::connect(telemetry.addr()).unwrap();
    attach(&mut dashboard);
    assert_eq!(
        telemetry.stats().clients_refused,
        0,
        "nobody was turned away"
    );
    for mut conn in idle {
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut taken = Vec::new();
        conn.read_to_end(&mut taken)
            .expect("the publisher closed the idle connection");
    }

    // The dashboard, which reads, outlives the idle limit several times over.
    let reading_until = Instant::now() + Duration::from_millis(3000);
    let mut stats_frames = 0;
    while Instant::now() < reading_until {
        if let Frame::Stats(_) = dashboard
            .next_frame()
            .expect("the dashboard stays attached")
        {
            stats_frames += 1;
        }
    }
    assert!(stats_frames >= 5, "{stats_frames} statistics frames in 3 s");
    let stats = telemetry.stats();
    assert_eq!(stats.clients, 1, "{stats:?}");
    assert_eq!(stats.clients_idle, 16, "{stats:?}");
}

#[test]
fn a_dashboard_takes_the_place_of_a_connection_that_reads_nothing() {
    let alloc = allocator();
    // The default settings: idle connections are closed after 10 s, but one that has read
    // nothing for a second gives up its place to a newcomer.
    let telemetry = Telemetry::serve_with(
        &alloc,
        &TelemetryAddr::Unix(socket_path("idle-room")),
        ServeOptions::default(),
    )
    .unwrap();
    let _idle = idle_connections(&telemetry, 16);
    std::thread::sleep(Duration::from_millis(1300));
    let mut dashboard = TelemetryClient::connect(telemetry.addr()).unwrap();
    attach(&mut dashboard);
    let stats = telemetry.stats();
    assert_eq!(stats.clients_idle, 1, "{stats:?}");
    assert_eq!(stats.clients_refused, 0, "{stats:?}");
    assert_eq!(stats.clients, 16, "{stats:?}");
}
