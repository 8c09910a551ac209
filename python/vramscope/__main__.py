"""``python -m vramscope ARGS``: the ``vramscope`` command, run by this Python.

``python -m vramscope run [OPTIONS] train.py ARGS`` watches ``train.py`` run by this very
interpreter (``vramscope run [OPTIONS] -- sys.executable train.py ARGS``); every other
subcommand is the command line as it is.
"""

from __future__ import annotations

import sys
from typing import List, Optional

from ._cli import main as _main

# The options of `vramscope run` that take a value as the next argument.
_VALUED = {"--snapshot", "--oom-snapshot", "--listen", "--metrics", "--allocator"}


def run_args(args: List[str]) -> List[str]:
    """``run`` arguments with this interpreter put before the script: ``[OPTIONS] script
    ARGS`` becomes ``[OPTIONS] -- sys.executable script ARGS``; ``[OPTIONS] -- COMMAND`` is
    left as it is."""
    options: List[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            # What follows is a whole command (`python -m vramscope run -- python x.py`).
            return [*options, *args[i:]]
        if not arg.startswith("-") or arg == "-":
            break
        options.append(arg)
        if arg in _VALUED and i + 1 < len(args):
            options.append(args[i + 1])
            i += 1
        i += 1
    rest = args[i:]
    if not rest:
        return options
    return [*options, "--", sys.executable, *rest]


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["run"]:
        args = ["run", *run_args(args[1:])]
    return _main(args)


if __name__ == "__main__":
    sys.exit(main())
