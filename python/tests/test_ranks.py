"""A big job's ranks from Python (issue 48): ``vramscope.rank_summary`` as the map on a real
Dask cluster of worker processes (``distributed.LocalCluster``), ``vramscope.compare_ranks``
as the reduce. 200 ranks made by the simulated allocator, with a little noise between them,
one that leaks at one site and one that runs a larger batch, and a file that is no snapshot:
the comparison names exactly the two planted ranks, lists the bad file as skipped with the
reason, and its JSON is the same, byte for byte, from the snapshots, from their summaries and
through Dask."""

import json
import os
import pickle
import shutil
import subprocess
import sys

import vramscope
from conftest import line_of

HERE = os.path.abspath(__file__)
MIB = 1 << 20
RANKS = 200
LEAK = 17
BATCH = 143


def run_rank(rank, path):
    """One rank of a data-parallel job: weights, four activations a step freed at its end; the
    rank ``BATCH`` runs a batch half again as large, the rank ``LEAK`` keeps 8 MiB a step."""
    alloc = vramscope.SimAllocator("64 GiB")
    weights = alloc.alloc(512 * MIB)
    per_sample = 32 * MIB
    samples = 3 if rank == BATCH else 2
    wobble = (rank * 7919) % 97 * 16 * 1024  # up to 1.5 MiB of noise a tensor
    kept = []
    for _ in range(6):
        alloc.mark_step()
        activations = [alloc.alloc(samples * per_sample + wobble) for _ in range(4)]
        if rank == LEAK:
            kept.append(alloc.alloc(8 * MIB))  # THE-LEAK
        for block in activations:
            block.free()
    alloc.snapshot(str(path))
    del weights, kept


def command():
    found = shutil.which("vramscope", path=os.path.dirname(sys.executable))
    assert found, "the vramscope console script is not installed next to this Python"
    return found


def ranks_json(inputs):
    """``vramscope ranks --format json`` on ``inputs``: its standard output, and its exit
    status (1: a file was skipped)."""
    out = subprocess.run([command(), "ranks", "--format", "json", *inputs], capture_output=True,
                         timeout=300)
    assert out.returncode == 1, out.stderr.decode()
    assert b"skipped rank 200" in out.stderr, out.stderr.decode()
    return out.stdout.decode()


def test_two_planted_ranks_of_200_the_same_from_snapshots_summaries_and_dask(tmp_path):
    from distributed import Client, LocalCluster

    job = tmp_path / "job"
    job.mkdir()
    for rank in range(RANKS):
        run_rank(rank, job / f"rank{rank}.json")
    (job / f"rank{RANKS}.json").write_bytes(b"\0" * 4096)
    paths = sorted((str(job / name) for name in os.listdir(job)))

    # From the snapshots, on the command line.
    from_snapshots = ranks_json([str(job)])
    verdict = json.loads(from_snapshots)
    assert sorted({f["rank"] for f in verdict["findings"]}) == [LEAK, BATCH], verdict["findings"]
    by_rank = {f["rank"]: f for f in verdict["findings"]}
    assert by_rank[BATCH]["kind"] == "rank_imbalance"
    assert by_rank[LEAK]["kind"] == "rank_retains_more"
    leak_site = by_rank[LEAK]["sites_at_end"][0]
    assert leak_site["site"].endswith(f"test_ranks.py:{line_of(HERE, '# THE-LEAK')}"), leak_site
    assert leak_site["bytes"] == 6 * 8 * MIB
    assert len(verdict["ranks"]) == RANKS
    [failed] = verdict["failed"]
    assert failed["rank"] == RANKS and failed["skipped"] == "unreadable"
    assert f"rank{RANKS}.json" in failed["error"], failed

    # From their summaries: made here, written as `vramscope summarize` writes them, read by
    # the command line (a summary and a snapshot mixed as well).
    summaries_dir = tmp_path / "summaries"
    summaries_dir.mkdir()
    summaries = [vramscope.rank_summary(p) for p in paths]
    for summary, path in zip(summaries, paths):
        (summaries_dir / os.path.basename(path)).write_text(summary.json())
        assert len(summary.json()) < 16 * 1024, "a summary is kilobytes"
    assert summaries[0] == pickle.loads(pickle.dumps(summaries[0]))
    [bad] = [s for s in summaries if s.rank == RANKS]
    assert bad.skipped is not None and f"rank{RANKS}.json" in bad.skipped, bad
    assert ranks_json([str(summaries_dir)]) == from_snapshots
    assert vramscope.compare_ranks(summaries).json() == from_snapshots

    # Through Dask: the map on worker processes, the reduce here.
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        futures = client.map(vramscope.rank_summary, paths)
        gathered = client.gather(futures)
    comparison = vramscope.compare_ranks(gathered)
    assert comparison.json() == from_snapshots
    assert comparison.stand_out == [LEAK, BATCH]
    assert comparison.skipped[0][0] == RANKS
    text = comparison.text()
    assert f"ranks 0–{RANKS} alike but {LEAK} and {BATCH}; {RANKS} skipped" in text, text
    assert text.count("\n") < 40, "no row per rank past a few ranks"
    assert len(comparison.text(all=True).splitlines()) > RANKS
