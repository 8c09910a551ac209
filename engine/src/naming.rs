//! Names for call sites: the line a reader is shown for a stack.
//!
//! A call site's own frame is usually the user's line (`train.py:42`). A stack with C++
//! frames only (PyTorch's autograd thread runs the backward pass without a Python frame)
//! has no line of its own; showing `??:0` would name nothing. [`name_call_site`] names it by
//! its autograd node (`MmBackward0 (backward)`, from the frame names), else by its innermost
//! C++ function that is not the allocator's own. `super::SiteGroups` groups sites by these
//! names, so every view (reports, diff, the dashboard, the explorer) shows the same name.

use vramscope_model::{CallSite, Frame};

/// A call site named for a reader.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteName {
    /// `file:line`, `MmBackward0 (backward)`, or a C++ function in brackets.
    pub label: String,
    /// The function at that place.
    pub function: String,
    /// Whether the stack has no source line of its own (C++ frames only).
    pub native: bool,
}

/// Whether `frame` is a C++ frame without a source line (`??`, empty file, or line 0).
pub fn is_native_frame(frame: &Frame) -> bool {
    frame.file.is_empty() || frame.file == "??" || frame.line == 0
}

/// Whether `frame`'s source line belongs to the system's libraries rather than to code a
/// reader wrote: glibc (`./nptl/pthread_create.c`, `../sysdeps/...`, the paths of its build
/// tree), the C++ standard library's headers (`/usr/include/c++/...`) and anything else under
/// `/usr/`. A C library with debug information gives `start_thread` a line; naming an autograd
/// thread's allocation `pthread_create.c:442` would hide its autograd node. Python files are
/// never system sources here (a user's `./train.py` is the user's).
pub fn is_system_source(frame: &Frame) -> bool {
    let file = frame.file.as_str();
    !file.ends_with(".py")
        && (file.starts_with("/usr/")
            || file.starts_with("./")
            || file.starts_with("../")
            || file.contains("/include/c++/")
            || file.contains("/sysdeps/")
            || file.contains("/nptl/"))
}

/// The autograd node a stack runs in (`MmBackward0`, `AccumulateGrad`), from its C++ frame
/// names (`torch::autograd::generated::MmBackward0::apply(...)`), innermost first.
pub fn autograd_node(frames: &[Frame]) -> Option<String> {
    for frame in frames {
        let name = frame.function.split('(').next().unwrap_or("");
        for token in name.split("::") {
            let token = token.split('<').next().unwrap_or("").trim();
            let digits = token.trim_end_matches(|c: char| c.is_ascii_digit());
            let node = (digits.ends_with("Backward") && digits.len() > "Backward".len())
                || token == "AccumulateGrad";
            if node && token.starts_with(|c: char| c.is_ascii_uppercase()) {
                return Some(token.to_string());
            }
        }
    }
    None
}

/// Names `site` for a reader, as the inspector's `ModelView::site_name` and every report do.
pub fn name_call_site(site: &CallSite) -> SiteName {
    let own = Frame {
        file: site.file.clone(),
        line: site.line,
        function: site.function.clone(),
    };
    if !is_native_frame(&own) {
        return SiteName {
            label: site.file_line(),
            function: site.function.clone(),
            native: false,
        };
    }
    if let Some(f) = site
        .frames
        .iter()
        .find(|f| !is_native_frame(f) && !is_system_source(f))
    {
        return SiteName {
            label: format!("{}:{}", f.file, f.line),
            function: f.function.clone(),
            native: false,
        };
    }
    if let Some(node) = autograd_node(&site.frames) {
        return SiteName {
            label: format!("{node} (backward)"),
            function: node,
            native: true,
        };
    }
    // The innermost C++ function that is not the allocator's or the unwinder's own.
    let internal = |f: &str| {
        f.is_empty()
            || f.contains("unwind")
            || f.contains("CachingAllocator")
            || f.contains("c10::cuda")
            || f.contains("empty_")
            || f.contains("::empty")
            || f.contains("gather")
            || f.contains("Context")
    };
    let function = site
        .frames
        .iter()
        .map(|f| f.function.as_str())
        .find(|f| !internal(f))
        .or_else(|| site.frames.first().map(|f| f.function.as_str()))
        .unwrap_or(site.function.as_str());
    let short = short_function(function);
    SiteName {
        label: if short.is_empty() {
            "(C++ only stack)".to_string()
        } else {
            format!("[{short}]")
        },
        function: function.to_string(),
        native: true,
    }
}

/// A C++ function's name without its argument list or anonymous namespaces:
/// `at::(anonymous namespace)::create_out(c10::ArrayRef<long>, ...)` is `at::create_out`.
pub fn short_function(function: &str) -> String {
    let unnamed = function.replace("(anonymous namespace)::", "");
    unnamed.split('(').next().unwrap_or("").trim().to_string()
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

    fn native_site(frames: Vec<Frame>) -> CallSite {
        CallSite {
            file: "??".to_string(),
            line: 0,
            column: 0,
            function: String::new(),
            frames,
        }
    }

    #[test]
    fn an_autograd_thread_is_named_by_its_node_even_when_libc_has_lines() {
        let site = native_site(vec![
            frame(
                "??",
                0,
                "c10::cuda::CUDACachingAllocator::Native::malloc(void**)",
            ),
            frame(
                "??",
                0,
                "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
            ),
            frame(
                "/usr/include/c++/12/bits/std_thread.h",
                253,
                "std::thread::_State_impl::_M_run()",
            ),
            frame("./nptl/pthread_create.c", 442, "start_thread"),
            frame("../sysdeps/unix/sysv/linux/x86_64/clone3.S", 81, "__clone3"),
        ]);
        let name = name_call_site(&site);
        assert_eq!(name.label, "MmBackward0 (backward)");
        assert!(name.native);
    }

    #[test]
    fn a_line_of_the_users_own_cpp_or_python_still_names_the_stack() {
        let site = native_site(vec![
            frame(
                "??",
                0,
                "c10::cuda::CUDACachingAllocator::Native::malloc(void**)",
            ),
            frame("/home/me/ext/kernel.cpp", 31, "my_ext::launch"),
            frame("./nptl/pthread_create.c", 442, "start_thread"),
        ]);
        assert_eq!(name_call_site(&site).label, "/home/me/ext/kernel.cpp:31");
        let site = native_site(vec![frame("./train.py", 12, "step")]);
        assert_eq!(name_call_site(&site).label, "./train.py:12");
    }
}
