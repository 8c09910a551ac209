//! Fuzzes the exporters on whatever imports: the PyTorch pickle (from the model, and with the
//! extras read again from the input when it is a pickle), which must import again, and the
//! streamed Perfetto JSON, which must parse. Sums past 2^64 must be errors, never a wrap or a
//! panic (overflow checks are on in this crate's profiles).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vramscope_export::{
    to_perfetto, to_pytorch_pickle, to_pytorch_pickle_with, PytorchExtras,
};
use vramscope_import::{load_bytes, ImportOptions};
use vramscope_pickle::Document;

fuzz_target!(|data: &[u8]| {
    let options = ImportOptions::default();
    let Ok(snapshot) = load_bytes(data, "fuzz", &options) else {
        return;
    };
    if let Ok(bytes) = to_pytorch_pickle(&snapshot) {
        load_bytes(&bytes, "export", &options).expect("an exported pickle imports again");
    }
    let doc = Document::parse(data).ok();
    let extras = doc.as_ref().and_then(PytorchExtras::from_document);
    if let Ok(bytes) = to_pytorch_pickle_with(&snapshot, extras.as_ref()) {
        let _ = vramscope_pickle::parse(&bytes).expect("the export is a pickle");
    }
    if let Ok(json) = to_perfetto(&snapshot) {
        serde_json::from_str::<serde_json::Value>(&json).expect("the export is JSON");
    }
});
