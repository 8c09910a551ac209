//! Importers: turn a file on disk into the one data model, [`vramscope_model::Snapshot`].
//!
//! [`load`] and [`load_bytes`] detect the format by content, not by file name: a pickle
//! (first byte `0x80`, the protocol opcode) is a PyTorch `_dump_snapshot()` file read by
//! [`pytorch`] through the safe reader of `vramscope_pickle`; gzip (magic `1f 8b`) is unpacked
//! within a size limit and detected again; a JSON object with `format_version` is vramscope's
//! own snapshot (`Snapshot::from_json_bytes` in the allocator crate); a JSON object with
//! `traceEvents`, or a JSON array, is a torch.profiler Chrome trace read by [`chrome`].
//! Detectors, reports and the dashboard only ever see the resulting `Snapshot`.
//!
//! Memory is freed as early as each format allows: [`load`] streams a pickle file into the
//! importer, which never holds it whole (`pytorch::from_pickle_file`; when that cannot be done
//! faithfully, the file's bytes are handed over, so that they are gone once read and before
//! they are converted), and gzip data is gone before what it unpacks to is converted. A gzipped Chrome trace is read as it is
//! unpacked, never whole; its unpacking errors and size limit take precedence over errors in
//! its JSON, as if it had been unpacked first. A gzipped PyTorch pickle is read as it is
//! unpacked too, never whole, and unpacking stops at the pickle's first error (a run of
//! `MARK`s that unpacks to 960 MiB is refused after a megabyte or two); the bounds that scale
//! with a pickle's size follow the bytes unpacked so far (`pytorch::from_pickle_reads`).
//!
//! Every failure is an [`ImportError`] that names the file and says what is wrong (and, for
//! pickles and JSON, where); no input makes an importer panic. [`ImportOptions`] carries the
//! choices a user can make on the command line: which paths count as framework code when a
//! call site is chosen from a stack, and how training steps are recognised.

#![warn(missing_docs)]

pub mod chrome;
pub mod event_log;
mod progress;
pub mod pytorch;
pub mod sites;
mod timeline;

use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use vramscope_model::{Snapshot, SnapshotError};

use vramscope_pickle::PickleError;

pub use progress::{Progress, ProgressState, Stage};

/// The largest file [`load`] reads by default, in bytes (4 GiB); [`default_max_input`] says
/// what the defaults of [`ImportOptions`] use in this process.
pub const MAX_FILE_BYTES: u64 = vramscope_pickle::DEFAULT_MAX_INPUT_BYTES as u64;

/// The most bytes a gzip file may unpack to by default (4 GiB, as for a file).
pub const MAX_DECOMPRESSED_BYTES: u64 = MAX_FILE_BYTES;

/// The environment variable that sets the largest input read (`8GiB`, `6000000000`, ...).
pub const MAX_INPUT_ENV: &str = "VRAMSCOPE_MAX_INPUT";

/// The ceiling set by [`set_default_max_input`]; 0 when none was set.
static MAX_INPUT_OVERRIDE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Sets the largest input (file, or what a gzip file unpacks to) that the defaults of
/// [`ImportOptions`] accept from now on in this process, over [`MAX_INPUT_ENV`]: what
/// a file command's `--max-input SIZE` does (`vramscope report --max-input 8GiB FILE`).
pub fn set_default_max_input(bytes: u64) {
    MAX_INPUT_OVERRIDE.store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
}

/// Forgets the value [`set_default_max_input`] set: the defaults go back to [`MAX_INPUT_ENV`]
/// or [`MAX_FILE_BYTES`] (a command line run again in the same process, as the Python
/// package's `vramscope` command is, without `--max-input`).
pub fn clear_default_max_input() {
    MAX_INPUT_OVERRIDE.store(0, std::sync::atomic::Ordering::Relaxed);
}

/// The largest input the defaults of [`ImportOptions`] accept: the value given to
/// [`set_default_max_input`], else [`MAX_INPUT_ENV`], else [`MAX_FILE_BYTES`]. A value of the
/// variable that is not a size is reported once on standard error and the default is used.
pub fn default_max_input() -> u64 {
    let set = MAX_INPUT_OVERRIDE.load(std::sync::atomic::Ordering::Relaxed);
    if set > 0 {
        return set;
    }
    let Some(text) = std::env::var_os(MAX_INPUT_ENV) else {
        return MAX_FILE_BYTES;
    };
    match vramscope_model::parse_bytes(&text.to_string_lossy()) {
        Ok(bytes) if bytes > 0 => bytes,
        _ => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                eprintln!(
                    "vramscope: ignoring {MAX_INPUT_ENV}={}: not a size such as 8GiB; the limit stays {MAX_FILE_BYTES} bytes",
                    text.to_string_lossy()
                )
            });
            MAX_FILE_BYTES
        }
    }
}

/// Choices that change how a file is imported.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImportOptions {
    /// Path fragments that mark a stack frame as framework code rather than the user's own:
    /// a fragment without a leading `/` matches at the start of a path component (`torch/`
    /// matches `/x/torch/nn.py` but not `/x/mytorch/nn.py`), one with a leading `/` matches
    /// anywhere. Matching ignores case and treats `\` as `/`. C++ frames (file `??`, a C/C++
    /// source, or line 0) and the Python standard library are always framework code. The call
    /// site of an allocation is the innermost frame that is not framework code, or the
    /// innermost frame when every frame is.
    pub framework_paths: Vec<String>,
    /// A function name whose allocations start a new training step (`--step-marker NAME`):
    /// each allocation whose stack contains a frame of that function, after one whose stack
    /// did not, begins a step. When set, it replaces steps taken from annotations.
    pub step_marker: Option<String>,
    /// The annotation name (or name prefix) whose `START` begins a step in a PyTorch snapshot.
    /// `None` picks the first family present of `ProfilerStep#`, `Optimizer.step#`,
    /// `Optimizer.zero_grad#` and `enumerate(DataLoader)#`, else the first annotated name.
    pub step_annotation: Option<String>,
    /// The largest file accepted, in bytes ([`default_max_input`] by default). The pickle
    /// reader's bounds on memory scale with the input's size below it (`vramscope_pickle::Limits`).
    pub max_file_bytes: u64,
    /// The most bytes a gzip file may unpack to ([`default_max_input`] by default).
    pub max_decompressed_bytes: u64,
    /// Where [`load_with`] reports how far it has got (the bytes of the file read, then, for a
    /// PyTorch pickle, the trace events replayed for block sizes), for a display to show;
    /// `None` by default.
    pub progress: Option<Progress>,
    /// Where the import of a PyTorch snapshot pickle puts what the model does not keep of it
    /// (`pytorch::KeptSource`), for a writer of PyTorch's format that gives the file back
    /// without reading it again; `None` by default. Left empty when the pickle was not
    /// streamed or holds what cannot be kept so.
    pub keep_source: Option<pytorch::SourceSlot>,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            framework_paths: sites::DEFAULT_FRAMEWORK_PATHS
                .iter()
                .map(|s| s.to_string())
                .collect(),
            step_marker: None,
            step_annotation: None,
            max_file_bytes: default_max_input(),
            max_decompressed_bytes: default_max_input(),
            progress: None,
            keep_source: None,
        }
    }
}

/// A file format [`load_bytes`] recognises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A PyTorch `_dump_snapshot()` pickle.
    PytorchPickle,
    /// A torch.profiler Chrome trace (JSON).
    ChromeTrace,
    /// vramscope's own JSON snapshot.
    VramscopeJson,
}

/// Why a file could not be imported.
#[derive(Debug)]
pub enum ImportErrorKind {
    /// Reading the file failed.
    Io(std::io::Error),
    /// The file or its unpacked content is larger than the limit.
    TooLarge {
        /// What is too large (`"file"`, `"unpacked gzip data"`).
        what: &'static str,
        /// The limit in bytes.
        limit: u64,
        /// The size found, when known (gzip data stops unpacking one byte past the limit).
        size: Option<u64>,
    },
    /// Unpacking gzip data failed.
    Gzip(std::io::Error),
    /// The content is not a format vramscope reads.
    UnknownFormat {
        /// What was found instead.
        found: String,
    },
    /// The pickle is corrupt, truncated, or not plain data.
    Pickle(PickleError),
    /// The JSON is malformed (with line and column).
    Json(serde_json::Error),
    /// The JSON nests arrays and objects deeper than the limit ([`chrome::MAX_JSON_DEPTH`])
    /// where the importer reads it.
    TooDeep {
        /// The most levels accepted.
        limit: usize,
        /// Line of the bracket that opens one level too many (of the unpacked data, for gzip).
        line: usize,
        /// Column of that bracket, from 1.
        column: usize,
    },
    /// A vramscope snapshot that could not be read.
    Snapshot(SnapshotError),
    /// The data parsed, but a field is missing or has the wrong type.
    Structure {
        /// Where, as a Python-style path (`device_traces[0][17].size`).
        path: String,
        /// What is wrong.
        message: String,
    },
}

/// An import failure: the file (or the origin name given to [`load_bytes`]) and what is wrong.
#[derive(Debug)]
pub struct ImportError {
    /// The file or origin name.
    pub origin: String,
    /// What is wrong.
    pub kind: ImportErrorKind,
}

impl ImportError {
    /// An error about `origin`.
    pub fn new(origin: &str, kind: ImportErrorKind) -> ImportError {
        ImportError {
            origin: origin.to_string(),
            kind,
        }
    }
}

/// An import error is one line, whatever the file holds: its name and every text it quotes
/// from the file (an unknown block state, serde's unknown variant) go through
/// [`vramscope_model::terminal::sanitize`], so that no line break, control or workflow command of the
/// file's reaches a terminal or a CI log, through the command line or a library caller.
impl fmt::Display for ImportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = Unescaped(self).to_string();
        f.write_str(&vramscope_model::terminal::sanitize(&text))
    }
}

/// An [`ImportError`] as written, before it is escaped.
struct Unescaped<'e>(&'e ImportError);

impl fmt::Display for Unescaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Unescaped(error) = self;
        write!(f, "{}: ", error.origin)?;
        match &error.kind {
            ImportErrorKind::Io(e) => write!(f, "cannot read: {e}"),
            ImportErrorKind::TooLarge { what, limit, size } => {
                let human = |b: u64| vramscope_pickle::human_bytes(b as usize);
                match size {
                    Some(size) => write!(f, "{what} is {size} bytes ({}), ", human(*size))?,
                    None => write!(f, "{what} is ")?,
                }
                write!(
                    f,
                    "larger than the limit of {limit} bytes ({}); raise it with --max-input SIZE or {MAX_INPUT_ENV}=SIZE",
                    human(*limit)
                )
            }
            ImportErrorKind::Gzip(e) => write!(f, "corrupt gzip data: {e}"),
            ImportErrorKind::UnknownFormat { found } => write!(
                f,
                "not a format vramscope reads (a PyTorch snapshot pickle, a Chrome trace, or a vramscope JSON snapshot): {found}"
            ),
            ImportErrorKind::Pickle(e) => write!(f, "{e}"),
            ImportErrorKind::Json(e) => write!(f, "invalid JSON: {e}"),
            ImportErrorKind::TooDeep {
                limit,
                line,
                column,
            } => write!(
                f,
                "JSON nested too deep: more than {limit} levels of arrays and objects, at line {line} column {column}"
            ),
            ImportErrorKind::Snapshot(e) => match e {
                SnapshotError::Io { source, .. } => write!(f, "cannot read: {source}"),
                SnapshotError::Format { message, .. } => {
                    write!(f, "not a valid vramscope snapshot: {message}")
                }
                SnapshotError::Version { found, .. } => write!(
                    f,
                    "snapshot format version {found} is newer than this build reads ({})",
                    vramscope_model::FORMAT_VERSION
                ),
                other => write!(f, "{other}"),
            },
            ImportErrorKind::Structure { path, message } => {
                if path.is_empty() {
                    write!(f, "{message}")
                } else {
                    write!(f, "at {path}: {message}")
                }
            }
        }
    }
}

impl std::error::Error for ImportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ImportErrorKind::Io(e) | ImportErrorKind::Gzip(e) => Some(e),
            ImportErrorKind::Pickle(e) => Some(e),
            ImportErrorKind::Json(e) => Some(e),
            ImportErrorKind::Snapshot(e) => Some(e),
            _ => None,
        }
    }
}

/// Reads and imports the file at `path` with default options.
///
/// This is the entry point benchmarks time: it reads the file, detects its format and
/// converts it.
pub fn load(path: impl AsRef<Path>) -> Result<Snapshot, ImportError> {
    load_with(path, &ImportOptions::default())
}

/// Reads and imports the file at `path` with `options`.
pub fn load_with(path: impl AsRef<Path>, options: &ImportOptions) -> Result<Snapshot, ImportError> {
    let origin = path.as_ref().display().to_string();
    load_file(path.as_ref(), &origin, options).and_then(|s| in_range(s, &origin))
}

/// Fails when a snapshot names a device past [`vramscope_model::MAX_DEVICES`], naming the
/// field: every importer's result passes through here.
fn in_range(snapshot: Snapshot, origin: &str) -> Result<Snapshot, ImportError> {
    match snapshot.device_out_of_range() {
        None => Ok(snapshot),
        Some((path, device)) => Err(ImportError::new(
            origin,
            ImportErrorKind::Structure {
                path,
                message: vramscope_model::device_refusal(device.into()),
            },
        )),
    }
}

fn load_file(path: &Path, origin: &str, options: &ImportOptions) -> Result<Snapshot, ImportError> {
    let io = |e| ImportError::new(origin, ImportErrorKind::Io(e));
    // Checked before the file is opened: opening a FIFO with no writer blocks for ever.
    not_a_file(&std::fs::metadata(path).map_err(io)?).map_err(io)?;
    let file = std::fs::File::open(path).map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    not_a_file(&meta).map_err(io)?;
    let size = meta.len();
    let too_large = |size: u64| {
        ImportError::new(
            origin,
            ImportErrorKind::TooLarge {
                what: "file",
                limit: options.max_file_bytes,
                size: Some(size),
            },
        )
    };
    if size > options.max_file_bytes {
        return Err(too_large(size));
    }
    if let Some(progress) = &options.progress {
        progress.begin(Stage::Reading, size);
    }
    if starts_with(&file, PICKLE_PROTOCOL).map_err(io)? {
        if let Some(result) = pytorch::from_pickle_file(&file, size, origin, options) {
            return result;
        }
        (&file).seek(SeekFrom::Start(0)).map_err(io)?;
    }
    // Sniffed before the file is read whole: a 2 GB file of zeros is refused after its
    // first bytes, as it would be after all of them.
    if let Some(found) = unknown_start(&file).map_err(io)? {
        return Err(ImportError::new(
            origin,
            ImportErrorKind::UnknownFormat { found },
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    // The file may grow while it is read; `take` keeps the limit regardless.
    file.take(options.max_file_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > options.max_file_bytes {
        return Err(too_large(bytes.len() as u64));
    }
    if let Some(progress) = &options.progress {
        // The file is in memory; decoding it is the rest of this stage, with no measure of
        // its own.
        progress.set(bytes.len() as u64, bytes.len() as u64);
    }
    load_vec(bytes, origin, options)
}

/// An error unless `meta` is a regular file's: a FIFO, a socket or a device is refused, saying
/// which, before it is read (a FIFO with no writer would block the reader for ever, a device
/// such as `/dev/zero` never ends); a directory too.
fn not_a_file(meta: &std::fs::Metadata) -> std::io::Result<()> {
    if meta.is_file() {
        return Ok(());
    }
    #[cfg(unix)]
    let kind = {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            "a FIFO (named pipe)"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else if t.is_dir() {
            "a directory"
        } else {
            "something other than a file"
        }
    };
    #[cfg(not(unix))]
    let kind = if meta.is_dir() {
        "a directory"
    } else {
        "something other than a file"
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("not a regular file but {kind}: vramscope reads snapshot files; save the data to a file first"),
    ))
}

/// The first byte of a pickle of protocol 2 or later (the `PROTO` opcode), which
/// [`detect`] reads as a PyTorch snapshot.
const PICKLE_PROTOCOL: u8 = 0x80;

/// Whether `file` begins with `byte`; leaves it at its start.
fn starts_with(mut file: &std::fs::File, byte: u8) -> std::io::Result<bool> {
    let mut first = [0u8; 1];
    let read = file.read(&mut first)?;
    file.seek(SeekFrom::Start(0))?;
    Ok(read == 1 && first[0] == byte)
}

/// How much of a file [`unknown_start`] reads at a time.
const SNIFF_BYTES: u64 = 64 << 10;

/// When the start of `file` is no format [`detect`] knows (nor gzip), what it starts with, as
/// [`load_plain`] would say it after reading the whole; `None` when it may be one. Reads only
/// the first piece, and beyond it only while a byte-order mark and whitespace go on (before a
/// JSON document), keeping one piece at a time; leaves the file at its start.
fn unknown_start(mut file: impl Read + Seek) -> std::io::Result<Option<String>> {
    let mut head = Vec::new();
    (&mut file).take(SNIFF_BYTES).read_to_end(&mut head)?;
    let found = if is_gzip(&head) || head.first() == Some(&PICKLE_PROTOCOL) {
        None
    } else {
        let mut piece = head.strip_prefix(b"\xef\xbb\xbf").unwrap_or(&head).to_vec();
        loop {
            if let Some(&first) = piece.iter().find(|b| !b.is_ascii_whitespace()) {
                break (!matches!(first, b'{' | b'[')).then(|| describe_start(&head));
            }
            piece.clear();
            if (&mut file).take(SNIFF_BYTES).read_to_end(&mut piece)? == 0 {
                // Whitespace to the end: no document at all.
                break Some(describe_start(&head));
            }
        }
    };
    file.seek(SeekFrom::Start(0))?;
    Ok(found)
}

/// Imports a file already in memory; `origin` names it in errors.
pub fn load_bytes(
    bytes: &[u8],
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    check_size(bytes, origin, options)?;
    let snapshot = if is_gzip(bytes) {
        match unpack(bytes, origin, options)? {
            Unpacked::Done(snapshot) => *snapshot,
            Unpacked::Plain(unpacked) => load_plain_vec(unpacked, origin, options)?,
        }
    } else {
        load_plain(bytes, origin, options)?
    };
    in_range(snapshot, origin)
}

/// Like [`load_bytes`], but takes the bytes over so that they can be freed as soon as they
/// are read: a pickle's bytes are gone before its conversion begins, and gzip data before
/// what it unpacks to is converted.
fn load_vec(
    bytes: Vec<u8>,
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    check_size(&bytes, origin, options)?;
    if is_gzip(&bytes) {
        let unpacked = unpack(&bytes, origin, options)?;
        drop(bytes);
        return match unpacked {
            Unpacked::Done(snapshot) => Ok(*snapshot),
            Unpacked::Plain(unpacked) => load_plain_vec(unpacked, origin, options),
        };
    }
    load_plain_vec(bytes, origin, options)
}

fn check_size(bytes: &[u8], origin: &str, options: &ImportOptions) -> Result<(), ImportError> {
    if bytes.len() as u64 > options.max_file_bytes {
        return Err(ImportError::new(
            origin,
            ImportErrorKind::TooLarge {
                what: "file",
                limit: options.max_file_bytes,
                size: Some(bytes.len() as u64),
            },
        ));
    }
    Ok(())
}

/// Detects the format of (unpacked) content, without converting it.
pub fn detect(bytes: &[u8]) -> Option<Format> {
    match bytes.first()? {
        &PICKLE_PROTOCOL => Some(Format::PytorchPickle),
        _ => match json_start(bytes)? {
            b'[' => Some(Format::ChromeTrace),
            _ if starts_with_key(bytes, "format_version") => Some(Format::VramscopeJson),
            _ => Some(Format::ChromeTrace),
        },
    }
}

fn load_plain(
    bytes: &[u8],
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    match detect(bytes) {
        Some(Format::PytorchPickle) => pytorch::from_pickle_bytes(bytes, origin, options),
        Some(Format::VramscopeJson) => own_snapshot(bytes, origin),
        // A JSON object whose first key is not `format_version` is read as a Chrome trace,
        // which recognises a vramscope snapshot with its keys in another order.
        Some(Format::ChromeTrace) => match chrome::read(bytes, origin, options)? {
            chrome::Read::Trace(snapshot) => Ok(*snapshot),
            chrome::Read::OwnSnapshot => own_snapshot(bytes, origin),
        },
        None => Err(ImportError::new(
            origin,
            ImportErrorKind::UnknownFormat {
                found: describe_start(bytes),
            },
        )),
    }
}

/// Like [`load_plain`], handing a pickle's bytes to the importer to free.
fn load_plain_vec(
    bytes: Vec<u8>,
    origin: &str,
    options: &ImportOptions,
) -> Result<Snapshot, ImportError> {
    if detect(&bytes) == Some(Format::PytorchPickle) {
        return pytorch::from_pickle_vec(bytes, origin, options);
    }
    load_plain(&bytes, origin, options)
}

fn own_snapshot(bytes: &[u8], origin: &str) -> Result<Snapshot, ImportError> {
    if event_log::is_event_log(bytes) {
        return event_log::read(bytes, origin);
    }
    Snapshot::from_json_bytes(bytes, origin)
        .map_err(|e| ImportError::new(origin, ImportErrorKind::Snapshot(e)))
}

fn is_gzip(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[0] == 0x1f && bytes[1] == 0x8b
}

/// What unpacking gzip data gave.
enum Unpacked {
    /// A Chrome trace, converted while it was unpacked.
    Done(Box<Snapshot>),
    /// Any other content, whole, for [`load_plain_vec`].
    Plain(Vec<u8>),
}

/// Why [`Unpacker`] stopped.
enum UnpackFailure {
    /// The data is not valid gzip.
    Gzip(std::io::Error),
    /// The data unpacks to more than the limit.
    TooLarge,
}

/// Unpacks gzip data as it is read, failing once more than `limit` bytes come out, and keeps
/// why it failed so that the caller reports a gzip or size error rather than what the failure
/// looks like to the reader of the content.
struct Unpacker<'a> {
    // MultiGzDecoder also reads files made of several concatenated gzip members.
    decoder: flate2::read::MultiGzDecoder<&'a [u8]>,
    limit: u64,
    unpacked: u64,
    failure: Option<UnpackFailure>,
}

impl<'a> Unpacker<'a> {
    fn new(bytes: &'a [u8], limit: u64) -> Unpacker<'a> {
        Unpacker {
            decoder: flate2::read::MultiGzDecoder::new(bytes),
            limit,
            unpacked: 0,
            failure: None,
        }
    }

    /// The import error for the failure, if there was one.
    fn error(&mut self, origin: &str) -> Option<ImportError> {
        let kind = match self.failure.take()? {
            UnpackFailure::Gzip(e) => ImportErrorKind::Gzip(e),
            UnpackFailure::TooLarge => ImportErrorKind::TooLarge {
                what: "unpacked gzip data",
                limit: self.limit,
                size: None,
            },
        };
        Some(ImportError::new(origin, kind))
    }
}

impl Read for Unpacker<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.failure.is_some() {
            return Err(std::io::Error::other("unpacking failed"));
        }
        // One byte more than the limit allows tells an exact fit from an overflow.
        let room = self.limit.saturating_add(1).saturating_sub(self.unpacked);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = match self.decoder.read(&mut buf[..want]) {
            Ok(n) => n,
            Err(e) => {
                self.failure = Some(UnpackFailure::Gzip(e));
                return Err(std::io::Error::other("corrupt gzip data"));
            }
        };
        self.unpacked += n as u64;
        if self.unpacked > self.limit {
            self.failure = Some(UnpackFailure::TooLarge);
            return Err(std::io::Error::other("unpacked gzip data is too large"));
        }
        Ok(n)
    }
}

/// Imports the PyTorch pickle that the gzip data `bytes` unpack to as it is unpacked
/// (`pytorch::from_pickle_reads`), adding the bytes unpacked to `unpacked`. The pickle is
/// never held whole, and unpacking stops at its first error: an error in the gzip data, or
/// the size limit, is reported when met before the pickle's own error, and the pickle's
/// error otherwise.
fn pickle_from_gzip(
    bytes: &[u8],
    origin: &str,
    options: &ImportOptions,
    unpacked: &std::cell::Cell<u64>,
) -> Result<Snapshot, ImportError> {
    let failure = std::cell::RefCell::new(None);
    let limit = options.max_decompressed_bytes;
    let mut open = || -> Box<dyn Read + '_> {
        Box::new(Watched {
            unpacker: Unpacker::new(bytes, limit),
            failure: &failure,
            origin,
            unpacked,
        })
    };
    let failed = || failure.borrow_mut().take();
    pytorch::from_pickle_reads(&mut open, &failed, origin, options)
}

/// An [`Unpacker`] that leaves the error of its failure in `failure` (the first one only),
/// for a reader that owns it and sees only that a read failed, and adds the bytes it gives
/// to `unpacked`.
struct Watched<'a> {
    unpacker: Unpacker<'a>,
    failure: &'a std::cell::RefCell<Option<ImportError>>,
    origin: &'a str,
    unpacked: &'a std::cell::Cell<u64>,
}

impl Read for Watched<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = self.unpacker.read(buf);
        if let Ok(n) = read {
            self.unpacked.set(self.unpacked.get() + n as u64);
        }
        if read.is_err() {
            if let Some(e) = self.unpacker.error(self.origin) {
                self.failure.borrow_mut().get_or_insert(e);
            }
        }
        read
    }
}

/// Unpacks gzip data within `options.max_decompressed_bytes`. A Chrome trace is converted as
/// it is unpacked, so that its JSON is never held in memory whole, and so is a PyTorch pickle
/// ([`pickle_from_gzip`]); anything else is returned whole.
fn unpack(bytes: &[u8], origin: &str, options: &ImportOptions) -> Result<Unpacked, ImportError> {
    let mut unpacker = Unpacker::new(bytes, options.max_decompressed_bytes);
    let failed = |unpacker: &mut Unpacker<'_>, e: std::io::Error| {
        unpacker
            .error(origin)
            .unwrap_or_else(|| ImportError::new(origin, ImportErrorKind::Gzip(e)))
    };
    // Enough of the start to tell the format, as `detect` would from the whole.
    let mut head = Vec::new();
    let mut scan = HeadScan::default();
    while !scan.decidable(&head) {
        let before = head.len();
        (&mut unpacker)
            .take(8 << 10)
            .read_to_end(&mut head)
            .map_err(|e| failed(&mut unpacker, e))?;
        if head.len() == before {
            break;
        }
    }
    if is_gzip(&head) {
        // As for any content, an unpacking error or the size limit comes first.
        std::io::copy(&mut unpacker, &mut std::io::sink()).map_err(|e| failed(&mut unpacker, e))?;
        return Err(ImportError::new(
            origin,
            ImportErrorKind::UnknownFormat {
                found: "gzip data inside gzip data".to_string(),
            },
        ));
    }
    if detect(&head) == Some(Format::ChromeTrace) {
        let read = chrome::read_from(
            std::io::Cursor::new(&head).chain(&mut unpacker),
            origin,
            options,
        );
        if read.is_err() && unpacker.failure.is_none() {
            // Data that does not unpack, or unpacks to too much, is reported as such however
            // early its JSON goes wrong, as when it was unpacked whole before being read.
            let _ = std::io::copy(&mut unpacker, &mut std::io::sink());
        }
        if let Some(e) = unpacker.error(origin) {
            return Err(e);
        }
        return match read? {
            chrome::Read::Trace(snapshot) => Ok(Unpacked::Done(snapshot)),
            // A vramscope snapshot whose keys are in another order: unpack it again, whole.
            chrome::Read::OwnSnapshot => {
                let mut all = Vec::new();
                let mut again = Unpacker::new(bytes, options.max_decompressed_bytes);
                again
                    .read_to_end(&mut all)
                    .map_err(|e| failed(&mut again, e))?;
                Ok(Unpacked::Done(Box::new(own_snapshot(&all, origin)?)))
            }
        };
    }
    if detect(&head) == Some(Format::PytorchPickle) {
        // Read as it is unpacked, never held whole, and unpacked no further once the pickle
        // fails: a gzipped run of MARKs that unpacks to 960 MiB stops at the 201st MARK.
        drop(head);
        let unpacked = std::cell::Cell::new(0);
        return pickle_from_gzip(bytes, origin, options, &unpacked)
            .map(|snapshot| Unpacked::Done(Box::new(snapshot)));
    }
    if detect(&head).is_none() {
        // No format: refused by its start, as a plain file is, without holding the rest
        // (which is still unpacked, for an unpacking error or the size limit to come first).
        std::io::copy(&mut unpacker, &mut std::io::sink()).map_err(|e| failed(&mut unpacker, e))?;
        return Err(ImportError::new(
            origin,
            ImportErrorKind::UnknownFormat {
                found: describe_start(&head),
            },
        ));
    }
    unpacker
        .read_to_end(&mut head)
        .map_err(|e| failed(&mut unpacker, e))?;
    Ok(Unpacked::Plain(head))
}

/// Decides when `head`, the start of some content that grows as it is unpacked, is long
/// enough for [`detect`] and [`is_gzip`] to decide as they would on the whole content. It
/// remembers how far it has looked, so that each byte is looked at once however long the
/// whitespace before the first value (a rescan per piece made 32 MiB of it take half a minute).
#[derive(Default)]
struct HeadScan {
    /// How far the head is known to be a byte-order mark and whitespace, or, once an object's
    /// `{` was found, that and whitespace after it.
    seen: usize,
    /// Position just after the `{` that opens a JSON object, once found.
    brace: Option<usize>,
    /// Bytes looked at so far, for tests.
    examined: usize,
}

impl HeadScan {
    /// Whether `head` (the same bytes as at the previous call, and perhaps more) decides.
    fn decidable(&mut self, head: &[u8]) -> bool {
        if head.len() < 3 {
            return false;
        }
        if self.brace.is_none() {
            let bom = if head.starts_with(b"\xef\xbb\xbf") {
                3
            } else {
                0
            };
            let from = self.seen.max(bom);
            match self.skip_whitespace(head, from) {
                None => return false,
                Some(at) if head[at] == b'{' => {
                    self.brace = Some(at + 1);
                    self.seen = at + 1;
                }
                Some(_) => return true,
            }
        }
        // After the `{`: enough bytes past its whitespace to hold `"format_version"`.
        match self.skip_whitespace(head, self.seen) {
            None => false,
            Some(at) => head.len() - at >= "format_version".len() + 2,
        }
    }

    /// The position of the first byte from `from` that is not whitespace, remembering that
    /// everything before it is.
    fn skip_whitespace(&mut self, head: &[u8], from: usize) -> Option<usize> {
        let rest = &head[from..];
        match rest.iter().position(|b| !b.is_ascii_whitespace()) {
            None => {
                self.examined += rest.len();
                self.seen = head.len();
                None
            }
            Some(i) => {
                self.examined += i + 1;
                self.seen = from + i;
                Some(from + i)
            }
        }
    }
}

/// The first byte of a JSON document (after a byte-order mark and whitespace), when it opens
/// an object or an array.
fn json_start(bytes: &[u8]) -> Option<u8> {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let first = *bytes.iter().find(|b| !b.is_ascii_whitespace())?;
    matches!(first, b'{' | b'[').then_some(first)
}

/// Whether the JSON object in `bytes` begins with the key `key`.
fn starts_with_key(bytes: &[u8], key: &str) -> bool {
    let bytes = bytes.strip_prefix(b"\xef\xbb\xbf").unwrap_or(bytes);
    let mut rest = bytes.iter().skip_while(|b| b.is_ascii_whitespace());
    if rest.next() != Some(&b'{') {
        return false;
    }
    let rest: Vec<u8> = rest
        .skip_while(|b| b.is_ascii_whitespace())
        .take(key.len() + 2)
        .copied()
        .collect();
    rest.len() == key.len() + 2
        && rest[0] == b'"'
        && &rest[1..=key.len()] == key.as_bytes()
        && rest[key.len() + 1] == b'"'
}

/// A short description of unrecognised content, for error messages: what kind of content it
/// is, never the content itself. A file named in error (a link in a `ranks` folder to
/// `/proc/self/environ`, to a key) must not have its first bytes printed to a terminal or a
/// CI log, which its bytes, in hex or as text, would be.
fn describe_start(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(SNIFF_BYTES as usize)];
    if head.is_empty() {
        "the file is empty"
    } else if head.iter().all(|&b| b == 0) {
        "it starts with zero bytes"
    } else if head.iter().all(u8::is_ascii_whitespace) {
        "it starts with whitespace and no JSON document"
    } else if head.starts_with(b"PK\x03\x04") {
        "it is a ZIP archive (as torch.save writes), not a memory snapshot"
    } else if !head.contains(&0)
        && std::str::from_utf8(head).map_or_else(|e| e.error_len().is_none(), |_| true)
    {
        "it starts with text that is no JSON document"
    } else {
        "it starts with binary data"
    }
    .to_string()
}

#[cfg(test)]
mod tests;
