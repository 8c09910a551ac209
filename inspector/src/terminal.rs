//! Text from a file on its way to a terminal, a text file or a CI log: the one sanitizer,
//! [`vramscope_model::terminal`], under the name the inspector's callers (the command line,
//! the dashboard, the Python package) have always used. It lives in the model crate so that
//! the replay, which does not depend on the inspector, escapes its names with the same
//! function.

pub use vramscope_model::terminal::*;
