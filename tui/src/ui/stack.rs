//! The frames of one stack as the call-site detail view (`super::sites`) shows them: the
//! user's own frames in their order, innermost first, with each run of framework frames folded
//! into one line (`… 23 framework frames (f shows them)`), so that the line a user changes is
//! on screen even when PyTorch recorded thirty C++ frames of its unwinder, caching allocator
//! and ATen below it. `f` in the detail view shows every frame (`crate::view::SitesView`'s
//! `all_frames`).
//!
//! Framework frames are what the inspector's importer never names a site by
//! (`vramscope_import::sites::is_framework_frame`): compiled code (`??`, C, C++ and
//! CUDA sources, libstdc++, `c10/`, `aten/`: `vramscope_engine::is_compiled_frame`), the Python
//! standard library, and the framework paths (`DEFAULT_FRAMEWORK_PATHS`: `torch/`,
//! `site-packages/`, `dist-packages/`). A frame that names the autograd node the stack runs in
//! (`torch::autograd::generated::MmBackward0::apply`) stays visible although it is framework
//! code: it is how a backward allocation is named everywhere else (`MmBackward0 (backward)`).

use vramscope_engine::autograd_node;
use vramscope_import::sites::is_framework_frame;
use vramscope_model::Frame;

/// One line of a stack in the detail view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StackLine<'a> {
    /// A frame shown.
    Frame {
        /// The frame.
        frame: &'a Frame,
        /// Whether it is framework code (drawn dimmed unless it names the autograd node).
        framework: bool,
        /// Whether it names the autograd node the stack runs in.
        node: bool,
    },
    /// This many consecutive framework frames, folded into one line.
    Folded(usize),
}

impl StackLine<'_> {
    /// How many frames the line stands for.
    pub fn frames(&self) -> usize {
        match self {
            StackLine::Frame { .. } => 1,
            StackLine::Folded(n) => *n,
        }
    }
}

/// The lines of `frames` (innermost first) for the detail view: every frame when `all`, else
/// the user's frames and the autograd node's with each run of two or more other frames folded
/// into a [`StackLine::Folded`] (a single framework frame is shown as it is: folding it would
/// take the line it takes). `framework_paths` are as for [`is_framework_frame`].
pub fn stack_lines<'a>(
    frames: &'a [Frame],
    framework_paths: &[String],
    all: bool,
) -> Vec<StackLine<'a>> {
    let lines: Vec<StackLine<'a>> = frames
        .iter()
        .map(|frame| StackLine::Frame {
            frame,
            framework: is_framework_frame(frame, framework_paths),
            node: autograd_node(std::slice::from_ref(frame)).is_some(),
        })
        .collect();
    let kept = |l: &StackLine| match l {
        StackLine::Frame {
            framework, node, ..
        } => !framework || *node,
        StackLine::Folded(_) => false,
    };
    // A stack with no frame of the user's and no autograd node (a C++ thread's own allocation,
    // an unsymbolized dump's `??` frames only) is shown unfolded: folded, it would be one line
    // saying that frames were folded, and the reader would press `f` every time to learn
    // anything. One with an autograd node (PyTorch's backward thread) folds around the node's
    // frame, which is the answer to "what allocated this" there.
    if all || !lines.iter().any(kept) {
        return lines;
    }
    let mut out = Vec::with_capacity(lines.len());
    let mut run: Vec<StackLine<'a>> = Vec::new();
    let flush = |run: &mut Vec<StackLine<'a>>, out: &mut Vec<StackLine<'a>>| {
        if run.len() > 1 {
            out.push(StackLine::Folded(run.len()));
        } else {
            out.append(run);
        }
        run.clear();
    };
    for line in lines {
        if kept(&line) {
            flush(&mut run, &mut out);
            out.push(line);
        } else {
            run.push(line);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// The text of a folded run of `n` frames: `… 23 framework frames (f shows them)`.
pub fn folded_text(n: usize) -> String {
    format!(
        "… {n} framework frame{} (f shows them)",
        if n == 1 { "" } else { "s" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use vramscope_import::sites::DEFAULT_FRAMEWORK_PATHS;
    use vramscope_testkit::fixture;

    fn paths() -> Vec<String> {
        DEFAULT_FRAMEWORK_PATHS
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    fn names(lines: &[StackLine]) -> Vec<String> {
        lines
            .iter()
            .map(|l| match l {
                StackLine::Frame { frame, .. } => format!("{}:{}", frame.file, frame.line),
                StackLine::Folded(n) => format!("…{n}"),
            })
            .collect()
    }

    #[test]
    fn a_pytorch_stack_folds_to_the_users_frames_in_their_order() {
        let frames = fixture::pytorch_forward_stack();
        let lines = stack_lines(&frames, &paths(), false);
        assert_eq!(
            names(&lines),
            [
                "…26",
                "model.py:31",
                "…2",
                "train.py:57",
                "train.py:88",
                "…13"
            ]
        );
        assert_eq!(
            lines.iter().map(StackLine::frames).sum::<usize>(),
            frames.len()
        );
    }

    #[test]
    fn all_shows_every_frame_in_order() {
        let frames = fixture::pytorch_forward_stack();
        let lines = stack_lines(&frames, &paths(), true);
        assert_eq!(lines.len(), frames.len());
        let StackLine::Frame {
            frame, framework, ..
        } = &lines[0]
        else {
            panic!("{:?}", lines[0]);
        };
        assert!(framework);
        assert_eq!(frame.function, "torch::unwind::unwind()");
    }

    #[test]
    fn a_backward_stack_folds_around_its_autograd_node() {
        let frames = fixture::pytorch_backward_stack();
        let lines = stack_lines(&frames, &paths(), false);
        assert_eq!(lines.len(), 3, "{:?}", names(&lines));
        let StackLine::Frame { frame, node, .. } = &lines[1] else {
            panic!("{:?}", lines[1]);
        };
        assert!(node);
        assert!(frame.function.contains("MmBackward0::apply"), "{frame:?}");
        assert_eq!(lines[0], StackLine::Folded(7));
        assert_eq!(lines[2], StackLine::Folded(frames.len() - 8));
    }

    #[test]
    fn a_stack_of_framework_frames_only_is_shown_unfolded() {
        let frames: Vec<Frame> = fixture::pytorch_forward_stack()
            .into_iter()
            .filter(|f| f.file == "??")
            .collect();
        let lines = stack_lines(&frames, &paths(), false);
        assert_eq!(lines.len(), frames.len());
    }

    #[test]
    fn a_single_framework_frame_is_shown_not_folded() {
        let frame = |file: &str, line| Frame {
            file: file.to_string(),
            line,
            function: "f".to_string(),
        };
        let frames = [frame("torch/nn/functional.py", 3053), frame("train.py", 77)];
        let lines = stack_lines(&frames, &paths(), false);
        assert_eq!(
            names(&lines),
            ["torch/nn/functional.py:3053", "train.py:77"]
        );
        assert_eq!(folded_text(9), "… 9 framework frames (f shows them)");
    }
}
