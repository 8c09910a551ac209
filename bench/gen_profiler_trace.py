#!/usr/bin/env python3
"""Writes a torch.profiler-shaped Chrome trace of about TARGET_MB megabytes.

Usage: bench/gen_profiler_trace.py OUT.json [TARGET_MB]

The trace has the shape torch.profiler writes with
`activities=[CPU, CUDA], with_stack=True, profile_memory=True`: ProfilerStep# slices, nested
python_function frames, cpu_op slices with their args, cuda_runtime launches with their
kernels and ac2g flows, [memory] events, and in each step a loop of `.item()` calls (a 4-byte
device-to-host copy and a stream sync each) at one Python line. The standard library only;
the output is deterministic.
"""

import json
import sys


def main():
    out = sys.argv[1]
    target = int(float(sys.argv[2]) * 1e6) if len(sys.argv) > 2 else 100_000_000
    pid, tid = 4242, 4242
    corr = 1
    ts = 1_000_000.0
    written = 0
    step = 0
    with open(out, "w") as f:
        f.write('{"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Generated GPU", '
                '"totalGlobalMem": 85899345920}], "traceEvents": [\n')
        first = True

        def emit(event):
            nonlocal first, written
            text = json.dumps(event)
            if not first:
                f.write(",\n")
            first = False
            f.write(text)
            written += len(text) + 2

        while written < target:
            step += 1
            start = ts
            emit({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                  "pid": pid, "tid": tid, "ts": start, "dur": 9000.0, "args": {}})
            emit({"ph": "X", "cat": "python_function", "name": "/home/u/train.py(88): main",
                  "pid": pid, "tid": tid, "ts": start + 1, "dur": 8990.0, "args": {}})
            emit({"ph": "X", "cat": "python_function", "name": "/home/u/train.py(52): train_step",
                  "pid": pid, "tid": tid, "ts": start + 2, "dur": 8980.0, "args": {}})
            t = start + 5
            live = []
            for layer in range(40):
                emit({"ph": "X", "cat": "python_function",
                      "name": "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py(1501): _call_impl",
                      "pid": pid, "tid": tid, "ts": t, "dur": 90.0, "args": {}})
                emit({"ph": "X", "cat": "python_function", "name": "/home/u/model.py(31): forward",
                      "pid": pid, "tid": tid, "ts": t + 1, "dur": 88.0, "args": {}})
                for k, op in enumerate(("aten::linear", "aten::relu")):
                    emit({"ph": "X", "cat": "cpu_op", "name": op, "pid": pid, "tid": tid,
                          "ts": t + 2, "dur": 30.0,
                          "args": {"External id": corr, "Record function id": 0,
                                   "Input Dims": [[64, 1024], [1024, 1024]],
                                   "Input type": ["float", "float"]}})
                    addr = 0x7F0000000000 + (step * 128 + layer * 2 + k) * 4 * 1024 * 1024
                    emit({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                          "pid": pid, "tid": tid, "ts": t + 3,
                          "args": {"Device Type": 1, "Device Id": 0, "Addr": addr,
                                   "Bytes": 262144, "Total Allocated": 262144 * (len(live) + 1),
                                   "Total Reserved": 1 << 30}})
                    live.append(addr)
                    emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                          "pid": pid, "tid": tid, "ts": t + 5, "dur": 4.0,
                          "args": {"External id": corr, "cbid": 211, "correlation": corr}})
                    emit({"ph": "X", "cat": "kernel", "name": "void gemm_kernel<float>()",
                          "pid": 0, "tid": 7, "ts": t + 20, "dur": 15.0,
                          "args": {"External id": corr, "device": 0, "stream": 7,
                                   "correlation": corr, "grid": [64, 1, 1], "block": [256, 1, 1]}})
                    emit({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": t + 5,
                          "cat": "ac2g", "name": "ac2g"})
                    emit({"ph": "f", "id": corr, "pid": 0, "tid": 7, "ts": t + 20,
                          "cat": "ac2g", "name": "ac2g", "bp": "e"})
                    corr += 1
                    t += 40
                t += 10
            for k in range(32):
                emit({"ph": "X", "cat": "cpu_op", "name": "aten::item", "pid": pid, "tid": tid,
                      "ts": t, "dur": 10.0, "args": {"External id": corr}})
                emit({"ph": "X", "cat": "cpu_op", "name": "aten::_local_scalar_dense",
                      "pid": pid, "tid": tid, "ts": t + 1, "dur": 8.0, "args": {}})
                emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": pid,
                      "tid": tid, "ts": t + 2, "dur": 3.0, "args": {"correlation": corr}})
                emit({"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)",
                      "pid": 0, "tid": 7, "ts": t + 3, "dur": 1.0,
                      "args": {"correlation": corr, "bytes": 4, "stream": 7}})
                corr += 1
                emit({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize",
                      "pid": pid, "tid": tid, "ts": t + 6, "dur": 2.0,
                      "args": {"correlation": corr}})
                corr += 1
                t += 12
            for n, addr in enumerate(live):
                emit({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                      "pid": pid, "tid": tid, "ts": t + n * 0.5,
                      "args": {"Device Type": 1, "Device Id": 0, "Addr": addr,
                               "Bytes": -262144, "Total Allocated": 262144 * (len(live) - n - 1),
                               "Total Reserved": 1 << 30}})
            ts = start + 10_000
        f.write("\n]}\n")
    print(f"{out}: {written / 1e6:.1f} MB, {step} steps", file=sys.stderr)


if __name__ == "__main__":
    main()
