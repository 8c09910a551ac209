#!/usr/bin/env bash
# The size → time and memory table of big PyTorch snapshots (issues 18 and 47), with Python's
# `pickle.load` and ptmem beside vramscope, on the bench generator's files and on replicas of
# real traces, side by side.
#
#   bench/big_snapshots.sh [--replica TRACE]... [--no-generated] \
#       ../shared/traces/decomfl_opt125m_zo_fedlearn.pickle /tmp/big 1000000 4000000 10000000
#
# For each event count and each shape, the snapshot is made into the output folder when it is
# not there yet (never commit it: it is derived from a shared trace):
#   - the generator's file, by `bench/gen_pytorch_snapshot.py` from the first argument (left
#     out with --no-generated);
#   - for each --replica TRACE, a replica of that PyTorch snapshot by
#     `../shared/bench/replicate_trace.py` (or $REPLICATE): K copies on disjoint addresses,
#     shifted in time, keeping its live blocks, segments and shared frame lists, K the event
#     count over the trace's entries, rounded (at least 1).
# Then, one run each, wall time and peak RSS from `/usr/bin/time`, each line with the load
# average as the run began, and the memory as a multiple of the file:
#   - `cat FILE`, the floor: reading the file from the page cache;
#   - `VRAMSCOPE_IMPORT_TIMES=1 vramscope report FILE`: the time and memory of each phase (the
#     parse on its one core, the assembly, the analysis, the output: `rss` at the phase's end,
#     `peak` within it), in a run of its own, since it resets the peak it reads;
#   - `vramscope report FILE` (every detector) and `vramscope summary FILE`;
#   - `vramscope convert FILE --to pytorch` (into the output folder, removed after);
#   - `python3 -c 'pickle.load(...)'`, the floor for anything written in Python, and `report`
#     over it;
#   - `ptmem -s FILE` where `ptmem` is on PATH (`pip install ptmem==0.1.2`);
#   - PyTorch's `memory_viz stats FILE` where MEMORY_VIZ names its script: torch's
#     `torch/cuda/_memory_viz.py`, which needs nothing but Python's standard library, so it
#     runs from an installed torch or from the file taken out of a torch wheel
#     (`pip download torch --no-deps`, then unzip `torch/cuda/_memory_viz.py`);
#   - `vramscope view FILE` in a 200×60 tmux pane, timed until the findings panel shows its
#     counts (the first full screen), with the process's peak memory then (VmHWM), where tmux
#     is installed.
# Set VRAMSCOPE to choose the binary (default: target/release/vramscope).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
replicas=()
generated=1
while [ $# -gt 0 ]; do
    case $1 in
        --replica)
            replicas+=("$2")
            shift 2
            ;;
        --no-generated)
            generated=0
            shift
            ;;
        *) break ;;
    esac
done
if [ $# -lt 3 ]; then
    sed -n '2,40p' "$0"
    exit 2
fi
source_trace=$1
out_dir=$2
shift 2
vramscope=${VRAMSCOPE:-$here/target/release/vramscope}
replicate=${REPLICATE:-$here/../shared/bench/replicate_trace.py}
mkdir -p "$out_dir"

# The load average as a run begins: the machine may be shared.
load() {
    cut -d' ' -f1-3 /proc/loadavg
}

# The size of FILE in MiB.
file_mib() {
    echo "$(stat -L -c %s "$1") / 1048576" | bc -l
}

# measure LABEL COMMAND...: wall time and peak RSS of one run, with the load average before
# it and the peak as a multiple of $file (the file measured). Sets $wall for ratios.
measure() {
    local label=$1
    shift
    local log before
    log=$(mktemp)
    before=$(load)
    wall=
    if /usr/bin/time -f "%e %M" -o "$log" "$@" > /dev/null 2>&1; then
        read -r wall kb < "$log"
        printf '%s: %s s, %s MiB (%.2f× the file; load %s)\n' "$label" "$wall" "$((kb / 1024))" \
            "$(echo "$kb / 1024 / $(file_mib "$file")" | bc -l)" "$before"
    else
        printf '%s: failed (%s; load %s)\n' "$label" "$(tail -1 "$log")" "$before"
    fi
    rm -f "$log"
}

first_screen() {
    local file=$1 session=vramscope-bench-$$
    local start end before
    before=$(load)
    start=$(date +%s.%N)
    tmux new-session -d -s "$session" -x 200 -y 60 "$vramscope view $file"
    while tmux has-session -t "$session" 2> /dev/null; do
        if tmux capture-pane -p -t "$session" | grep -q "Findings.* errors"; then
            end=$(date +%s.%N)
            # The dashboard's peak memory so far: the high-water mark of the process in the
            # pane (the pane's own, or its child where a shell runs it), never another
            # process of the same name on a shared machine.
            local pid peak
            pid=$(tmux display -p -t "$session" '#{pane_pid}')
            if ! grep -q "^Name:.*$(basename "$vramscope" | cut -c1-15)" "/proc/$pid/status" 2> /dev/null; then
                pid=$(pgrep -n -P "$pid")
            fi
            peak=$(awk '/VmHWM/ {print int($2 / 1024)}' "/proc/$pid/status" 2> /dev/null)
            tmux kill-session -t "$session"
            printf 'view, first full screen: %.2f s, %s MiB (%.2f× the file; load %s)\n' \
                "$(echo "$end - $start" | bc)" "${peak:-0}" \
                "$(echo "${peak:-0} / $(file_mib "$file")" | bc -l)" "$before"
            return
        fi
        sleep 0.05
    done
    echo "view: exited before its first full screen"
}

# The trace entries of a PyTorch snapshot.
entries_of() {
    python3 -c 'import pickle, sys; print(sum(len(t) for t in pickle.load(open(sys.argv[1], "rb"))["device_traces"]))' "$1"
}

# The file of the generator's shape for $1 events, made if missing.
generated_file() {
    # `.torn`: made with the generator's teardown between copies (a consistent trace); files
    # of the same count made before it have no suffix and are not reused.
    local file=$out_dir/decomfl_$1.torn.pickle
    if [ ! -f "$file" ]; then
        python3 "$here/bench/gen_pytorch_snapshot.py" "$source_trace" "$1" "$file" > /dev/null || return 1
    fi
    echo "$file"
}

# The replica of trace $2 for about $1 events, made if missing.
replica_file() {
    local n k file
    n=$(entries_of "$2") || return 1
    k=$((($1 + n / 2) / n))
    [ "$k" -ge 1 ] || k=1
    file=$out_dir/replica_$(basename "$2" .pickle)_k$k.pickle
    if [ ! -f "$file" ]; then
        python3 "$replicate" "$2" "$k" "$file" > /dev/null || return 1
    fi
    echo "$file $((k * n))"
}

# run_file FILE EVENTS SHAPE: every measurement of one file.
run_file() {
    file=$1
    local shape=$3 report_wall pickle_wall
    echo "== $shape: $(basename "$file"), $2 events, $(printf '%.1f' "$(file_mib "$file")") MiB"
    measure "page cache read (cat)" cat "$file"
    echo "phases (load $(load)):"
    VRAMSCOPE_IMPORT_TIMES=1 "$vramscope" report "$file" 2>&1 > /dev/null |
        sed -e 's/^.*: parse and/parse and/' -e 's/^/  /'
    measure "vramscope report" "$vramscope" report "$file"
    report_wall=$wall
    measure "vramscope summary" "$vramscope" summary "$file"
    measure "vramscope convert --to pytorch" "$vramscope" convert "$file" --to pytorch \
        -o "$out_dir/convert.out.pickle"
    rm -f "$out_dir/convert.out.pickle"
    measure "pickle.load" python3 -c 'import pickle, sys; pickle.load(open(sys.argv[1], "rb"))' "$file"
    pickle_wall=$wall
    if [ -n "$report_wall" ] && [ -n "$pickle_wall" ]; then
        printf 'report ÷ pickle.load: %.3f×\n' "$(echo "$report_wall / $pickle_wall" | bc -l)"
    fi
    if command -v ptmem > /dev/null; then
        measure "ptmem -s" ptmem -s "$file"
    fi
    if [ -n "${MEMORY_VIZ:-}" ]; then
        measure "memory_viz stats" python3 "$MEMORY_VIZ" stats "$file"
    fi
    if command -v tmux > /dev/null && command -v bc > /dev/null; then
        first_screen "$file"
    fi
}

for events in "$@"; do
    echo "==== $events events"
    if [ "$generated" = 1 ]; then
        f=$(generated_file "$events") || exit 1
        run_file "$f" "$events" "generator's shape"
    fi
    for trace in "${replicas[@]}"; do
        read -r f n <<< "$(replica_file "$events" "$trace")" || exit 1
        [ -n "$f" ] || exit 1
        run_file "$f" "$n" "replica of $(basename "$trace")"
    done
done
