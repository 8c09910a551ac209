//! Discovery of publishers' default sockets with `XDG_RUNTIME_DIR` unset (issue 33): the
//! folder in the shared temporary directory is read only when it passes the publisher's own
//! check. The one test of this file sets the environment of its process, so it lives alone.

use std::os::unix::fs::PermissionsExt;

use vramscope_telemetry::TelemetryAddr;

#[test]
fn the_shared_default_folder_is_read_only_when_private() {
    let tmp = std::env::temp_dir().join(format!("vramscope-discovery-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::env::remove_var("XDG_RUNTIME_DIR");
    std::env::set_var("TMPDIR", &tmp);
    std::env::set_var("USER", "alice");
    let dir = tmp.join("vramscope-alice");
    assert_eq!(TelemetryAddr::default_dir(), dir);
    // No folder: nothing found, and nothing wrong.
    assert_eq!(TelemetryAddr::discover_checked().unwrap(), Vec::new());

    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("vramscope-42.sock"), b"").unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = TelemetryAddr::discover_checked().unwrap_err().to_string();
    assert!(err.contains("open to other users"), "{err}");
    assert!(err.contains(&dir.display().to_string()), "{err}");
    assert!(TelemetryAddr::discover().is_empty(), "skipped");

    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(
        TelemetryAddr::discover(),
        vec![TelemetryAddr::Unix(dir.join("vramscope-42.sock"))]
    );
    std::fs::remove_dir_all(&tmp).ok();
}
