//! vramscope-inspector: turns a memory trace into a diagnosis.
//!
//! Importers (`import`) convert our JSON snapshots, PyTorch snapshot pickles and torch.profiler
//! Chrome traces into the one model of `vramscope_model`. Detectors (`detect`) are
//! pure functions of that model that report findings into a sink; `report` renders findings as
//! text, markdown, JSON or HTML, and `diff` compares two snapshots by call site.

pub mod import;

pub mod checks;
pub mod detect;
pub mod devices;
pub mod diff;

pub mod export;
pub mod html;
pub mod markdown;
pub mod model_view;
pub mod ranks;

pub mod report;
pub mod terminal;
