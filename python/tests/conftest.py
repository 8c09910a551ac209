"""Shared helpers of the Python tests: the line numbers of marked source lines."""

import pathlib

pytest_plugins = ["pytester"]


def line_of(path, marker):
    """The 1-based line of the only line in ``path`` that contains ``marker``."""
    lines = pathlib.Path(path).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if marker in text and "line_of(" not in text]
    assert len(found) == 1, f"{marker!r} marks {len(found)} lines of {path}"
    return found[0]
