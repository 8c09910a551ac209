//! Loading a file for the text commands (`report`, `summary`, `convert`, `replay`, `diff`),
//! with a progress line on standard error while a big file loads.
//!
//! The importer reports its stage and how much of it is done into an
//! `vramscope_import::Progress`; when standard error is a terminal and the file is big
//! enough to take a while, a thread here rewrites one line of standard error with that state
//! a few times a second, and erases it once the file is loaded, so that the report itself (on
//! standard output) is never interleaved with it. Otherwise the file is loaded as it is.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::import::{self, ImportError, ImportOptions, Progress};
use crate::Snapshot;

/// Files smaller than this load in well under a second: no progress line.
const SHOW_PROGRESS_FROM_BYTES: u64 = 32 << 20;

/// How often the progress line is rewritten.
const REDRAW_EVERY: Duration = Duration::from_millis(250);

/// Imports `path` as `import::load` does, showing a progress line on standard error while a
/// big file loads when standard error is a terminal.
pub fn load(path: &Path) -> Result<Snapshot, ImportError> {
    load_with(path, ImportOptions::default())
}

/// [`load`] with `options` (a progress record of their own is replaced by the line's).
pub fn load_with(path: &Path, mut options: ImportOptions) -> Result<Snapshot, ImportError> {
    let big = std::fs::metadata(path).is_ok_and(|m| m.len() >= SHOW_PROGRESS_FROM_BYTES);
    if !big || !std::io::stderr().is_terminal() {
        return import::load_with(path, &options);
    }
    let progress = Progress::new();
    options.progress = Some(progress.clone());
    let done = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let painter = scope.spawn(|| {
            let mut stderr = std::io::stderr();
            while !done.load(Ordering::Relaxed) {
                // `\r` and erase-line: the line is rewritten in place.
                let _ = write!(stderr, "\r\x1b[2K{}", progress.state());
                let _ = stderr.flush();
                std::thread::park_timeout(REDRAW_EVERY);
            }
            let _ = write!(stderr, "\r\x1b[2K");
            let _ = stderr.flush();
        });
        let loaded = import::load_with(path, &options);
        done.store(true, Ordering::Relaxed);
        painter.thread().unpark();
        loaded
    })
}
