//! vramscope-tui: the terminal dashboard (work in progress).
