//! Call sites for imported stacks: which frame of a stack is the user's own code, and the
//! table that stores each distinct stack once.
//!
//! PyTorch records a full stack for every allocation, innermost frame first, mixing the user's
//! Python with torch internals, site-packages, the standard library and C++ frames. Reports
//! name one line per finding, so [`primary_frame`] picks the innermost frame that belongs to the
//! user, and [`SiteTable`] interns stacks into `Snapshot::sites` (the `SiteId`s that events and
//! blocks of `vramscope_model` carry). The importers of this module's parent
//! (`pytorch`) use both; the choice of framework paths comes from
//! [`super::ImportOptions::framework_paths`].

use std::hash::{Hash, Hasher};

use rustc_hash::{FxHashMap, FxHasher};
use vramscope_model::{CallSite, Frame, SiteId};

/// The path fragments [`super::ImportOptions`] treats as framework code by default.
pub const DEFAULT_FRAMEWORK_PATHS: &[&str] = &["torch/", "site-packages/", "dist-packages/"];

/// Whether `frame` is framework code rather than the user's own: compiled code
/// ([`vramscope_engine::is_compiled_frame`]: a frame without a line, a C, C++ or CUDA source, the
/// C++ runtime), a frame of the Python standard library, or a file whose path matches one of
/// `framework_paths` (see [`super::ImportOptions::framework_paths`]).
pub fn is_framework_frame(frame: &Frame, framework_paths: &[String]) -> bool {
    if vramscope_engine::is_compiled_frame(frame) {
        return true;
    }
    let path = frame.file.replace('\\', "/").to_ascii_lowercase();
    if is_stdlib(&path) {
        return true;
    }
    framework_paths.iter().any(|p| path_matches(&path, p))
}

/// Whether a normalized (lower case, `/`-separated) path lies in a Python installation's
/// standard library: `<frozen ...>` modules, `.../lib/python3.x/...` on Unix, and
/// `...\Python3xx\Lib\...` on Windows.
fn is_stdlib(path: &str) -> bool {
    if path.starts_with("<frozen ") {
        return true;
    }
    let parts: Vec<&str> = path.split('/').collect();
    parts.windows(2).any(|w| {
        (w[0] == "lib" && w[1].starts_with("python"))
            || (w[0].starts_with("python") && w[1] == "lib")
    })
}

/// Whether `pattern` matches the normalized `path`: anywhere when it starts with `/`, else at
/// the start of a path component.
fn path_matches(path: &str, pattern: &str) -> bool {
    let pattern = pattern.replace('\\', "/").to_ascii_lowercase();
    if pattern.is_empty() {
        return false;
    }
    if pattern.starts_with('/') {
        return path.contains(&pattern);
    }
    path.match_indices(&pattern)
        .any(|(at, _)| at == 0 || path.as_bytes()[at - 1] == b'/')
}

/// The index of the frame that names a stack: the innermost (first) frame that is not
/// framework code, or the innermost frame when all are; `None` for an empty stack.
pub fn primary_frame(frames: &[Frame], framework_paths: &[String]) -> Option<usize> {
    if frames.is_empty() {
        return None;
    }
    Some(
        frames
            .iter()
            .position(|f| !is_framework_frame(f, framework_paths))
            .unwrap_or(0),
    )
}

/// The call-site table being built for one snapshot: each distinct stack is stored once.
pub struct SiteTable {
    framework_paths: Vec<String>,
    sites: Vec<CallSite>,
    /// Hash of a stack to the sites with that hash.
    by_hash: FxHashMap<u64, Vec<SiteId>>,
}

impl SiteTable {
    /// An empty table that picks primary frames with `framework_paths`.
    pub fn new(framework_paths: &[String]) -> SiteTable {
        SiteTable {
            framework_paths: framework_paths.to_vec(),
            sites: Vec::new(),
            by_hash: FxHashMap::default(),
        }
    }

    /// The id of the call site for `frames` (innermost first), adding it when new; `None` for
    /// an empty stack.
    pub fn intern(&mut self, frames: Vec<Frame>) -> Option<SiteId> {
        let primary = primary_frame(&frames, &self.framework_paths)?;
        let mut hasher = FxHasher::default();
        frames.hash(&mut hasher);
        let hash = hasher.finish();
        let candidates = self.by_hash.entry(hash).or_default();
        if let Some(&id) = candidates
            .iter()
            .find(|&&id| self.sites[id as usize].frames == frames)
        {
            return Some(id);
        }
        let id = self.sites.len() as SiteId;
        candidates.push(id);
        let main = &frames[primary];
        self.sites.push(CallSite {
            file: main.file.clone(),
            line: main.line,
            column: 0,
            function: main.function.clone(),
            frames,
        });
        Some(id)
    }

    /// The site with id `id`.
    pub fn get(&self, id: SiteId) -> Option<&CallSite> {
        self.sites.get(id as usize)
    }

    /// The finished table, for `Snapshot::sites`.
    pub fn into_sites(self) -> Vec<CallSite> {
        self.sites
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(file: &str, line: u32, function: &str) -> Frame {
        Frame {
            file: file.to_string(),
            line,
            function: function.to_string(),
        }
    }

    fn defaults() -> Vec<String> {
        DEFAULT_FRAMEWORK_PATHS
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    #[test]
    fn classifies_frames() {
        let fw = defaults();
        for (file, line) in [
            ("??", 0),
            ("memory_snapshot.cpp", 0),
            ("/src/aten/foo.cu", 12),
            ("/x/.venv/lib/python3.12/site-packages/transformers/m.py", 3),
            (
                "C:\\research\\.venv\\lib\\site-packages\\torch\\nn\\modules\\module.py",
                930,
            ),
            ("/usr/lib/python3.12/threading.py", 1010),
            ("C:\\Python311\\Lib\\runpy.py", 88),
            ("<frozen runpy>", 198),
            ("<string>", 1),
            ("<eval_with_key>.12", 5),
            ("/tmp/torchinductor_alice/7q/c7qwhx5lfkqv2.py", 53),
            ("torch/nn/modules/module.py", 5),
            ("/opt/conda/lib/python3.10/dist-packages/x.py", 1),
            ("/home/u/train.py", 0),
        ] {
            assert!(is_framework_frame(&frame(file, line, "f"), &fw), "{file}");
        }
        for file in [
            "/home/u/train.py",
            "C:\\research\\DeComFL\\decomfl_main.py",
            "/home/u/mytorch/model.py",
            "/home/lin/cs336/cs336_basics/optimizer.py",
            "/tmp/ipykernel_22383/3983704831.py",
            "<ipython-input-3-6a1b2c>",
        ] {
            assert!(!is_framework_frame(&frame(file, 7, "f"), &fw), "{file}");
        }
        let custom = vec!["transformers/".to_string(), "/cs336_basics/".to_string()];
        assert!(is_framework_frame(
            &frame("/home/lin/cs336/cs336_basics/model.py", 3, "f"),
            &custom
        ));
        assert!(!is_framework_frame(
            &frame("/home/u/train.py", 3, "f"),
            &custom
        ));
    }

    #[test]
    fn primary_frame_is_innermost_user_frame() {
        let fw = defaults();
        let stack = vec![
            frame("??", 0, "malloc"),
            frame("/v/site-packages/torch/nn/functional.py", 10, "linear"),
            frame("/home/u/model.py", 54, "forward"),
            frame("/home/u/train.py", 9, "<module>"),
        ];
        assert_eq!(primary_frame(&stack, &fw), Some(2));
        assert_eq!(primary_frame(&stack[..2], &fw), Some(0));
        assert_eq!(primary_frame(&[], &fw), None);
    }

    #[test]
    fn table_dedupes_identical_stacks() {
        let mut table = SiteTable::new(&defaults());
        let a = vec![frame("/home/u/a.py", 1, "f"), frame("/home/u/b.py", 2, "g")];
        let b = vec![frame("/home/u/a.py", 3, "f")];
        let ia = table.intern(a.clone());
        let ib = table.intern(b);
        assert_eq!(table.intern(a), ia);
        assert_ne!(ia, ib);
        assert_eq!(table.intern(Vec::new()), None);
        let site = table.get(ia.unwrap()).unwrap();
        assert_eq!(site.file_line(), "/home/u/a.py:1");
        assert_eq!(site.frames.len(), 2);
        assert_eq!(table.into_sites().len(), 2);
    }
}
