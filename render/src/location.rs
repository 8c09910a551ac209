//! Where a finding is, for the formats that point a CI system at source lines: the SARIF log
//! (`crate::sarif`) and GitHub's workflow commands (`crate::github`).
//!
//! A finding's site is the reader's name of a call site (`engine::naming`): usually
//! `file:line`, but `MmBackward0 (backward)` for a stack of C++ frames only, and a line that
//! names nothing (`??:0`, a line 0, a pseudo-file such as `<string>`) is no source line either.
//! [`source_line`] says which sites are a file and a line of 1 or more. [`path_ref`] names
//! that file the way a CI system finds it in the checkout: relative to the source root (the
//! directory `vramscope report` runs in) when it lies under it, with `/` between the parts
//! (traces recorded on Windows write `\`), or else as the absolute path it is. Both formats
//! take their options from [`AnnotationOptions`].

/// What the CI formats need beyond the report: where the sources are and which file was read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct AnnotationOptions {
    /// The checkout's root directory (the CLI gives its working directory): an absolute file
    /// under it is named relative to it. `None`: absolute files stay absolute.
    pub source_root: Option<String>,
    /// The trace the report was built from, as the user named it: SARIF anchors a finding that
    /// names no source line at this file (GitHub's code scanning refuses a log holding a
    /// result without a file). `None` (the demo): such a finding has no file.
    pub trace_file: Option<String>,
    /// The index of each report's device (`cuda:N`), in the order of the reports, for a trace
    /// of several devices; empty when not known.
    pub device_indices: Vec<u32>,
}

impl AnnotationOptions {
    /// How the findings of the `i`th of `reports` name their device: `device N` (its index)
    /// or, without the index, its name; `None` for a single report.
    pub fn device_label(
        &self,
        i: usize,
        reports: &[vramscope_analysis::report::Report],
    ) -> Option<String> {
        if reports.len() < 2 {
            return None;
        }
        Some(match self.device_indices.get(i) {
            Some(index) => format!("device {index}"),
            None => reports.get(i)?.device.name.clone(),
        })
    }
}

/// A source file and a line in it, from a finding's site.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceLine<'a> {
    /// The file as the trace names it.
    pub file: &'a str,
    /// The line, 1 or more.
    pub line: u64,
}

/// `site` as a source file and line: `FILE:LINE` whose line is a number of 1 or more and
/// whose file is one (not empty, not `??`, not a pseudo-file in angle brackets such as
/// `<string>` or `<frozen runpy>`). `None` for every other site name.
pub fn source_line(site: &str) -> Option<SourceLine<'_>> {
    let (file, line) = site.rsplit_once(':')?;
    if line.is_empty() || !line.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let line: u64 = line.parse().ok().filter(|&l| l >= 1)?;
    let pseudo = file.starts_with('<') && file.ends_with('>');
    let file_like = !file.trim().is_empty() && file != "??" && !pseudo;
    file_like.then_some(SourceLine { file, line })
}

/// How a file is named for a CI system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PathRef {
    /// Relative to the source root, with `/` between its parts and no leading `./`.
    Relative(String),
    /// An absolute path, with `/` between its parts (`C:/work/x.py` for a Windows one).
    Absolute(String),
}

/// Whether `path` (with `/` separators) starts with a Windows drive: `C:/`.
fn has_drive(path: &str) -> bool {
    let b = path.as_bytes();
    b.len() >= 3 && b[0].is_ascii_alphabetic() && b[1] == b':' && b[2] == b'/'
}

/// `file` as a CI system finds it: relative to `root` when it lies under it, relative as it
/// is when it is relative, else absolute; `.` and `..` parts resolved by name (a leading `..`
/// of a relative path stays). `None` when nothing is left to name (`./`).
pub fn path_ref(file: &str, root: Option<&str>) -> Option<PathRef> {
    let file = file.replace('\\', "/");
    let drive = has_drive(&file);
    if !file.starts_with('/') && !drive {
        let parts = normalize(&file, false);
        return (!parts.is_empty()).then(|| PathRef::Relative(parts.join("/")));
    }
    // An absolute path: its prefix (`/`, `C:/`, `//` of a network share) and its parts.
    let (prefix, rest) = if drive {
        file.split_at(3)
    } else if file.starts_with("//") && !file.starts_with("///") {
        file.split_at(2)
    } else {
        file.split_at(1)
    };
    let parts = normalize(rest, true);
    let under = root.and_then(|root| {
        let root = root.replace('\\', "/");
        let root_parts = normalize(root.strip_prefix(prefix)?, true);
        parts
            .starts_with(&root_parts)
            .then(|| parts[root_parts.len()..].join("/"))
    });
    match under {
        // The root itself names no file.
        Some(relative) if relative.is_empty() => None,
        Some(relative) => Some(PathRef::Relative(relative)),
        None if parts.is_empty() => None,
        None => Some(PathRef::Absolute(format!("{prefix}{}", parts.join("/")))),
    }
}

/// The parts of a `/`-separated path, empty and `.` parts dropped and each `..` taking the
/// part before it away; a `..` with nothing before it stays, unless the path is `absolute`
/// (the root's parent is the root).
fn normalize(path: &str, absolute: bool) -> Vec<&str> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => match parts.last() {
                Some(&last) if last != ".." => {
                    parts.pop();
                }
                _ if absolute => {}
                _ => parts.push(".."),
            },
            part => parts.push(part),
        }
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_line_is_a_real_file_and_a_line_of_one_or_more() {
        assert_eq!(
            source_line("train.py:57"),
            Some(SourceLine {
                file: "train.py",
                line: 57
            })
        );
        assert_eq!(
            source_line("C:\\research\\client.py:176").map(|s| (s.file, s.line)),
            Some(("C:\\research\\client.py", 176))
        );
        for not_one in [
            "MmBackward0 (backward)",
            "(before the trace)",
            "??:0",
            "??:12",
            "train.py:0",
            "train.py:",
            "train.py:5a",
            ":12",
            "<string>:3",
            "[at::native::empty_cuda]",
        ] {
            assert_eq!(source_line(not_one), None, "{not_one}");
        }
    }

    #[test]
    fn files_under_the_root_are_named_relative_to_it() {
        let root = Some("/home/ci/repo");
        let rel = |s: &str| Some(PathRef::Relative(s.to_string()));
        assert_eq!(
            path_ref("/home/ci/repo/src/train.py", root),
            rel("src/train.py")
        );
        assert_eq!(
            path_ref("/home/ci/repo/src/train.py", Some("/home/ci/repo/")),
            rel("src/train.py")
        );
        assert_eq!(path_ref("./src//train.py", root), rel("src/train.py"));
        assert_eq!(path_ref("models\\net.py", None), rel("models/net.py"));
        assert_eq!(path_ref("../lib/x.py", root), rel("../lib/x.py"));
        // A sibling whose name starts with the root's is not under it.
        assert_eq!(
            path_ref("/home/ci/repo2/x.py", root),
            Some(PathRef::Absolute("/home/ci/repo2/x.py".into()))
        );
        assert_eq!(
            path_ref("C:\\research\\client.py", root),
            Some(PathRef::Absolute("C:/research/client.py".into()))
        );
        assert_eq!(path_ref("C:\\work\\x.py", Some("C:\\work")), rel("x.py"));
        assert_eq!(path_ref("./", root), None);
        assert_eq!(path_ref("/home/ci/repo/", root), None);
        // Parts are resolved by name: a path that leaves the root is absolute.
        assert_eq!(
            path_ref("/home/ci/repo/../shared/t.pickle", root),
            Some(PathRef::Absolute("/home/ci/shared/t.pickle".into()))
        );
        assert_eq!(path_ref("/home/ci/repo/a/./b/../c.py", root), rel("a/c.py"));
        assert_eq!(path_ref("/home/ci/x/../repo/c.py", root), rel("c.py"));
        assert_eq!(path_ref("a/../../b.py", None), rel("../b.py"));
        assert_eq!(
            path_ref("//server/share/x.py", root),
            Some(PathRef::Absolute("//server/share/x.py".into()))
        );
    }
}
