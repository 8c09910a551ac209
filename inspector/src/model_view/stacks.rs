//! Which frames of a call stack are the user's own code.
//!
//! A frame is the framework's, not the user's, when `crate::import::sites::is_framework_frame`
//! says so for the path fragments the importers use by default ([`default_framework_paths`]:
//! PyTorch, `site-packages`, `dist-packages`); C++ frames and the standard library never count
//! as the user's. `steps` uses these paths to find the loop of a trace without marks and to
//! suggest `--step-marker` names, and `crate::detect::retained` uses them to name the line that
//! keeps leaked memory. [`common_caller`] applies the same rule to a list of call sites.

use vramscope_engine::is_native_frame;
use vramscope_model::{CallSite, Frame};

/// The framework path fragments the importers use by default.
pub(crate) fn default_framework_paths() -> Vec<String> {
    crate::import::sites::DEFAULT_FRAMEWORK_PATHS
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
        .find(|f| !crate::import::sites::is_framework_frame(f, &framework))
        .map(|f| (*f).clone())
}
