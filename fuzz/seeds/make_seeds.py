#!/usr/bin/env python3
"""Writes the fuzz smoke run's seeds (fuzz/smoke.sh): small inputs of each shape the targets
read, made with Python's standard library only, so that they can be made again and checked
by eye. Run from this folder: ``python3 make_seeds.py``."""

import json
import pickle

BASE = 0x7F0000000000
FRAMES = [{"filename": "train.py", "line": 9, "name": "step"},
          {"filename": "train.py", "line": 20, "name": "<module>"}]


def entry(action, addr, size, t):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": t,
            "frames": FRAMES if action == "alloc" else []}


SNAPSHOT = {
    "segments": [{
        "device": 0, "address": BASE, "total_size": 2 << 20, "allocated_size": 1 << 20,
        "active_size": 1 << 20, "requested_size": 1 << 20, "stream": 0,
        "segment_type": "small", "segment_pool_id": (0, 0), "is_expandable": False,
        "frames": [],
        "blocks": [
            {"address": BASE, "size": 1 << 20, "requested_size": 1 << 20,
             "state": "active_allocated", "frames": FRAMES},
            {"address": BASE + (1 << 20), "size": 1 << 20, "requested_size": 0,
             "state": "inactive", "frames": []},
        ],
    }],
    "device_traces": [[
        entry("segment_alloc", BASE, 2 << 20, 1),
        entry("alloc", BASE, 1 << 20, 2),
        entry("alloc", BASE + (1 << 20), 4096, 3),
        entry("free_requested", BASE + (1 << 20), 4096, 4),
        entry("free_completed", BASE + (1 << 20), 4096, 5),
    ]],
    "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"},
}

CHROME_TRACE = {"traceEvents": [
    {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 10, "s": "t",
     "args": {"Addr": BASE, "Bytes": 4096, "Total Allocated": 4096, "Total Reserved": 2 << 20,
              "Device Type": 1, "Device Id": 0}},
    {"ph": "i", "name": "[memory]", "pid": 1, "tid": 1, "ts": 20, "s": "t",
     "args": {"Addr": BASE, "Bytes": -4096, "Total Allocated": 0, "Total Reserved": 2 << 20,
              "Device Type": 1, "Device Id": 0}},
]}


def write(path, data):
    with open(path, "wb") as f:
        f.write(data)


for protocol in (2, 4, 5):
    write(f"snapshots/pytorch-p{protocol}.pickle", pickle.dumps(SNAPSHOT, protocol=protocol))
write("snapshots/chrome-trace.json", json.dumps(CHROME_TRACE).encode())
write("config/settings.txt",
      b"expandable_segments:True,max_split_size_mb:128,garbage_collection_threshold:0.8")
write("config/roundup.txt", b"roundup_power2_divisions:[256:1,512:2,>:8],backend:native")
# metrics_request: two bytes of limits (head bytes, header lines), then a request's head.
write("metrics_request/get.bin", b"\xff\x10GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
write("metrics_request/head.bin", b"\x40\x02HEAD / HTTP/1.0\r\n\r\n")
# pickle_lengths (issue 44): seven bytes choose an opcode with a length or an index, the top of
# its field, how far below it, the protocol, the values before it and the piece size; then the
# bytes after it. One seed per opcode at each top its field has (2^64 and 2^63 for the
# eight-byte ones, 2^32 and 2^31 for the four-byte ones, 2^8 for the one-byte ones), 9 below,
# protocol 5, no value before the opcode but for LONG_BINPUT's: the first is the issue's
# 15-byte pickle.
SIZED = ["BINBYTES8", "BINUNICODE8", "BYTEARRAY8", "FRAME", "BINUNICODE", "BINBYTES",
         "BINSTRING", "LONG4", "LONG_BINGET", "LONG_BINPUT", "LONG1", "SHORT_BINBYTES"]
for choice, name in enumerate(SIZED):
    tops = (0, 1) if choice < 4 else (2, 3) if choice < 10 else (4,)
    for top in tops:
        before = 1 if name == "LONG_BINPUT" else 0
        write(f"pickle_lengths/{name}-top{top}.bin",
              bytes([choice, top, 9, 0, 3, before, 7]) + b"N.N.")
