//! Writing an output file safely: a new file beside the path, renamed onto it once whole.
//!
//! `report -o`, `convert -o`, `Snapshot::save` and the Python package's
//! `SimAllocator.snapshot()` write where a user or a script says. Opening the path for writing
//! would follow a symbolic link standing there (a link to `~/.bashrc` planted in a shared
//! folder would be overwritten with a report) and leave a half-written file behind a failed
//! write. [`NewFile`] creates a file of its own beside the path (`create_new`, so never an
//! existing file or link), and [`NewFile::commit`] renames it onto the path: a link there is
//! replaced, its target untouched, and the path holds the old file or the whole new one. A
//! path that is a device, a FIFO or a socket (`/dev/stdout`, `/dev/null`, a named pipe) is
//! written in place, as it is no file to replace.

use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// An output file being written: a new file beside its path, renamed onto the path by
/// [`NewFile::commit`]; dropped without a commit, the new file is removed and the path left
/// as it was.
pub struct NewFile {
    writer: BufWriter<File>,
    /// The new file, while it is not yet renamed onto `path`; `None` when `path` is written
    /// in place (a device, a FIFO, a socket).
    temp: Option<PathBuf>,
    path: PathBuf,
}

impl NewFile {
    /// Starts writing `path`.
    pub fn create(path: impl AsRef<Path>) -> io::Result<NewFile> {
        let path = path.as_ref().to_path_buf();
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            let kind = meta.file_type();
            if kind.is_dir() {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    "is a directory",
                ));
            }
            if !kind.is_file() && !kind.is_symlink() {
                // A device, a FIFO or a socket: nothing to replace.
                let file = OpenOptions::new().write(true).open(&path)?;
                return Ok(NewFile {
                    writer: BufWriter::new(file),
                    temp: None,
                    path,
                });
            }
        }
        let name = path
            .file_name()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        let mut attempt = 0u32;
        loop {
            let mut temp_name = std::ffi::OsString::from(".");
            temp_name.push(name);
            temp_name.push(format!(".{}.{attempt}.tmp", std::process::id()));
            let temp = dir.join(temp_name);
            match OpenOptions::new().write(true).create_new(true).open(&temp) {
                Ok(file) => {
                    return Ok(NewFile {
                        writer: BufWriter::new(file),
                        temp: Some(temp),
                        path,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < 1000 => {
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Writes what is buffered and renames the new file onto the path.
    pub fn commit(mut self) -> io::Result<()> {
        self.writer.flush()?;
        if let Some(temp) = self.temp.take() {
            if let Err(e) = std::fs::rename(&temp, &self.path) {
                let _ = std::fs::remove_file(&temp);
                return Err(e);
            }
        }
        Ok(())
    }

    /// The path the file is written to.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Write for NewFile {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.writer.write(bytes)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.writer.flush()
    }
}

impl Drop for NewFile {
    fn drop(&mut self) {
        if let Some(temp) = self.temp.take() {
            let _ = std::fs::remove_file(temp);
        }
    }
}

/// Writes `bytes` to `path` as a [`NewFile`]: never through a link standing at the path.
pub fn write_new(path: impl AsRef<Path>, bytes: &[u8]) -> io::Result<()> {
    let mut file = NewFile::create(path)?;
    file.write_all(bytes)?;
    file.commit()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("vramscope-files-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    #[cfg(unix)]
    fn a_link_at_the_path_is_replaced_and_its_target_untouched() {
        let dir = scratch("link");
        let target = dir.join("precious");
        std::fs::write(&target, b"keep me").unwrap();
        let out = dir.join("report.txt");
        std::os::unix::fs::symlink(&target, &out).unwrap();
        write_new(&out, b"the report").unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep me");
        assert_eq!(std::fs::read(&out).unwrap(), b"the report");
        assert!(!std::fs::symlink_metadata(&out)
            .unwrap()
            .file_type()
            .is_symlink());
        // An existing file is replaced whole; nothing else is left in the folder.
        write_new(&out, b"again").unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"again");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_not_committed_leaves_the_path_as_it_was() {
        let dir = scratch("drop");
        let out = dir.join("out.json");
        std::fs::write(&out, b"old").unwrap();
        let mut file = NewFile::create(&out).unwrap();
        file.write_all(b"half").unwrap();
        drop(file);
        assert_eq!(std::fs::read(&out).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 1);
        assert!(write_new(&dir, b"x").is_err(), "a directory is refused");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    #[cfg(unix)]
    fn a_device_is_written_in_place() {
        use std::os::unix::fs::FileTypeExt;
        write_new("/dev/null", b"nothing").unwrap();
        let kind = std::fs::symlink_metadata("/dev/null").unwrap().file_type();
        assert!(kind.is_char_device());
    }
}
