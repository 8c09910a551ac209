"""The ``vramscope`` command installed by pip: runs the Rust command line bundled in the
package (``vramscope/_bin/vramscope``, built with the package)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Optional


def binary() -> Optional[str]:
    """The bundled command line's path, or None when the package was built without it."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "vramscope")
    if os.path.isfile(here) and os.access(here, os.X_OK):
        return here
    return None


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    path = binary()
    if path is None:
        print("vramscope: this installation has no command line binary (it was built with "
              "VRAMSCOPE_BUNDLE_CLI=0); reinstall without it, or `cargo install --path .` "
              "from the repository", file=sys.stderr)
        return 2
    if os.name == "posix" and argv is None:
        os.execv(path, [path, *args])
    return subprocess.call([path, *args])


if __name__ == "__main__":
    sys.exit(main())
