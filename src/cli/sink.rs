//! Where `vramscope convert` writes: a file written new and renamed into place, standard
//! output streamed (escaped as it goes for a text format), or a buffer escaped once whole when
//! standard output is a terminal.

use std::io::{IsTerminal, Write};

use super::common::is_stdout;
use crate::model::terminal;

/// Where `convert` writes: a file, written new and renamed onto the path once whole (never
/// through a link standing there: `model::files`), standard output streamed as the file would
/// be (a pipe or a redirection), or, when standard output is a terminal, a buffer that
/// `finish` passes through `sanitize_json` (every text format convert writes is JSON or a page
/// whose data is JSON; the binary pickle is refused before). A text format streamed to a
/// pipe is escaped as it goes ([`JsonEscaping`]): a CI log reads pipes too.
pub(super) enum ConvertSink {
    /// A file, until `finish` renames it into place.
    File(Option<crate::model::files::NewFile>),
    /// Standard output that is not a terminal, as the bytes are (the pickle).
    Stream(std::io::BufWriter<std::io::Stdout>),
    /// Standard output that is not a terminal, for a text format: escaped as it streams.
    Escaped(std::io::BufWriter<JsonEscaping<std::io::Stdout>>),
    /// Standard output that is a terminal: escaped once whole.
    Terminal(Vec<u8>),
}

impl ConvertSink {
    /// Opens `path` for writing, or standard output for `-`; `text` when what is written is
    /// text (JSON, or a page whose data is JSON).
    pub(super) fn open(path: &std::path::Path, text: bool) -> std::io::Result<ConvertSink> {
        if !is_stdout(path) {
            return Ok(ConvertSink::File(Some(
                crate::model::files::NewFile::create(path)?,
            )));
        }
        if std::io::stdout().is_terminal() {
            return Ok(ConvertSink::Terminal(Vec::new()));
        }
        if text {
            let escaping = JsonEscaping::new(std::io::stdout());
            return Ok(ConvertSink::Escaped(std::io::BufWriter::new(escaping)));
        }
        Ok(ConvertSink::Stream(std::io::BufWriter::new(
            std::io::stdout(),
        )))
    }

    /// Writes what is buffered: renames the file into place, flushes the stream, or prints the
    /// escaped text.
    pub(super) fn finish(&mut self) -> std::io::Result<()> {
        match self {
            ConvertSink::File(file) => file.take().map_or(Ok(()), |file| file.commit()),
            ConvertSink::Stream(writer) => writer.flush(),
            ConvertSink::Escaped(writer) => {
                writer.flush()?;
                writer.get_mut().finish()
            }
            ConvertSink::Terminal(buffer) => {
                let text = String::from_utf8_lossy(buffer);
                let mut stdout = std::io::stdout().lock();
                stdout.write_all(terminal::sanitize_json(&text).as_bytes())?;
                stdout.flush()
            }
        }
    }
}

impl Write for ConvertSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        match self {
            ConvertSink::File(Some(file)) => file.write(bytes),
            ConvertSink::File(None) => Err(std::io::Error::other("written after its end")),
            ConvertSink::Stream(writer) => writer.write(bytes),
            ConvertSink::Escaped(writer) => writer.write(bytes),
            ConvertSink::Terminal(buffer) => buffer.write(bytes),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            ConvertSink::File(Some(file)) => file.flush(),
            ConvertSink::Stream(writer) => writer.flush(),
            ConvertSink::Escaped(writer) => writer.flush(),
            ConvertSink::File(None) | ConvertSink::Terminal(_) => Ok(()),
        }
    }
}

/// A writer of JSON text (or a page whose data is JSON) that passes it through
/// `terminal::sanitize_json` as it streams: what it is handed is escaped up to the last
/// whole character that cannot begin a `##[` with what follows; the rest waits for the next
/// write, or `finish`.
pub(super) struct JsonEscaping<W: Write> {
    inner: W,
    pending: Vec<u8>,
}

impl<W: Write> JsonEscaping<W> {
    fn new(inner: W) -> Self {
        JsonEscaping {
            inner,
            pending: Vec::new(),
        }
    }

    /// Escapes and writes `pending` up to `end`.
    fn pass(&mut self, end: usize) -> std::io::Result<()> {
        let text = String::from_utf8_lossy(&self.pending[..end]);
        self.inner
            .write_all(terminal::sanitize_json(&text).as_bytes())?;
        self.pending.drain(..end);
        Ok(())
    }

    /// Writes everything still pending.
    fn finish(&mut self) -> std::io::Result<()> {
        self.pass(self.pending.len())?;
        self.inner.flush()
    }
}

impl<W: Write> Write for JsonEscaping<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(bytes);
        // Whole characters only, and trailing `#`s wait: they may begin a `##[`.
        let whole = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let hashes = self.pending[..whole]
            .iter()
            .rev()
            .take_while(|&&b| b == b'#')
            .count();
        let end = whole - hashes.min(2);
        if end > 0 {
            self.pass(end)?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
