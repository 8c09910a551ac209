"""Run PyTorch on vramscope's caching allocator: the lines a PyTorch user adds.

Build the library first:  cargo build --release -p vramscope-ffi
Then:                     VRAMSCOPE_SNAPSHOT_ON_EXIT=run.json python examples/pytorch_pluggable.py
And read the diagnosis:   cargo run --release -- report run.json

Settings come from the environment: VRAMSCOPE_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF syntax),
VRAMSCOPE_SNAPSHOT_ON_EXIT (a JSON snapshot written when the process exits).
"""

import contextlib
import ctypes
import os
import sys

import torch

LIB = os.environ.get(
    "VRAMSCOPE_LIB",
    os.path.join(os.path.dirname(__file__), "..", "target", "release", "libvramscope_ffi.so"),
)

# 1. Point PyTorch at vramscope before the first CUDA allocation.
allocator = torch.cuda.memory.CUDAPluggableAllocator(LIB, "vramscope_malloc", "vramscope_free")
torch.cuda.memory.change_current_allocator(allocator)

# 2. vramscope gives back what a pluggable allocator loses: statistics and snapshots.
vramscope = ctypes.CDLL(LIB)
vramscope.vramscope_memory_summary.restype = ctypes.c_ssize_t
vramscope.vramscope_snapshot.argtypes = [ctypes.c_char_p]
vramscope.vramscope_push_scope.argtypes = [ctypes.c_int, ctypes.c_char_p]


@contextlib.contextmanager
def scope(name: str):
    """Names the allocations this thread makes inside the block. Through the pluggable
    allocator vramscope sees no Python stack, so scopes are what tell the allocations apart in
    the snapshot and the dashboard. The backward pass runs on autograd's own thread: its
    allocations carry no scope."""
    opened = vramscope.vramscope_push_scope(torch.cuda.current_device(), name.encode()) == 0
    try:
        yield
    finally:
        if opened:
            vramscope.vramscope_pop_scope()


def memory_summary(device: int = 0) -> str:
    buf = ctypes.create_string_buffer(1 << 16)
    n = vramscope.vramscope_memory_summary(device, buf, len(buf))
    return buf.value.decode() if 0 <= n < len(buf) else ""


# 3. An ordinary training loop, with vramscope_mark_step() marking each step.
model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 10)).cuda()
optimizer = torch.optim.AdamW(model.parameters())
losses = []
for step in range(20):
    vramscope.vramscope_mark_step()
    with scope("forward"):
        x = torch.randn(256, 1024, device="cuda")
        loss = model(x).square().mean()
    loss.backward()
    with scope("optimizer"):
        optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())  # a host number: no leak

print(memory_summary())
vramscope.vramscope_snapshot(b"pluggable_snapshot.json")
print("snapshot written to pluggable_snapshot.json", file=sys.stderr)
