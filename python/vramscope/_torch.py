"""vramscope under PyTorch: ``use_allocator()`` and ``attach()``.

Only public torch APIs are used (``torch.cuda.memory.CUDAPluggableAllocator``,
``change_current_allocator``, ``_record_memory_history``, ``_dump_snapshot``,
``torch.optim.optimizer.register_optimizer_step_post_hook``, ``set_sync_debug_mode``, the OOM
observer). torch is imported inside the functions, so ``import vramscope`` works without it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pickle
import sys
import tempfile
import threading
import time
import types
import warnings
import weakref
from typing import Any, Dict, Iterator, List, Optional, Tuple

from . import Finding, _native, activate, parse_size


_FRAMEWORK = ("/torch/", "site-packages/", "dist-packages/")


def _torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - exercised where torch is absent
        raise RuntimeError("vramscope.use_allocator() and attach() need torch") from e
    return torch


class SyncRecorder:
    """Records the synchronizing calls ``torch.cuda.set_sync_debug_mode("warn")`` reports,
    at the Python line that made them, instead of printing the warnings.

    Each warning becomes a sync in a native :class:`vramscope._native.HostLog`, with the
    warning's ``file:line`` and the Python stack from there outwards, in the current step;
    the session merges the log into its snapshot, where the inspector's ``sync_in_loop``
    detector and the ``max_syncs_per_step`` check find the syncs at their line.
    """

    MARKER = "synchroniz"

    def __init__(self) -> None:
        self.log = _native.HostLog()
        self.step = 0
        self._previous = None

    def install(self) -> None:
        warnings.filterwarnings("always", message=f".*{self.MARKER}.*")
        self._previous = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if self.MARKER in str(message):
                self.record(filename, lineno)
                return
            self._previous(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning

    def record(self, filename: str, lineno: int) -> Tuple[str, int, str]:
        """Records one sync that a warning put at ``filename:lineno``; returns its site
        ``(file, line, function)``: that line, or inside framework code (``print`` of a tensor
        formats it in torch) the user's own frame that led there."""
        return self.log.sync(filename, lineno)

    def mark_step(self, step: int) -> None:
        self.step = step
        self.log.mark_step(step)

    def findings(self) -> List[Finding]:
        """The inspector's findings on the syncs alone: ``sync_in_loop`` at each site that
        synchronized once per step or more over three steps or more (``info`` at one per
        step, a warning above)."""
        return self.log.findings()

    def check(self, limit: int) -> Optional[str]:
        """The ``max_syncs_per_step`` failure of the syncs alone, or None."""
        failures = self.log.check(limit)
        return failures[0] if failures else None


def _step_hook(callback) -> Any:
    torch = _torch()
    register = getattr(torch.optim.optimizer, "register_optimizer_step_post_hook", None)
    if register is None:
        return None
    return register(lambda optimizer, args, kwargs: callback())


class PluggableSession:
    """vramscope's allocator serving PyTorch (what ``use_allocator()`` returns)."""

    def __init__(self, device: Optional[int], syncs: Optional[SyncRecorder]) -> None:
        self._device = device
        self.syncs = syncs
        self.step = 0

    @property
    def device(self) -> int:
        if self._device is None:
            self._device = _torch().cuda.current_device()
        return self._device

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        _native.device_push_scope(self.device, name)
        try:
            yield
        finally:
            _native.device_pop_scope()

    def mark_step(self) -> int:
        _native.device_mark_step()
        self.step += 1
        if self.syncs is not None:
            self.syncs.mark_step(self.step)
        return self.step

    def arm(self, on: bool) -> None:
        _native.device_arm(on)

    @property
    def log(self) -> Any:
        """The native log of the syncs caught, or None."""
        return None if self.syncs is None else self.syncs.log

    def snapshot(self, path: str) -> None:
        _native.device_snapshot(self.device, path, self.log)

    def report(self) -> List[Finding]:
        return _native.device_findings(self.device, self.log)

    def report_text(self) -> str:
        return _native.device_report_text(self.device, self.log)

    def memory_summary(self) -> str:
        return _native.device_memory_summary(self.device)

    def stats(self) -> Dict[str, Any]:
        return _native.device_stats(self.device)

    def next_event_seq(self) -> int:
        """The sequence number of the allocator's next event: a check's ``since`` mark."""
        return _native.device_next_event_seq(self.device)

    def check(self, max_peak=None, no_leaks=False, max_syncs_per_step=None,
              since: Optional[int] = None) -> List[str]:
        peak = None if max_peak is None else parse_size(max_peak)
        return _native.device_check(self.device, peak, no_leaks, max_syncs_per_step, self.log,
                                    since)


def use_allocator(listen: Optional[str] = None, snapshot_on_exit: Optional[str] = None,
                  stacks: str = "python", device: Optional[int] = None,
                  catch_syncs: bool = True, native_stacks: Optional[int] = None,
                  metrics: Optional[str] = None) -> PluggableSession:
    """Makes vramscope's caching allocator PyTorch's CUDA allocator (before any CUDA
    allocation), with the Python stack of each allocation as its call site.

    ``stacks``: ``"python"`` walks the Python stack on every thread that runs Python (taking
    the GIL when the torch binding released it, as PyTorch's own history recording does; never
    on autograd's or other C++ threads), ``"held"`` only when the GIL is already held, ``"off"``
    never. On a thread without Python (autograd's backward pass) one allocation in
    ``native_stacks`` (16 unless ``VRAMSCOPE_NATIVE_STACKS`` says otherwise; 0: none) carries
    its native stack, which reports name by its autograd node (``MmBackward0 (backward)``).
    ``listen`` publishes live telemetry (``unix:PATH`` or ``tcp:127.0.0.1:PORT``) for
    ``vramscope top``; ``snapshot_on_exit`` writes a snapshot when Python exits.
    ``metrics`` (``127.0.0.1:PORT``; port 0 picks one), or else ``VRAMSCOPE_METRICS``, serves
    the allocator's statistics of every device as Prometheus ``/metrics``, from now on; the
    session's ``metrics`` says where (``.addr``, ``.url``; None without a server).
    """
    torch = _torch()
    metrics_addr = _native.serve_metrics(metrics or None)
    _native.set_stack_mode(stacks)
    if native_stacks is not None:
        _native.set_native_stacks(native_stacks)
    if listen:
        _native.set_listen(listen)
    allocator = torch.cuda.memory.CUDAPluggableAllocator(
        os.path.abspath(_native.__file__), "vramscope_malloc", "vramscope_free")
    torch.cuda.memory.change_current_allocator(allocator)
    syncs = None
    if catch_syncs:
        syncs = SyncRecorder()
        syncs.install()
        torch.cuda.set_sync_debug_mode("warn")
    session = PluggableSession(device, syncs)
    session.torch_allocator = allocator
    # The C library's own server, over the allocator PyTorch allocates through (not
    # `torch.cuda.memory_stats()`, which PyTorch does not keep for a pluggable allocator).
    session.metrics = None if metrics_addr is None else types.SimpleNamespace(
        addr=metrics_addr, url=f"http://{metrics_addr}/metrics")
    session.hook = _step_hook(session.mark_step)
    if snapshot_on_exit:
        atexit.register(_quiet, session.snapshot, snapshot_on_exit)
    activate(session)
    return session


def _quiet(fn, *args) -> None:
    try:
        fn(*args)
        print(f"vramscope: snapshot written to {args[0]}", file=sys.stderr)
    except Exception as e:  # noqa: BLE001 - at exit, say it and go on
        print(f"vramscope: no snapshot at exit: {e}", file=sys.stderr)


class LiveFeeder(threading.Thread):
    """Feeds a :class:`vramscope._native.LivePublisher` from PyTorch while a dashboard is
    attached (and does nothing otherwise): ``memory_stats()`` every ``stats_interval``
    seconds, and the allocation history (``torch.cuda.memory._snapshot()``, pickled and
    converted natively without the GIL) every ``history_interval`` seconds at the most often,
    spaced further so that taking it costs at most ``budget`` of the wall time. An error is
    counted (``errors``, ``last_error``) and never reaches the program."""

    def __init__(self, publisher: Any, torch: Any, device: int, session: Any,
                 stats_interval: float = 0.1, history_interval: float = 1.0,
                 budget: float = 0.02) -> None:
        super().__init__(name="vramscope-live-feeder", daemon=True)
        self.publisher = publisher
        self.torch = torch
        self.device = device
        self.session = session
        self.stats_interval = stats_interval
        self.history_interval = history_interval
        self.budget = budget
        self.history_calls = 0
        self.history_seconds = 0.0
        self.errors = 0
        self.last_error = ""
        self._stop_event = threading.Event()

    def run(self) -> None:
        next_history = 0.0
        while not self._stop_event.wait(self.stats_interval):
            if self.publisher.clients == 0:
                next_history = 0.0
                continue
            try:
                self.publisher.stats(self.torch.cuda.memory_stats(self.device), self.session.step)
                now = time.monotonic()
                if now >= next_history:
                    start = time.perf_counter()
                    data = pickle.dumps(self.torch.cuda.memory._snapshot(),
                                        protocol=pickle.HIGHEST_PROTOCOL)
                    self.publisher.history(data)
                    cost = time.perf_counter() - start
                    self.history_calls += 1
                    self.history_seconds += cost
                    next_history = now + max(self.history_interval, cost / self.budget)
            except Exception as e:  # noqa: BLE001 - the program must never see it
                self.errors += 1
                self.last_error = repr(e)

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)


class AttachSession:
    """PyTorch's own allocator, watched (what ``attach()`` returns)."""

    def __init__(self, stacks: bool, max_entries: int, syncs: Optional[SyncRecorder],
                 oom_snapshot: Optional[str]) -> None:
        torch = _torch()
        self.torch = torch
        self.syncs = syncs
        self.step = 0
        self.scopes: List[Any] = []
        self.live: Any = None
        self.feeder: Optional[LiveFeeder] = None
        self.marks: Optional[ModuleMarks] = None
        torch.cuda.memory._record_memory_history(
            enabled="all", context="all" if stacks else None,
            stacks="python" if stacks else "all", max_entries=max_entries)
        self.oom_snapshot = oom_snapshot
        if oom_snapshot:
            observer = getattr(torch._C, "_cuda_attach_out_of_memory_observer", None)
            if observer is not None:
                observer(self._on_oom)

    def publish(self, listen: str, device: Optional[int] = None) -> str:
        """Publishes live telemetry on ``listen`` for ``vramscope top``; returns the address."""
        torch = self.torch
        if device is None:
            device = torch.cuda.current_device()
        name, capacity = "", 0
        try:
            name = torch.cuda.get_device_name(device)
            capacity = int(torch.cuda.get_device_properties(device).total_memory)
        except Exception:  # noqa: BLE001 - the name and capacity are only shown
            pass
        self.live = _native.LivePublisher(listen, device, name, capacity)
        self.feeder = LiveFeeder(self.live, torch, device, self)
        self.feeder.start()
        atexit.register(self.close)
        return self.live.addr

    def close(self) -> None:
        """Stops live telemetry (the dashboards are told the program ended)."""
        if self.feeder is not None:
            self.feeder.stop()
            self.feeder = None
        if self.live is not None:
            self.live.close()

    def _on_oom(self, device, alloc, device_alloc, device_free) -> None:
        self.snapshot(self.oom_snapshot)
        print(f"vramscope: out of memory on device {device}; snapshot written to "
              f"{self.oom_snapshot}", file=sys.stderr)

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[None]:
        with self.torch.autograd.profiler.record_function(name):
            yield

    def mark_step(self) -> int:
        self.step += 1
        # An annotation in the recorded history, where this torch records them; the
        # inspector numbers steps from `ProfilerStep#N` marks.
        with self.torch.autograd.profiler.record_function(f"ProfilerStep#{self.step}"):
            pass
        if self.syncs is not None:
            self.syncs.mark_step(self.step)
        if self.live is not None:
            self.live.mark_step(self.step)
        return self.step

    @property
    def log(self) -> Any:
        """The native log of the syncs caught, or None."""
        return None if self.syncs is None else self.syncs.log

    def snapshot(self, path: str) -> None:
        """PyTorch's snapshot pickle at ``path``; a path ending in ``.json`` gets a vramscope
        snapshot instead, made from it with the syncs caught merged in."""
        if path.endswith(".json"):
            self._with_file(lambda p: _native.file_convert(p, path, self.log))
        else:
            self.torch.cuda.memory._dump_snapshot(path)

    def _with_file(self, fn) -> Any:
        fd, path = tempfile.mkstemp(suffix=".pickle", prefix="vramscope-")
        os.close(fd)
        try:
            self.torch.cuda.memory._dump_snapshot(path)
            return fn(path)
        finally:
            os.unlink(path)

    def report(self) -> List[Finding]:
        return self._with_file(lambda p: _native.file_findings(p, self.log))

    def report_text(self) -> str:
        return self._with_file(lambda p: _native.file_report_text(p, self.log))

    def memory_summary(self) -> str:
        return self.torch.cuda.memory_summary()

    def stats(self) -> Dict[str, Any]:
        return dict(self.torch.cuda.memory_stats())

    def check(self, max_peak=None, no_leaks=False, max_syncs_per_step=None) -> List[str]:
        peak = None if max_peak is None else parse_size(max_peak)
        return self._with_file(
            lambda p: _native.file_check(p, peak, no_leaks, max_syncs_per_step, self.log))


def _serve_torch_metrics(torch: Any, addr: Optional[str]) -> Any:
    """A ``/metrics`` server of ``torch.cuda.memory_stats()`` for the current device, at
    ``addr`` or where ``VRAMSCOPE_METRICS`` asks; None when neither does."""
    device = torch.cuda.current_device()
    server = _native.serve_stats_metrics(addr, lambda: torch.cuda.memory_stats(device), device,
                                         mem_info=lambda: torch.cuda.mem_get_info(device))
    if server is None:
        return None
    atexit.register(server.close)
    print(f"vramscope: serving PyTorch's allocator statistics on {server.url}", file=sys.stderr)
    return server


def _child_path(parent: Any, module: Any, depth: int = 4) -> Optional[str]:
    """The attribute path from ``parent`` down to ``module`` among its submodules
    (``layers.3`` for a block a forward calls out of a ``ModuleList``), searched ``depth``
    levels deep, nearest first; None when it is not among them."""
    level = [("", parent)]
    for _ in range(depth):
        below = []
        for prefix, m in level:
            for name, child in getattr(m, "_modules", {}).items():
                if child is None:
                    continue
                path = f"{prefix}{name}"
                if child is module:
                    return path
                below.append((f"{path}.", child))
        level = below
    return None


class ModuleMarks:
    """Marks where a PyTorch program is in the history ``attach()`` records, so that a dump
    can say which module's forward made each block and in which phase (issue 46).

    - Each ``nn.Module`` call is a ``record_function`` annotation ``vramscope.module#PATH``
      (``START`` at a global forward pre-hook, ``END`` at the forward hook), where ``PATH`` is
      the module's place in its model: the outermost module's class name, then the attribute
      names down to it (``GPT.h.3.attn``).
    - The outermost module call is also ``vramscope.phase#forward`` (or
      ``vramscope.phase#forward_no_grad`` where gradients are off, whose outputs the
      backward never reads), and ``torch.autograd.backward`` (which ``Tensor.backward`` calls)
      and ``torch.autograd.grad`` are ``vramscope.phase#backward``. Optimizer steps and
      ``zero_grad`` carry PyTorch's own annotations (``Optimizer.step#AdamW.step``).
    - Where this torch keeps custom allocation metadata
      (``torch.cuda.memory._set_memory_metadata``, ``user_metadata`` in a dump), each
      allocation also carries ``vramscope:phase=forward;module=GPT.h.3.attn`` (the innermost
      module and the phase) while it is made, and the metadata the program had set is put
      back when the call returns.

    Annotations are PyTorch's ``external_annotations``, recorded with their time: every
    reader of a dump already has them. The names and the metadata's text are read back in one
    place, the Rust ``vramscope_model::marks``; change both together. ``remove()`` takes the
    hooks and the wrappers away.
    """

    PREFIX = "vramscope"

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self._local = threading.local()
        self._names: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
        self._handles: List[Any] = []
        self._wrapped: List[Tuple[Any, str, Any]] = []
        memory = torch.cuda.memory
        self._set_metadata = getattr(memory, "_set_memory_metadata", None)
        self._get_metadata = getattr(memory, "_get_memory_metadata", None)

    # The open calls of this thread: (module, path, record_function, metadata before).
    def _stack(self) -> List[Tuple[Any, str, Any, Any, Any]]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack

    def install(self) -> "ModuleMarks":
        """Registers the hooks and wraps the backward entry points; a torch without global
        module hooks gets the phases of the backward only."""
        module = getattr(getattr(getattr(self.torch, "nn", None), "modules", None), "module",
                         None)
        pre = getattr(module, "register_module_forward_pre_hook", None)
        post = getattr(module, "register_module_forward_hook", None)
        if pre is not None and post is not None:
            self._handles.append(pre(self._pre))
            try:
                # Called even when a forward raises (torch 2.0 and later), so that its marks
                # end with it.
                self._handles.append(post(self._post, always_call=True))
            except TypeError:
                self._handles.append(post(self._post))
        autograd = self.torch.autograd
        for name in ("backward", "grad"):
            original = getattr(autograd, name, None)
            if original is not None:
                setattr(autograd, name, self._phase_wrapper(original, "backward"))
                self._wrapped.append((autograd, name, original))
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, original in self._wrapped:
            setattr(owner, name, original)
        self._wrapped.clear()

    def path(self, module: Any, parent: Optional[Tuple[Any, str]]) -> str:
        """The module's place in its model: ``GPT.h.3.attn``."""
        name = self._names.get(module)
        if name is not None:
            return name
        if parent is None:
            name = type(module).__name__
        else:
            parent_module, parent_path = parent
            child = _child_path(parent_module, module)
            name = f"{parent_path}.{child if child is not None else type(module).__name__}"
        try:
            self._names[module] = name
        except TypeError:  # not weakly referable: named again next time
            pass
        return name

    def _annotation(self, name: str) -> Any:
        rf = self.torch.autograd.profiler.record_function(name)
        rf.__enter__()
        return rf

    def _metadata(self, text: str) -> Any:
        """Sets the allocation metadata to ``text``; returns what it was (None: no metadata
        in this torch)."""
        if self._set_metadata is None:
            return None
        before = self._get_metadata() if self._get_metadata is not None else ""
        self._set_metadata(text)
        return before

    def _pre(self, module: Any, args: Any) -> None:
        try:
            stack = self._stack()
            parent = (stack[-1][0], stack[-1][1]) if stack else None
            path = self.path(module, parent)
            if stack:
                outer_phase, phase = stack[0][3], None
            else:
                grad = self.torch.is_grad_enabled()
                outer_phase = "forward" if grad else "forward_no_grad"
                phase = self._annotation(f"{self.PREFIX}.phase#{outer_phase}")
            rf = self._annotation(f"{self.PREFIX}.module#{path}")
            before = self._metadata(f"{self.PREFIX}:phase={outer_phase};module={path}")
            stack.append((module, path, (rf, phase), outer_phase, before))
        except Exception:  # noqa: BLE001 - marking must never break the program
            pass

    def _post(self, module: Any, args: Any, output: Any) -> None:
        try:
            stack = self._stack()
            # Calls whose forward raised never reached their hook: closed with this one.
            while stack:
                entry = stack.pop()
                (rf, phase), before = entry[2], entry[4]
                rf.__exit__(None, None, None)
                if phase is not None:
                    phase.__exit__(None, None, None)
                if before is not None:
                    self._set_metadata(before)
                if entry[0] is module:
                    break
        except Exception:  # noqa: BLE001 - marking must never break the program
            pass

    def _phase_wrapper(self, original: Any, phase: str) -> Any:
        marks = self

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with marks.torch.autograd.profiler.record_function(f"{marks.PREFIX}.phase#{phase}"):
                before = marks._metadata(f"{marks.PREFIX}:phase={phase}")
                try:
                    return original(*args, **kwargs)
                finally:
                    if before is not None:
                        marks._set_metadata(before)

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        wrapper.__doc__ = getattr(original, "__doc__", None)
        return wrapper


def attach(listen: Optional[str] = None, snapshot_on_exit: Optional[str] = None,
           stacks: bool = True, max_entries: int = 200_000, catch_syncs: bool = True,
           oom_snapshot: Optional[str] = None, metrics: Optional[str] = None,
           modules: bool = True) -> AttachSession:
    """Keeps PyTorch's allocator and records it: the allocation history with Python stacks
    (``_record_memory_history``), a step at each optimizer step, the synchronizing calls at
    their Python line (``set_sync_debug_mode("warn")``, warnings captured, not shown), a
    snapshot at OOM (``oom_snapshot``) and at exit (``snapshot_on_exit``, a PyTorch pickle
    ``vramscope report`` reads). ``listen`` (``unix:PATH`` or ``tcp:127.0.0.1:PORT``)
    publishes live telemetry for ``vramscope top``: while a dashboard is attached, a
    background thread sends ``memory_stats()`` ten times a second and the new part of the
    recorded history about once a second (less often when taking it costs more than 2% of the
    time). ``metrics`` (``HOST:PORT``, or ``VRAMSCOPE_METRICS``) serves
    ``torch.cuda.memory_stats()`` on ``/metrics`` under vramscope's metric names, read at each
    scrape. ``modules`` marks each module call and the forward and backward phases in the
    history (:class:`ModuleMarks`), so that a dump says which module and phase made what;
    ``session.marks.remove()`` stops it.
    """
    torch = _torch()
    syncs = None
    if catch_syncs:
        syncs = SyncRecorder()
        syncs.install()
        torch.cuda.set_sync_debug_mode("warn")
    session = AttachSession(stacks, max_entries, syncs, oom_snapshot)
    if listen:
        addr = session.publish(listen)
        print(f"vramscope: publishing PyTorch's allocator on {addr}; watch it with "
              f"`vramscope top {addr}`", file=sys.stderr)
    session.metrics = _serve_torch_metrics(torch, metrics)
    session.hook = _step_hook(session.mark_step)
    session.marks = ModuleMarks(torch).install() if modules else None
    if snapshot_on_exit:
        atexit.register(_quiet, session.snapshot, snapshot_on_exit)
    activate(session)
    return session
