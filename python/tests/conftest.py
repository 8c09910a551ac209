"""Shared helpers of the Python tests: the line numbers of marked source lines."""

import pathlib

pytest_plugins = ["pytester"]


def line_of(path, marker):
    """The 1-based line of the only line in ``path`` that contains ``marker``."""
    lines = pathlib.Path(path).read_text().splitlines()
    found = [i + 1 for i, text in enumerate(lines) if marker in text and "line_of(" not in text]
    assert len(found) == 1, f"{marker!r} marks {len(found)} lines of {path}"
    return found[0]


def names_site(text, path, line):
    """Whether ``text`` names ``path:line``: whole, or relative to the folder that every site
    shares, which a report states once ("sites are under PREFIX and shown relative to it") and
    a one-line verdict leaves out (issue 42: long shared prefixes are said once)."""
    path = str(path)
    if f"{path}:{line}" in text:
        return True
    parts = path.split("/")
    return any(
        f"{'/'.join(parts[k:])}:{line}" in text and _starts_a_name(text, "/".join(parts[k:]), line)
        for k in range(1, len(parts))
    )


def _starts_a_name(text, relative, line):
    """Whether ``relative:line`` occurs in ``text`` where a name starts (not as the tail of a
    longer, different path)."""
    needle = f"{relative}:{line}"
    start = text.find(needle)
    while start != -1:
        if start == 0 or text[start - 1] in " \t\n(`'\"":
            return True
        start = text.find(needle, start + 1)
    return False
