//! Where the PyTorch recordings of `testkit/data/torch_h200` are, and what PyTorch counted for
//! each (`expected.json`), for the tests that replay and diagnose them.

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The folder of the recordings.
pub fn data() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/torch_h200")
}

/// `expected.json`: per recording, how it was made and what PyTorch's `memory_stats()` said.
pub fn expected() -> serde_json::Map<String, Value> {
    let text = std::fs::read_to_string(data().join("expected.json")).unwrap();
    serde_json::from_str::<Value>(&text)
        .unwrap()
        .as_object()
        .unwrap()
        .clone()
}
