//! vramscope-analysis: what a memory trace says, as data.
//!
//! The importers (`vramscope_import`) turn a file into the one model of `vramscope_model`; this
//! crate reads that model through the engine (`vramscope_engine`) and answers every question a
//! reader asks of it. [`model_view`] is the analysed view of one snapshot (timeline, peaks,
//! holdings, steps, stacks); the detectors ([`detect`]) are pure functions of that view that
//! report findings into a sink; [`checks`] turns them into test assertions; [`report`] gathers
//! findings, statistics, top sites and the HTML explorer's data ([`explorer`]) into a
//! [`report::Report`]; [`diff`] compares two snapshots by call site and [`ranks`] the
//! snapshots of a distributed job's ranks. [`categories`] says what every block is made of
//! (parameters, gradients, optimizer state, activations, ...), and [`call_tree`] by the
//! user's call tree at one moment.
//!
//! Nothing here prints: the render crate (`vramscope_render`) formats what this crate returns,
//! and the dashboard (`vramscope-tui`) draws it. Architecture invariant: this crate depends on
//! the model, the engine, the replay (for block sizes) and the importers, never on a printer or
//! a writer.

pub mod call_tree;
pub mod categories;
pub mod checks;
pub mod detect;
pub mod diff;
pub mod explorer;
pub mod model_view;
pub mod ranks;
pub mod report;
