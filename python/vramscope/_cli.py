"""The ``vramscope`` command installed by pip: the Rust command line, built into the package's
native module (``vramscope._native.cli``), so the wheel has one build and nothing to go stale."""

from __future__ import annotations

import sys
from typing import List, Optional

from . import _native


def main(argv: Optional[List[str]] = None) -> int:
    """Runs ``vramscope ARGS`` (``sys.argv[1:]`` by default) and returns its exit status."""
    args = sys.argv[1:] if argv is None else argv
    try:
        return _native.cli(["vramscope", *args])
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
