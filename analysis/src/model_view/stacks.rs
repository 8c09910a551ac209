//! Which frames of a call stack are the user's own code.
//!
//! A frame is the framework's, not the user's, when `vramscope_import::sites::is_framework_frame`
//! says so for the path fragments the importers use by default ([`default_framework_paths`]:
//! PyTorch, `site-packages`, `dist-packages`); C++ frames and the standard library never count
//! as the user's. `steps` uses these paths to find the loop of a trace without marks and to
//! suggest `--step-marker` names, and `crate::detect::retained` uses them to name the line that
//! keeps leaked memory. [`common_caller`] applies the same rule to a list of call sites.

use vramscope_engine::is_native_frame;
use vramscope_model::{CallSite, Frame};

/// The framework path fragments the importers use by default.
pub(crate) fn default_framework_paths() -> Vec<String> {
    vramscope_import::sites::DEFAULT_FRAMEWORK_PATHS
        .iter()
        .map(|s| s.to_string())
        .collect()
}

/// The innermost frame of the user's own code common to every stack in `sites` (compared
/// from the outermost frame in), or `None` when the stacks have no frames or share no user
/// frame. Stacks without a Python frame (C++ only) take no part.
pub fn common_caller(sites: &[&CallSite]) -> Option<Frame> {
    let framework = default_framework_paths();
    let stacks: Vec<Vec<&Frame>> = sites
        .iter()
        .map(|s| {
            s.frames
                .iter()
                .rev()
                .filter(|f| !is_native_frame(f))
                .collect::<Vec<_>>()
        })
        .filter(|f: &Vec<&Frame>| !f.is_empty())
        .collect();
    let first = stacks.first()?;
    let mut common = first.len();
    for other in &stacks[1..] {
        common = common.min(first.iter().zip(other).take_while(|(a, b)| a == b).count());
    }
    first[..common]
        .iter()
        .rev()
        .find(|f| !vramscope_import::sites::is_framework_frame(f, &framework))
        .map(|f| (*f).clone())
}

/// The line that keeps what a stack allocated, and the line that made it.
///
/// PyTorch users keep memory through a line of their loop (`outputs.append(model(x))`) while
/// the blocks are made deep inside the model (`model.py:201` in `forward`): the line to change
/// is the one outside the module call chain. [`kept_line`] works this out for one stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptLine {
    /// The user's frame that keeps the memory: the caller of the outermost `nn.Module` call
    /// when the stack passes through one, else the allocating line itself.
    pub keeper: Frame,
    /// The user's innermost frame: the line that allocated.
    pub made_at: Frame,
    /// The user's frames from `keeper` in to `made_at`, both included, outermost first.
    pub path: Vec<Frame>,
}

/// Whether `frame` is one of the frames `nn.Module.__call__` puts between a caller and a
/// module's `forward` (`_wrapped_call_impl`, `_call_impl`, or `__call__` in
/// `torch/nn/modules/module.py`).
pub fn is_module_call(frame: &Frame) -> bool {
    let function = frame.function.rsplit('.').next().unwrap_or("");
    match function {
        "_call_impl" | "_wrapped_call_impl" => true,
        "__call__" => frame
            .file
            .replace('\\', "/")
            .ends_with("nn/modules/module.py"),
        _ => false,
    }
}

/// The keeping line of a stack (innermost frame first) under `framework` paths (the importer's
/// `ImportOptions::framework_paths`, PyTorch and `site-packages` by default): the user's frame just outside the outermost module call that
/// has user code inside it, else the innermost user frame. `None` when no frame is the user's
/// (an autograd thread's C++ stack).
pub fn kept_line(frames: &[Frame], framework: &[String]) -> Option<KeptLine> {
    let user = |f: &Frame| !vramscope_import::sites::is_framework_frame(f, framework);
    let made = frames.iter().position(user)?;
    let mut keeper = made;
    let mut outer_user: Option<usize> = None;
    for i in (0..frames.len()).rev() {
        if user(&frames[i]) {
            outer_user = Some(i);
        } else if let Some(caller) = outer_user {
            if i > made && is_module_call(&frames[i]) {
                keeper = caller;
                break;
            }
        }
    }
    let path = (made..=keeper)
        .rev()
        .filter(|&i| user(&frames[i]))
        .map(|i| frames[i].clone())
        .collect();
    Some(KeptLine {
        keeper: frames[keeper].clone(),
        made_at: frames[made].clone(),
        path,
    })
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

    const TORCH: &str = "/venv/lib/python3.11/site-packages/torch";

    #[test]
    fn a_model_call_is_kept_by_its_caller_and_made_inside() {
        let call = |line| frame(&format!("{TORCH}/nn/modules/module.py"), line, "_call_impl");
        let stack = vec![
            frame("??", 0, "at::native::addmm"),
            frame(&format!("{TORCH}/nn/modules/linear.py"), 125, "forward"),
            call(1762),
            frame("/home/u/model.py", 120, "forward"),
            call(1762),
            frame("/home/u/model.py", 201, "forward"),
            call(1762),
            frame("/home/u/evaluate.py", 57, "evaluate"),
            frame("/home/u/evaluate.py", 90, "<module>"),
        ];
        let kept = kept_line(&stack, &default_framework_paths()).expect("user frames");
        assert_eq!(kept.keeper.line, 57);
        assert_eq!(kept.made_at.line, 120);
        let lines: Vec<u32> = kept.path.iter().map(|f| f.line).collect();
        assert_eq!(lines, vec![57, 201, 120]);
    }

    #[test]
    fn a_plain_line_keeps_what_it_makes() {
        let stack = vec![
            frame("??", 0, "at::native::mul"),
            frame(&format!("{TORCH}/_tensor.py"), 40, "wrapped"),
            frame("/home/u/train.py", 163, "train"),
            frame("/home/u/train.py", 300, "<module>"),
        ];
        let kept = kept_line(&stack, &default_framework_paths()).expect("user frames");
        assert_eq!(kept.keeper, kept.made_at);
        assert_eq!(kept.keeper.line, 163);
        assert_eq!(kept.path.len(), 1);
        let backward = vec![frame("??", 0, "MmBackward0::apply")];
        assert_eq!(kept_line(&backward, &default_framework_paths()), None);
    }
}
