#!/usr/bin/env bash
# GPU check for vramscope: the CUDA tests, the examples on the GPU, PyTorch on vramscope's
# allocator (CUDAPluggableAllocator), PyTorch's own allocator against vramscope's replay of it
# (scripts/torch_fidelity.py, where python3 has a CUDA-enabled torch) and the allocator
# fast-path benchmark, and the Python package with torch (examples/pytorch_leak.py through
# attach() and use_allocator(), and their step-time overhead), in about 5 minutes on an H200.
#
#   scripts/gpu-check.sh [LOG_DIR]   build (when cargo is here) and run everything; with LOG_DIR,
#                                    also write gpu-check.log and the example snapshots there
#   scripts/gpu-check.sh --bundle    only build the binaries into target/gpu-check, to carry to
#                                    a CUDA machine that has no Rust toolchain; the first form
#                                    run there uses that bundle
#
# Every step runs even when an earlier one failed; the script ends with one line
# "gpu-check: N passed, M failed" and exits non-zero when anything failed.
set -uo pipefail
cd "$(dirname "$0")/.."

BUNDLE=target/gpu-check

bundle() {
    echo "== building the release binaries into $BUNDLE"
    rm -rf "$BUNDLE" && mkdir -p "$BUNDLE" || return 1
    local log status
    log="$(mktemp)"
    # Test and bench binaries: cargo names each one on an "Executable" line.
    {
        cargo test --release -p vramscope-kernels --lib --tests --no-run &&
        cargo test --release -p vramscope-allocator --lib --no-run &&
        cargo bench -p vramscope-allocator --bench fast_path --no-run
    } >"$log" 2>&1
    status=$?
    cat "$log"
    [ "$status" -eq 0 ] || return 1
    while IFS='|' read -r what path; do
        local name
        case "$what" in
            unittests*) name="$(basename "${path%-*}")-unit" ;;
            *) name="$(basename "${path%-*}")" ;;
        esac
        cp "$path" "$BUNDLE/$name" || return 1
    done < <(sed -n 's/.*Executable \(.*\) (\(.*\))$/\1|\2/p' "$log")
    cargo build --release --example train_mlp --bin vramscope || return 1
    cargo build --release -p vramscope-ffi || return 1
    cp target/release/examples/train_mlp target/release/vramscope target/release/libvramscope_ffi.so \
        "$BUNDLE/" || return 1
    # The Python package as a wheel (maturin comes from PyPI here; the GPU machine may have no
    # network), with the command line inside its native module.
    if python3 -m pip wheel --no-deps -q -w "$BUNDLE" ./python; then
        echo "built $(ls "$BUNDLE"/vramscope-*.whl)"
    else
        echo "could not build the Python wheel here; the Python steps will not run"
    fi
    # Debug info is not needed to run and would make the bundle too big to carry.
    if command -v strip >/dev/null 2>&1; then
        strip --strip-debug "$BUNDLE"/* 2>/dev/null || true
    fi
    ls -l "$BUNDLE"
}

if [ "${1:-}" = "--bundle" ]; then
    bundle
    exit $?
fi

LOG_DIR="${1:-}"
if [ -n "$LOG_DIR" ]; then
    mkdir -p "$LOG_DIR"
    exec > >(tee "$LOG_DIR/gpu-check.log") 2>&1
fi
OUT_DIR="${LOG_DIR:-$(mktemp -d)}"

# The driver and NVRTC are opened at run time by name (libcuda.so.1, libnvrtc.so): put the
# folders that hold them on the loader path, and give an NVRTC that only has a versioned name
# (libnvrtc.so.13) the plain name too.
add_lib_dir() {
    case ":${LD_LIBRARY_PATH:-}:" in *":$1:"*) ;; *) export LD_LIBRARY_PATH="$1${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ;; esac
}
for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu /usr/lib64; do
    [ -e "$dir/libcuda.so.1" ] && add_lib_dir "$dir"
done
nvrtc=""
for pattern in /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda/targets/*/lib/libnvrtc.so* \
    /usr/local/cuda-*/lib64/libnvrtc.so* /usr/lib/x86_64-linux-gnu/libnvrtc.so* \
    /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib/libnvrtc.so* \
    /usr/local/lib/python3*/dist-packages/nvidia/*/lib/libnvrtc.so*; do
    for candidate in $pattern; do
        case "$candidate" in *builtins*|*alt*) continue ;; esac
        [ -e "$candidate" ] && { nvrtc="$candidate"; break 2; }
    done
done
if [ -n "$nvrtc" ]; then
    add_lib_dir "$(dirname "$nvrtc")"
    shim="$(mktemp -d)"
    ln -s "$nvrtc" "$shim/libnvrtc.so"
    add_lib_dir "$shim"
fi

echo "== machine"
uname -srm
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "NVRTC: ${nvrtc:-not found}"
echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"

if command -v cargo >/dev/null 2>&1; then
    bundle || { echo "gpu-check: 0 passed, 1 failed (build)"; exit 1; }
elif [ ! -x "$BUNDLE/train_mlp" ]; then
    echo "no cargo here and no $BUNDLE: run 'scripts/gpu-check.sh --bundle' on a machine with cargo and carry $BUNDLE"
    echo "gpu-check: 0 passed, 1 failed (nothing to run)"
    exit 1
fi

passed=0
failed=0
failures=""
step() {
    local name="$1" limit="$2"
    shift 2
    echo
    echo "== $name"
    local start=$SECONDS
    if timeout "$limit" "$@"; then
        passed=$((passed + 1))
        echo "-- $name: ok ($((SECONDS - start)) s)"
    else
        failed=$((failed + 1))
        failures="$failures $name"
        echo "-- $name: FAILED ($((SECONDS - start)) s)"
    fi
}

if "$BUNDLE/vramscope" --help 2>/dev/null | grep -q doctor; then
    step "doctor" 60 "$BUNDLE/vramscope" doctor
else
    echo "(this vramscope has no doctor command; the allocator test doctor_reports_every_line prints the report)"
fi
# The CUDA tests print "skipped: no CUDA driver (...)" where there is none, so the output
# says whether the GPU was really used.
step "allocator CUDA backend tests" 120 "$BUNDLE/vramscope_allocator-unit" --nocapture cuda:: any::
for test in "$BUNDLE"/cuda "$BUNDLE"/tensor_sim "$BUNDLE"/train "$BUNDLE"/cpu_kernels "$BUNDLE"/vramscope_kernels-unit; do
    step "kernels test $(basename "$test")" 180 "$test" --nocapture --test-threads 1
done
step "train_mlp" 120 "$BUNDLE/train_mlp" --out "$OUT_DIR/train_mlp.json"
step "train_mlp --retain-loss --item-in-loop" 120 \
    "$BUNDLE/train_mlp" --retain-loss --item-in-loop --out "$OUT_DIR/train_mlp_bugs.json"
step "train_mlp --bf16 --grad-accum 4" 120 \
    "$BUNDLE/train_mlp" --bf16 --grad-accum 4 --out "$OUT_DIR/train_mlp_bf16_accum.json"
step "report on the planted bugs" 60 "$BUNDLE/vramscope" report "$OUT_DIR/train_mlp_bugs.json"
# PyTorch on the GPU: its training loop on vramscope's allocator through CUDAPluggableAllocator,
# and PyTorch's own allocator recorded and replayed through vramscope's `pytorch` policy.
if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    export BUNDLE OUT_DIR ROOT="$PWD"
    step "pytorch on vramscope (CUDAPluggableAllocator)" 180 bash -c '
        cd "$OUT_DIR" &&
        VRAMSCOPE_LIB="$ROOT/$BUNDLE/libvramscope_ffi.so" VRAMSCOPE_SNAPSHOT_ON_EXIT=pluggable_exit.json \
            python3 "$ROOT/examples/pytorch_pluggable.py" &&
        python3 -c "import json; scopes = set(json.load(open(\"pluggable_snapshot.json\"))[\"scopes\"]); print(\"scopes:\", sorted(scopes)); assert {\"forward\", \"optimizer\"} <= scopes" &&
        "$ROOT/$BUNDLE/vramscope" report pluggable_snapshot.json &&
        "$ROOT/$BUNDLE/vramscope" summary pluggable_exit.json'
    # The Python package: examples/pytorch_leak.py through attach() and use_allocator(), each
    # asserting the findings name the planted Python lines, then the step-time overhead.
    wheel="$(ls "$BUNDLE"/vramscope-*.whl 2>/dev/null | head -1)"
    if [ -n "$wheel" ]; then
        export PYVENV="$OUT_DIR/pyvenv"
        step "python package: install the wheel beside torch" 120 bash -c '
            python3 -m venv --system-site-packages "$PYVENV" &&
            "$PYVENV/bin/pip" install --no-index --no-deps --force-reinstall "'"$wheel"'" &&
            "$PYVENV/bin/vramscope" --help >/dev/null'
        step "pytorch_leak.py through attach(): the bugs at their Python lines" 180 \
            "$PYVENV/bin/python" examples/pytorch_leak.py --mode attach --check \
            --snapshot "$OUT_DIR/pytorch_leak_attach.pickle"
        # Live: the example publishes through attach(listen=...), and a dashboard in another
        # process (vramscope._native.read_telemetry, as `vramscope top` reads) must get its
        # allocations at their Python lines. The example waits for the dashboard at its end.
        step "pytorch_leak.py through attach(listen=...): a dashboard reads it live" 180 bash -c '
            sock="$OUT_DIR/pytorch_leak.sock"
            rm -f "$sock"
            "$PYVENV/bin/python" examples/pytorch_leak.py --mode attach --listen "unix:$sock" \
                >"$OUT_DIR/pytorch_leak_live.log" 2>&1 &
            example=$!
            "$PYVENV/bin/python" - "$sock" <<"EOF"
import json, os, sys, time
from vramscope import _native
sock = sys.argv[1]
deadline = time.monotonic() + 60
while not os.path.exists(sock):
    assert time.monotonic() < deadline, "pytorch_leak.py never published on " + sock
    time.sleep(0.05)
seen = json.loads(_native.read_telemetry("unix:" + sock, 90.0))
allocs = [e for e in seen["events"] if e["kind"] == "alloc"]
named = [e for e in allocs if "examples/pytorch_leak.py" in (e["site"] or "")]
print(len(allocs), "alloc events,", len(named), "at examples/pytorch_leak.py; ended:", seen["ended"])
assert named, [e["site"] for e in allocs[:20]]
EOF
            read_status=$?
            wait "$example" || { echo "pytorch_leak.py failed:"; cat "$OUT_DIR/pytorch_leak_live.log"; exit 1; }
            exit "$read_status"'
        step "pytorch_leak.py through use_allocator(): the bugs at their Python lines" 180 \
            "$PYVENV/bin/python" examples/pytorch_leak.py --mode use_allocator --check \
            --snapshot "$OUT_DIR/pytorch_leak_pluggable.json"
        step "report names the Python lines of the use_allocator() snapshot" 60 bash -c '
            "$PYVENV/bin/vramscope" report "$OUT_DIR/pytorch_leak_pluggable.json" |
                grep -E "retained_per_step|examples/pytorch_leak.py"'
        # No code change: the plain example (no vramscope in it) run under `vramscope run`.
        step "vramscope run: an unmodified script, its snapshot and verdict" 180 bash -c '
            "$PYVENV/bin/vramscope" run --snapshot "$OUT_DIR/run.pickle" -- \
                "$PYVENV/bin/python" examples/pytorch_leak.py --mode plain --steps 40 \
                2>"$OUT_DIR/run.log"; status=$?
            cat "$OUT_DIR/run.log"
            [ "$status" -eq 0 ] && [ -s "$OUT_DIR/run.pickle" ] &&
                grep -E "retained_per_step at [^ ]*examples/pytorch_leak.py" "$OUT_DIR/run.log"'
        step "step time: plain torch, attach() without and with stacks, use_allocator()" 300 bash -c '
            for mode in plain attach-nostacks attach use_allocator; do
                "$PYVENV/bin/python" examples/pytorch_leak.py --mode $mode --bugs off --steps 200 --time |
                    grep step_ms || exit 1
            done'
    else
        echo "skipped: no vramscope wheel in $BUNDLE; the Python package steps did not run"
    fi
    step "pytorch fidelity: its allocator and vramscope's replay, in nine cases" 300 \
        python3 scripts/torch_fidelity.py check --vramscope "$BUNDLE/vramscope" --out "$OUT_DIR/fidelity"
else
    echo "skipped: no python3 with a CUDA-enabled torch here; the PyTorch steps did not run"
fi
step "fast-path benchmark" 240 "$BUNDLE/fast_path" --bench --warm-up-time 1 --measurement-time 2

echo
[ -n "$failures" ] && echo "failed steps:$failures"
echo "gpu-check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
