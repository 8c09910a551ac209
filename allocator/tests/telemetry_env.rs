//! `VRAMSCOPE_LISTEN` starts a live telemetry publisher, and `off` starts none. The one test
//! of this file sets the environment of its process, so it lives alone in its own binary
//! (setting a variable while another test thread reads the environment is undefined
//! behaviour).

use std::path::PathBuf;

use vramscope_allocator::Telemetry;
use vramscope_allocator::{CachingAllocator, SimDevice};
use vramscope_model::AllocatorConfig;
use vramscope_telemetry::{Frame, TelemetryAddr, TelemetryClient};

#[test]
fn vramscope_listen_starts_a_publisher() {
    let alloc = CachingAllocator::new(SimDevice::phantom(1 << 34), AllocatorConfig::default());
    let dir = std::env::temp_dir().join(format!("vramscope-telemetry-env-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("env.sock");
    std::env::set_var("VRAMSCOPE_LISTEN", format!("unix:{}", path.display()));
    let telemetry = Telemetry::from_env(&alloc).unwrap().expect("a publisher");
    std::env::set_var("VRAMSCOPE_LISTEN", "off");
    assert!(Telemetry::from_env(&alloc).unwrap().is_none());
    std::env::remove_var("VRAMSCOPE_LISTEN");
    assert_eq!(telemetry.addr(), &TelemetryAddr::Unix(path));
    let mut client = TelemetryClient::connect(telemetry.addr()).unwrap();
    assert!(matches!(client.next_frame().unwrap(), Frame::Hello(_)));
    assert!(matches!(
        client.next_frame().unwrap(),
        Frame::Snapshot { .. }
    ));
    drop(client);
    drop(telemetry);
    std::fs::remove_dir_all(&dir).ok();
}
