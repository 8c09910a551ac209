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

/// File endings of C, C++, CUDA and assembly sources and headers: a frame in one of these is
/// compiled code, never a line the user of a Python framework changes.
const COMPILED_ENDINGS: &[&str] = &[
    ".c", ".cc", ".cpp", ".cxx", ".c++", ".h", ".hh", ".hpp", ".hxx", ".inl", ".cu", ".cuh", ".s",
    ".asm", ".tcc",
];

/// Path fragments of the C and C++ runtimes and of PyTorch's own compiled libraries, whose
/// frames may carry a file and a line in a symbolized dump (a conda build's
/// `libstdc++-v3/src/c++11/thread.cc:82`).
const COMPILED_PATHS: &[&str] = &[
    "libstdc++",
    "libgcc",
    "glibc",
    "/libc/",
    "libtorch",
    "/c10/",
    "/aten/",
    "/torch/csrc/",
];

/// Whether `frame` is compiled code rather than a source line a reader changes: a frame
/// without a line ([`is_native_frame`]), a C, C++, CUDA or assembly file (`.cc`, `.cpp`, `.cu`,
/// `.h`, `.S`, ...), a file of the C or C++ runtime or of PyTorch's compiled libraries
/// (`libstdc++`, libc, `libtorch`, `c10/`, `aten/`), or a system source
/// ([`is_system_source`]). Such a frame never names a call site: an autograd thread's stack
/// symbolized down to `thread.cc:82 (execute_native_thread_routine)` is named by its
/// autograd node instead.
pub fn is_compiled_frame(frame: &Frame) -> bool {
    if is_native_frame(frame) || is_system_source(frame) || is_generated_frame(frame) {
        return true;
    }
    let path = frame.file.replace('\\', "/").to_ascii_lowercase();
    if path.ends_with(".py") {
        return false;
    }
    COMPILED_ENDINGS.iter().any(|e| path.ends_with(e))
        || COMPILED_PATHS.iter().any(|p| path.contains(p))
}

/// Whether `frame` is code a program generated at run time rather than a line anyone wrote:
/// TorchInductor's compiled kernels and wrappers (`/tmp/torchinductor_<user>/.../c7x...py`),
/// an FX graph's code (`<eval_with_key>.12`), `exec` of a string (`<string>`), a frozen
/// module (`<frozen runpy>`) and the wrappers of decorators (`<decorator-gen-12>`). An IPython
/// cell (`<ipython-input-3-...>`) is the user's. Such a frame never names a call site: the
/// user's frame that calls it does.
pub fn is_generated_frame(frame: &Frame) -> bool {
    /// How the pseudo-files of generated code begin.
    const GENERATED_FILES: &[&str] = &[
        "<string>",
        "<eval_with_key>",
        "<frozen ",
        "<decorator-gen-",
        "<torch_package_",
    ];
    let file = frame.file.as_str();
    GENERATED_FILES.iter().any(|g| file.starts_with(g))
        || file.replace('\\', "/").contains("/torchinductor_")
}

/// The cell of a Jupyter notebook that `file` names (IPython's kernel runs each cell from
/// a file `/tmp/ipykernel_<pid>/<cell hash>.py`), as its hash, or `None` for another file.
pub fn notebook_cell(file: &str) -> Option<&str> {
    let file = file.strip_suffix(".py")?;
    let (dir, cell) = file.rsplit_once(['/', '\\'])?;
    let kernel = dir.rsplit(['/', '\\']).next()?;
    let pid = kernel.strip_prefix("ipykernel_")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(pid) && digits(cell)).then_some(cell)
}

/// How a reader is shown line `line` of `file`: `file:line`, or for a notebook's cell
/// ([`notebook_cell`]) `notebook cell 3983704831, line 5`, since the kernel's temporary file
/// names nothing a reader can open.
pub fn frame_label(file: &str, line: u32) -> String {
    match notebook_cell(file) {
        Some(cell) => format!("notebook cell {cell}, line {line}"),
        None => format!("{file}:{line}"),
    }
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
    if !is_compiled_frame(&own) {
        return SiteName {
            label: frame_label(&site.file, site.line),
            function: site.function.clone(),
            native: false,
        };
    }
    // No frame of the user's: the autograd node the stack runs in names it first (the
    // backward pass), then the innermost source line of any framework code.
    if let Some(node) = autograd_node(&site.frames) {
        return SiteName {
            label: format!("{node} (backward)"),
            function: node,
            native: true,
        };
    }
    if let Some(f) = site.frames.iter().find(|f| !is_compiled_frame(f)) {
        return SiteName {
            label: frame_label(&f.file, f.line),
            function: f.function.clone(),
            native: false,
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

    #[test]
    fn generated_code_is_never_a_site_and_a_notebook_cell_is_a_cell() {
        let generated = [
            "/tmp/torchinductor_alice/7q/c7qwhx5lfkqv2.py",
            "<eval_with_key>.12",
            "<string>",
            "<frozen runpy>",
        ];
        for file in generated {
            assert!(is_generated_frame(&frame(file, 53, "call")), "{file}");
            assert!(is_compiled_frame(&frame(file, 53, "call")), "{file}");
        }
        let user = frame("/home/alice/train.py", 53, "train");
        assert!(!is_generated_frame(&user));
        let cell = frame("<ipython-input-3-6a1b2c>", 4, "<module>");
        assert!(!is_compiled_frame(&cell));
        assert_eq!(
            frame_label("/tmp/ipykernel_22383/3983704831.py", 5),
            "notebook cell 3983704831, line 5"
        );
        assert_eq!(notebook_cell("/tmp/ipykernel_x/3983704831.py"), None);
        assert_eq!(notebook_cell("/tmp/kernel_22383/3983704831.py"), None);
        assert_eq!(frame_label("/home/a/train.py", 5), "/home/a/train.py:5");
        // A site whose own frame is a notebook cell is named by its cell.
        let site = CallSite {
            file: "/tmp/ipykernel_22383/3983704831.py".to_string(),
            line: 5,
            column: 0,
            function: "<module>".to_string(),
            frames: Vec::new(),
        };
        assert_eq!(
            name_call_site(&site).label,
            "notebook cell 3983704831, line 5"
        );
    }

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
    fn a_compiled_frame_with_a_line_never_names_the_stack() {
        let site = native_site(vec![
            frame(
                "??",
                0,
                "c10::cuda::CUDACachingAllocator::Native::malloc(void**)",
            ),
            frame("/home/me/ext/kernel.cu", 31, "my_ext::launch"),
            frame("./nptl/pthread_create.c", 442, "start_thread"),
        ]);
        assert_eq!(name_call_site(&site).label, "[my_ext::launch]");
        let site = native_site(vec![frame("./train.py", 12, "step")]);
        assert_eq!(name_call_site(&site).label, "./train.py:12");
    }

    #[test]
    fn a_symbolized_autograd_thread_is_named_by_its_node() {
        // A conda build symbolizes the autograd thread down to libstdc++'s thread entry, with
        // a file and a line; PyTorch's own sources carry lines too.
        let conda = "/opt/conda/conda-bld/gcc-compiler_1654084175708/work/gcc/libstdc++-v3";
        let mut own = native_site(vec![
            frame(
                "/opt/conda/pytorch/c10/cuda/CUDACachingAllocator.cpp",
                1425,
                "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc",
            ),
            frame(
                "/opt/conda/pytorch/torch/csrc/autograd/generated/Functions.cpp",
                4410,
                "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
            ),
            frame(
                "/opt/conda/pytorch/torch/csrc/autograd/engine.cpp",
                1081,
                "torch::autograd::Engine::thread_main",
            ),
            frame(
                &format!("{conda}/src/c++11/thread.cc"),
                82,
                "execute_native_thread_routine",
            ),
            frame("??", 0, "start_thread"),
        ]);
        // The importer's primary frame falls back to the innermost one when no frame is the
        // user's: a C++ file with a line.
        own.file = own.frames[0].file.clone();
        own.line = own.frames[0].line;
        let name = name_call_site(&own);
        assert_eq!(name.label, "MmBackward0 (backward)");
        assert!(name.native);
        for f in &own.frames {
            assert!(is_compiled_frame(f), "{f:?}");
        }
        assert!(!is_compiled_frame(&frame(
            "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py",
            1762,
            "_call_impl"
        )));
    }
}
