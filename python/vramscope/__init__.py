"""vramscope for Python: GPU memory debugging at the Python line.

Three ways in, all reporting through the same inspector:

* ``vramscope.SimAllocator(capacity)``: PyTorch's caching allocator on a simulated device,
  driven from Python. Every allocation carries the Python stack it was made from, so findings
  name your ``file:line``. No GPU or torch needed.
* ``vramscope.use_allocator()``: vramscope's caching allocator under PyTorch, through
  ``torch.cuda.memory.CUDAPluggableAllocator`` (this package's native module is the library),
  with statistics, snapshots, live telemetry and the Python stack of each allocation.
* ``vramscope.attach()``: keeps PyTorch's own allocator and records its history, marks steps
  at each optimizer step, catches per-element syncs, snapshots at OOM and at exit, and with
  ``listen=`` publishes it live for ``vramscope top``.

Module-level ``scope()``, ``mark_step()``, ``snapshot()``, ``report()`` and
``memory_summary()`` act on whichever of these is active (``activate()`` makes a
``SimAllocator`` the active one).

``vramscope.load(path)`` reads any file PyTorch or vramscope wrote (a snapshot pickle, a
vramscope snapshot, a profiler trace) into a :class:`Report`: the figures, findings and text
of ``vramscope report``, the top call sites, and, in Jupyter or VS Code, the interactive
explorer inline. Findings, reports and their rows are typed objects made by the Rust core.

A big job's ranks: ``vramscope.rank_summary(path)`` reduces one rank's snapshot to a small,
picklable :class:`RankSummary` where the file is (a Dask or Ray worker), and
``vramscope.compare_ranks(summaries)`` compares them wherever they are gathered, as
``vramscope summarize`` and ``vramscope ranks`` do.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterable, Iterator, List, Optional, Union

from . import _native

__all__ = [
    "SimAllocator",
    "Block",
    "Finding",
    "FindingSite",
    "Report",
    "TopSite",
    "RankSummary",
    "RankComparison",
    "rank_summary",
    "compare_ranks",
    "load",
    "report_file",
    "activate",
    "active",
    "attach",
    "use_allocator",
    "scope",
    "mark_step",
    "snapshot",
    "report",
    "report_text",
    "memory_summary",
    "parse_size",
    "format_bytes",
    "native_library_path",
    "set_stack_depth",
]

__version__ = _native.version()

Block = _native.Block
#: One diagnosis of the inspector: what, where, how much, and the fix (``text`` says it all).
Finding = _native.Finding
#: One of the sites a finding gathers.
FindingSite = _native.FindingSite
#: ``vramscope report`` on one snapshot; shows the explorer in a notebook.
Report = _native.Report
#: A row of :meth:`Report.top_sites`: a call site's bytes and blocks at the end or the peak.
TopSite = _native.TopSite
#: One rank's file reduced to what :func:`compare_ranks` needs; picklable.
RankSummary = _native.RankSummary
#: The comparison of a job's ranks (``json()``, ``text()``, ``stand_out``, ``skipped``).
RankComparison = _native.RankComparison
format_bytes = _native.format_bytes
set_stack_depth = _native.set_stack_depth

# Frames in this package are never the site a finding names.
_native.add_framework_paths([os.path.dirname(os.path.abspath(__file__)) + os.sep])


def native_library_path() -> str:
    """The path of the native module: the library to give ``CUDAPluggableAllocator``."""
    return os.path.abspath(_native.__file__)


def parse_size(size: Union[int, str]) -> int:
    """Bytes from ``4096``, ``"24GB"``, ``"512 MiB"``, ``"1.5G"``.

    Units are binary throughout, as GPU memory is sold: ``"24GB"`` is 24 GiB, as in the
    command line's ``--capacity``; the parsing is the Rust core's own.
    """
    if isinstance(size, bool):
        raise ValueError(f"not a size: {size!r}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"not a size: {size!r} (a size is not negative)")
        return size
    return _native.parse_bytes(str(size))


class SimAllocator(_native.SimAllocator):
    """PyTorch's caching allocator on a simulated device of ``capacity`` bytes.

    ``alloc(nbytes)`` returns a :class:`Block`, freed when dropped or on ``.free()``; the
    allocation's call site is the Python stack that made it. ``config`` takes
    ``PYTORCH_CUDA_ALLOC_CONF`` syntax. ``metrics="HOST:PORT"`` (or ``VRAMSCOPE_METRICS``)
    serves its statistics on ``/metrics`` for Prometheus (``.metrics.url``). ``report()`` lists the inspector's findings,
    ``inspect()`` gives the whole :class:`Report` of what was recorded so far (as
    :func:`load` gives it for a file) and ``stats()`` PyTorch's ``memory_stats()`` figures.
    """

    def __new__(cls, capacity: Union[int, str] = "80 GiB", config: str = "", backed: bool = False,
                capture_stacks: bool = True, metrics: Optional[str] = None):
        self = super().__new__(cls, parse_size(capacity), config, backed, capture_stacks)
        # ``metrics="127.0.0.1:9400"`` serves /metrics for this allocator; without it,
        # VRAMSCOPE_METRICS does, for the first face of the process that reads it.
        self.metrics = self.serve_metrics(metrics)
        return self

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        """Names the allocations made inside the ``with`` block (on this thread)."""
        token = self.open_scope(name)
        try:
            yield
        finally:
            token.close()

    def check(self, max_peak: Union[int, str, None] = None, no_leaks: bool = False,
              max_syncs_per_step: Optional[int] = None,
              since: Optional[int] = None) -> List[str]:
        """The failures of these limits, one message each (empty when all hold).

        ``since`` (``next_event_seq()`` when a test began) gives ``no_leaks`` a unit test's
        meaning when no step was marked after it: nothing allocated since is still live."""
        peak = None if max_peak is None else parse_size(max_peak)
        return super().check(peak, no_leaks, max_syncs_per_step, since)


_active: Any = None


def activate(target: Any) -> Any:
    """Makes ``target`` (a :class:`SimAllocator`, or what ``use_allocator``/``attach``
    return) the one the module-level functions act on; returns the previous one."""
    global _active
    previous, _active = _active, target
    return previous


def active() -> Any:
    """What the module-level functions act on, or None."""
    return _active


def _require() -> Any:
    if _active is None:
        raise RuntimeError(
            "vramscope is not active: call vramscope.use_allocator(), vramscope.attach() "
            "or vramscope.activate(SimAllocator(...)) first"
        )
    return _active


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """``with vramscope.scope("forward"):`` names the allocations made inside."""
    with _require().scope(name):
        yield


def mark_step() -> int:
    """Starts a new training step (``attach()`` also marks one at each optimizer step)."""
    return _require().mark_step()


def snapshot(path: str) -> str:
    """Writes a snapshot to ``path`` (``vramscope report PATH`` reads it); returns the path."""
    _require().snapshot(path)
    return path


def report() -> List[Finding]:
    """The inspector's findings on what has been recorded so far."""
    return _require().report()


def report_text() -> str:
    """The inspector's full text report."""
    return _require().report_text()


def memory_summary() -> str:
    """PyTorch's ``memory_summary()`` table."""
    return _require().memory_summary()


def report_file(path: str) -> List[Finding]:
    """The findings on a file: a vramscope snapshot, a PyTorch snapshot pickle, or a trace. A
    file with nothing in it raises ``ValueError`` with the words of ``vramscope report``."""
    return _native.file_findings(path)


def load(path: Union[str, "os.PathLike[str]"], device: Optional[int] = None) -> Report:
    """``vramscope report`` on the file at ``path`` as a :class:`Report`.

    ``path`` is a PyTorch snapshot pickle (``torch.cuda.memory._dump_snapshot``), a vramscope
    snapshot or a torch.profiler trace. The report has the figures (``peak_allocated``,
    ``allocated``, ``reserved``, ``steps``, ``stats``), ``findings``, ``verdict``,
    ``summary()`` (the text report) and ``top_sites(at="end"|"peak", n=10)``; in Jupyter or
    VS Code it shows the explorer. A file with data for several devices is reported device by
    device: ``devices`` holds a report of each, the worst first; ``verdict``, ``findings``
    (each with its ``device``), ``summary()``, ``to_dict()`` and the page are the whole
    file's, and the figures are the worst device's, which ``device`` names. ``device=N``
    reports one device. A file with nothing in it raises ``ValueError`` with the words of
    ``vramscope report``.
    """
    return _native.load(os.fspath(path), device)


def rank_summary(path: Union[str, "os.PathLike[str]"]) -> RankSummary:
    """One rank's file (a snapshot, or a summary already) reduced to its summary: what
    ``vramscope summarize`` writes. Run it where the snapshots are (``client.map`` on Dask, a
    Ray task), each snapshot freed once summarized; a file that cannot be read gives a
    summary that says why, so that :func:`compare_ranks` lists it as skipped."""
    return _native.rank_summary(os.fspath(path))


def compare_ranks(summaries: Iterable[RankSummary]) -> RankComparison:
    """Compares the ranks of ``summaries`` as ``vramscope ranks`` does: ``json()`` is its
    ``--format json`` output on the same files, byte for byte."""
    return _native.compare_ranks(list(summaries))


def use_allocator(**kwargs: Any) -> Any:
    """vramscope's caching allocator under PyTorch; see :func:`vramscope._torch.use_allocator`."""
    from . import _torch

    return _torch.use_allocator(**kwargs)


def attach(**kwargs: Any) -> Any:
    """Watch PyTorch's own allocator; see :func:`vramscope._torch.attach`."""
    from . import _torch

    return _torch.attach(**kwargs)
