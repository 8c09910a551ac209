//! What the Python face's `attach()` marks in PyTorch's recorded history, read back: the
//! names of its annotations and the text of its allocation metadata, written by
//! `python/vramscope/_torch.py` (`ModuleMarks`) and read here, in one place, by every reader.
//!
//! - Each module call is an annotation [`MODULE_ANNOTATION`]`PATH` (`START` and `END`),
//!   `PATH` the module's place in its model (`GPT.h.3.attn`).
//! - The outermost module call is [`PHASE_ANNOTATION`]`forward` (or `forward_no_grad`), and
//!   `torch.autograd.backward` and `torch.autograd.grad` are [`PHASE_ANNOTATION`]`backward`.
//! - Where torch keeps custom allocation metadata, each allocation made inside a marked call
//!   carries `vramscope:phase=forward;module=GPT.h.3.attn` (the innermost module and the
//!   phase) as its `user_metadata`; [`LiveMark::parse`] reads it.

/// The prefix of the annotation around each module call: `vramscope.module#GPT.h.3.attn`.
pub const MODULE_ANNOTATION: &str = "vramscope.module#";

/// The prefix of the annotation around each phase: `vramscope.phase#backward`.
pub const PHASE_ANNOTATION: &str = "vramscope.phase#";

/// The prefix of the allocation metadata `attach()` sets: `vramscope:phase=forward;module=GPT`.
pub const METADATA_PREFIX: &str = "vramscope:";

/// A phase of a training or inference step, as `attach()` marks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MarkedPhase {
    /// A forward pass with gradients enabled: what it keeps, the backward reads.
    Forward,
    /// A forward pass under `torch.no_grad()` (or `inference_mode`): it keeps nothing for a
    /// backward.
    ForwardNoGrad,
    /// A backward pass (`torch.autograd.backward`, which `Tensor.backward` calls, or
    /// `torch.autograd.grad`).
    Backward,
}

impl MarkedPhase {
    /// The phase's name in the marks (`forward_no_grad`).
    pub const fn as_str(self) -> &'static str {
        match self {
            MarkedPhase::Forward => "forward",
            MarkedPhase::ForwardNoGrad => "forward_no_grad",
            MarkedPhase::Backward => "backward",
        }
    }

    /// The phase named `name` in the marks.
    pub fn from_name(name: &str) -> Option<MarkedPhase> {
        [
            MarkedPhase::Forward,
            MarkedPhase::ForwardNoGrad,
            MarkedPhase::Backward,
        ]
        .into_iter()
        .find(|p| p.as_str() == name)
    }

    /// The phase an annotation named `name` marks (`vramscope.phase#backward`), if it is one.
    pub fn of_annotation(name: &str) -> Option<MarkedPhase> {
        name.strip_prefix(PHASE_ANNOTATION)
            .and_then(MarkedPhase::from_name)
    }
}

/// The module path an annotation named `name` marks (`vramscope.module#GPT.h.3.attn` marks
/// `GPT.h.3.attn`), if it is one.
pub fn module_of_annotation(name: &str) -> Option<&str> {
    name.strip_prefix(MODULE_ANNOTATION)
        .filter(|p| !p.is_empty())
}

/// Whether an annotation named `name` is one of `attach()`'s marks, which say where the
/// program is, never where a step begins.
pub fn is_mark(name: &str) -> bool {
    name.starts_with(MODULE_ANNOTATION) || name.starts_with(PHASE_ANNOTATION)
}

/// What an allocation's metadata from `attach()` says: the phase and the innermost module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveMark<'a> {
    /// The phase, when the metadata names a known one.
    pub phase: Option<MarkedPhase>,
    /// The innermost module's path (`GPT.h.3.attn`), when the allocation was made in one.
    pub module: Option<&'a str>,
}

impl LiveMark<'_> {
    /// Reads `attach()`'s metadata (`vramscope:phase=forward;module=GPT.h.3.attn`); `None`
    /// for any other text, which is the program's own (and may name a category as a tag
    /// does, `crate::Category::from_tag`). Unknown keys are skipped.
    ///
    /// ```
    /// use vramscope_model::marks::{LiveMark, MarkedPhase};
    ///
    /// let mark = LiveMark::parse("vramscope:phase=forward;module=GPT.h.3.attn").unwrap();
    /// assert_eq!(mark.phase, Some(MarkedPhase::Forward));
    /// assert_eq!(mark.module, Some("GPT.h.3.attn"));
    /// assert!(LiveMark::parse("weights").is_none());
    /// ```
    pub fn parse(text: &str) -> Option<LiveMark<'_>> {
        let fields = text.strip_prefix(METADATA_PREFIX)?;
        let mut mark = LiveMark {
            phase: None,
            module: None,
        };
        for field in fields.split(';') {
            match field.split_once('=') {
                Some(("phase", phase)) => mark.phase = MarkedPhase::from_name(phase),
                Some(("module", module)) if !module.is_empty() => mark.module = Some(module),
                _ => {}
            }
        }
        Some(mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_read_back_what_attach_writes() {
        // The texts `python/tests/test_module_marks.py` sees attach() write.
        let mark = LiveMark::parse("vramscope:phase=forward_no_grad;module=Model.layers.1");
        assert_eq!(
            mark,
            Some(LiveMark {
                phase: Some(MarkedPhase::ForwardNoGrad),
                module: Some("Model.layers.1"),
            })
        );
        let backward = LiveMark::parse("vramscope:phase=backward").unwrap();
        assert_eq!(
            (backward.phase, backward.module),
            (Some(MarkedPhase::Backward), None)
        );
        let odd = LiveMark::parse("vramscope:phase=sideways;module=;x=1").unwrap();
        assert_eq!((odd.phase, odd.module), (None, None));
        for other in ["", "mine", "vramscope", "phase=forward"] {
            assert!(LiveMark::parse(other).is_none(), "{other:?}");
        }
        assert_eq!(
            MarkedPhase::of_annotation("vramscope.phase#forward"),
            Some(MarkedPhase::Forward)
        );
        assert_eq!(
            MarkedPhase::of_annotation("Optimizer.step#AdamW.step"),
            None
        );
        assert_eq!(
            module_of_annotation("vramscope.module#GPT.h.3.attn"),
            Some("GPT.h.3.attn")
        );
        assert_eq!(module_of_annotation("vramscope.module#"), None);
        assert!(is_mark("vramscope.module#GPT"));
        assert!(is_mark("vramscope.phase#backward"));
        assert!(!is_mark("ProfilerStep#3"));
        for phase in [
            MarkedPhase::Forward,
            MarkedPhase::ForwardNoGrad,
            MarkedPhase::Backward,
        ] {
            assert_eq!(MarkedPhase::from_name(phase.as_str()), Some(phase));
        }
    }
}
