"""A stand-in for the torch APIs that ``vramscope.attach()`` uses, over a simulated device,
for the tests where torch cannot be imported (tests put this folder on ``PYTHONPATH`` of a
child process). Not torch: no tensors, no kernels.

What it keeps is what PyTorch keeps: while ``cuda.memory._record_memory_history`` is on, a
trace of ``segment_alloc``, ``alloc``, ``free_requested`` and ``free_completed`` entries with
the Python frames of each allocation (innermost first) and ``time_us``, the
``record_function`` annotations, and the segments with their blocks, returned by
``cuda.memory._snapshot()`` in PyTorch's format. ``empty(nbytes)`` allocates (one segment per
block, cached after the free, as PyTorch's large pool does); ``Tensor.item()`` warns as
``set_sync_debug_mode("warn")`` makes PyTorch warn; ``optim.Optimizer().step()`` runs the
global step hooks; ``nn.Module`` calls run the global forward hooks, ``Tensor.backward()`` goes
through ``torch.autograd.backward``, and ``cuda.memory._set_memory_metadata`` puts its text
on the trace entries after it as ``user_metadata``.
"""

import contextlib
import os
import pickle
import sys
import threading
import time
import types
import warnings

__version__ = "0.0.0+stand-in"

_lock = threading.Lock()
_GRANULE = 2 << 20
_recording = {"on": False, "stacks": True, "max_entries": 1 << 20}
_trace = []
_annotations = []
_segments = {}  # address -> {"size": int, "block": None or (requested, frames)}
_stats = {"allocated": 0, "allocated_peak": 0, "reserved": 0, "reserved_peak": 0,
          "allocations": 0, "segments": 0, "num_alloc": 0, "num_free": 0}
_sync_mode = {"mode": 0}
# The custom allocation metadata (``_set_memory_metadata``) each new trace entry carries.
_metadata = {"text": ""}
_grad = {"enabled": True}
_module_pre_hooks = []
_module_hooks = []
_step_hooks = []
_oom_observers = []
_next_address = [0x7F0000000000]
# The device's size, for out-of-memory errors (``STAND_IN_CAPACITY`` bytes; none by default).
_capacity = int(os.environ.get("STAND_IN_CAPACITY", "0")) or None


class OutOfMemoryError(RuntimeError):
    """As ``torch.cuda.OutOfMemoryError``."""


def _now_us():
    return int(time.time() * 1_000_000)


def _frames(skip):
    if not (_recording["on"] and _recording["stacks"]):
        return []
    frames, f = [], sys._getframe(skip)
    while f is not None:
        frames.append({"filename": f.f_code.co_filename, "line": f.f_lineno,
                       "name": f.f_code.co_name})
        f = f.f_back
    return frames


def _record(action, addr, size, frames):
    if not _recording["on"]:
        return
    _trace.append({"action": action, "addr": addr, "size": size, "stream": 0,
                   "time_us": _now_us(), "frames": frames,
                   "user_metadata": _metadata["text"]})
    del _trace[:-_recording["max_entries"]]


class Tensor:
    """A block of the simulated device; freed when dropped."""

    def __init__(self, nbytes, frames):
        self.nbytes = nbytes
        with _lock:
            size = -(-max(nbytes, 1) // 512) * 512
            address = next((a for a, s in _segments.items()
                            if s["block"] is None and s["size"] >= size), None)
            oom = None
            if address is None:
                seg_size = -(-size // _GRANULE) * _GRANULE
                if _capacity is not None and _stats["reserved"] + seg_size > _capacity:
                    _stats["num_ooms"] = _stats.get("num_ooms", 0) + 1
                    # PyTorch's trace entry of an OOM carries the device's free bytes in addr.
                    _record("oom", _capacity - _stats["reserved"], size, frames)
                    oom = (_stats["reserved"], _capacity - _stats["reserved"])
                else:
                    address = _next_address[0]
                    _next_address[0] += seg_size
                    _segments[address] = {"size": seg_size, "block": None}
                    _stats["reserved"] += seg_size
                    _stats["reserved_peak"] = max(_stats["reserved_peak"], _stats["reserved"])
                    _stats["segments"] += 1
                    _record("segment_alloc", address, seg_size, frames)
            if oom is None:
                _segments[address]["block"] = (size, nbytes, frames)
                _stats["allocated"] += size
                _stats["allocated_peak"] = max(_stats["allocated_peak"], _stats["allocated"])
                _stats["allocations"] += 1
                _stats["num_alloc"] += 1
                _record("alloc", address, size, frames)
        if oom is not None:
            # As PyTorch: the observers run (outside the allocator's lock), then the error.
            for observer in list(_oom_observers):
                observer(0, size, oom[0], oom[1])
            raise OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} bytes")
        self.address = address
        self.size = size

    def __del__(self):
        if not hasattr(self, "address"):  # its allocation failed
            return
        with _lock:
            segment = _segments.get(self.address)
            if segment is None or segment["block"] is None:
                return
            segment["block"] = None
            _stats["allocated"] -= self.size
            _stats["allocations"] -= 1
            _stats["num_free"] += 1
            _record("free_requested", self.address, self.size, [])
            _record("free_completed", self.address, self.size, [])

    def backward(self):
        """As torch: ``torch.autograd.backward(self)``, looked up when called."""
        sys.modules["torch.autograd"].backward(self)

    def item(self):
        """A synchronizing read: warns as PyTorch does under ``set_sync_debug_mode("warn")``
        (a UserWarning at the calling Python line)."""
        if _sync_mode["mode"] == 1:
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)
        return 0.0


def empty(nbytes, device="cuda"):
    """Allocates ``nbytes`` on the simulated device."""
    return Tensor(nbytes, _frames(2))


def _record_memory_history(enabled="all", context="all", stacks="all", max_entries=1 << 20,
                           **_):
    _recording["on"] = bool(enabled)
    _recording["stacks"] = context is not None
    _recording["max_entries"] = max_entries


def _snapshot(device=None):
    with _lock:
        segments = []
        for address, s in sorted(_segments.items()):
            if s["block"] is None:
                blocks = [{"address": address, "size": s["size"], "requested_size": 0,
                           "state": "inactive", "frames": []}]
                allocated = 0
            else:
                size, requested, frames = s["block"]
                blocks = [{"address": address, "size": size, "requested_size": requested,
                           "state": "active_allocated", "frames": frames}]
                if s["size"] > size:
                    blocks.append({"address": address + size, "size": s["size"] - size,
                                   "requested_size": 0, "state": "inactive", "frames": []})
                allocated = size
            segments.append({"device": 0, "address": address, "total_size": s["size"],
                             "allocated_size": allocated, "active_size": allocated,
                             "requested_size": allocated, "stream": 0,
                             "segment_type": "large", "segment_pool_id": (0, 0),
                             "is_expandable": False, "frames": [], "blocks": blocks})
        return {"segments": segments, "device_traces": [list(_trace)],
                "external_annotations": list(_annotations),
                "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""}}


def _dump_snapshot(filename="dump_snapshot.pickle"):
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def memory_stats(device=None):
    with _lock:
        out = {}
        for name, current, peak in (
                ("allocated_bytes", _stats["allocated"], _stats["allocated_peak"]),
                ("reserved_bytes", _stats["reserved"], _stats["reserved_peak"]),
                ("active_bytes", _stats["allocated"], _stats["allocated_peak"]),
                ("allocation", _stats["allocations"], _stats["allocations"]),
                ("segment", _stats["segments"], _stats["segments"])):
            for pool, share in (("all", 1), ("large_pool", 1), ("small_pool", 0)):
                out[f"{name}.{pool}.current"] = current * share
                out[f"{name}.{pool}.peak"] = peak * share
                out[f"{name}.{pool}.allocated"] = 0
                out[f"{name}.{pool}.freed"] = 0
        out["num_alloc_retries"] = 0
        out["num_ooms"] = _stats.get("num_ooms", 0)
        out["num_device_alloc"] = _stats["segments"]
        out["num_device_free"] = 0
        return out


def _module(name, **attrs):
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module
    return module


class _Properties:
    total_memory = 80 << 30
    name = "Stand-in GPU"


def _set_sync_debug_mode(mode):
    _sync_mode["mode"] = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)


def _set_memory_metadata(text):
    _metadata["text"] = text


def _get_memory_metadata():
    return _metadata["text"]


memory = _module("torch.cuda.memory", _record_memory_history=_record_memory_history,
                 _snapshot=_snapshot, _dump_snapshot=_dump_snapshot,
                 _set_memory_metadata=_set_memory_metadata,
                 _get_memory_metadata=_get_memory_metadata)
cuda = _module(
    "torch.cuda", memory=memory, memory_stats=memory_stats, OutOfMemoryError=OutOfMemoryError,
    memory_summary=lambda device=None: "stand-in memory summary",
    set_sync_debug_mode=_set_sync_debug_mode, is_available=lambda: True,
    current_device=lambda: 0, device_count=lambda: 1,
    get_device_name=lambda device=None: _Properties.name,
    get_device_properties=lambda device=None: _Properties(),
    mem_get_info=lambda device=None: (_Properties.total_memory - _stats["reserved"],
                                      _Properties.total_memory))


class _Handle:
    def __init__(self, hooks, hook):
        self._hooks, self._hook = hooks, hook

    def remove(self):
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def register_optimizer_step_post_hook(hook):
    _step_hooks.append(hook)
    return _Handle(_step_hooks, hook)


class Optimizer:
    """``step()`` runs the global post hooks, as every torch optimizer does."""

    def step(self):
        for hook in list(_step_hooks):
            hook(self, (), {})


optimizer = _module("torch.optim.optimizer",
                    register_optimizer_step_post_hook=register_optimizer_step_post_hook,
                    Optimizer=Optimizer)
optim = _module("torch.optim", optimizer=optimizer, Optimizer=Optimizer)


@contextlib.contextmanager
def record_function(name):
    if _recording["on"]:
        _annotations.append({"device": 0, "stage": "START", "name": name,
                             "time_us": _now_us()})
    try:
        yield
    finally:
        if _recording["on"]:
            _annotations.append({"device": 0, "stage": "END", "name": name,
                                 "time_us": _now_us()})


profiler = _module("torch.autograd.profiler", record_function=record_function)


def _backward(tensors, *args, **kwargs):
    """Runs the backward of ``tensors``: each one's ``grad_fn`` (a plain callable here)."""
    for t in tensors if isinstance(tensors, (list, tuple)) else [tensors]:
        if getattr(t, "grad_fn", None) is not None:
            t.grad_fn()


autograd = _module("torch.autograd", profiler=profiler, backward=_backward,
                   grad=lambda outputs, inputs, **kwargs: _backward(outputs))


def is_grad_enabled():
    return _grad["enabled"]


@contextlib.contextmanager
def no_grad():
    before = _grad["enabled"]
    _grad["enabled"] = False
    try:
        yield
    finally:
        _grad["enabled"] = before


def register_module_forward_pre_hook(hook):
    _module_pre_hooks.append(hook)
    return _Handle(_module_pre_hooks, hook)


def register_module_forward_hook(hook, always_call=False):
    _module_hooks.append((hook, always_call))
    return _Handle(_module_hooks, (hook, always_call))


class Module:
    """``__call__`` runs the global forward pre-hooks, ``forward`` and the global forward
    hooks, as ``nn.Module`` does; attributes that are modules are its children."""

    def __init__(self):
        object.__setattr__(self, "_modules", {})

    def __setattr__(self, name, value):
        if isinstance(value, Module):
            self._modules[name] = value
        object.__setattr__(self, name, value)

    def __call__(self, *args):
        for hook in list(_module_pre_hooks):
            hook(self, args)
        try:
            out = self.forward(*args)
        except BaseException:
            # As torch: hooks registered with ``always_call`` run when the forward raises.
            for hook, always in list(_module_hooks):
                if always:
                    hook(self, args, None)
            raise
        for hook, _ in list(_module_hooks):
            hook(self, args, out)
        return out


class ModuleList(Module):
    """Children named ``0``, ``1``, ... as ``nn.ModuleList`` names them."""

    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


_module("torch.nn.modules.module", register_module_forward_pre_hook=register_module_forward_pre_hook,
        register_module_forward_hook=register_module_forward_hook, Module=Module)
nn = _module("torch.nn", Module=Module, ModuleList=ModuleList,
             modules=_module("torch.nn.modules", module=sys.modules["torch.nn.modules.module"]))
_C = _module("torch._C", _cuda_attach_out_of_memory_observer=_oom_observers.append)
