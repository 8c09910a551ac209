"""A finding about kept memory names the line that keeps it and the line that made it."""

from vramscope import Finding


def test_kept_memory_names_both_lines():
    finding = Finding.from_json(
        {
            "kind": "retained_per_step",
            "severity": "error",
            "site": "evaluate.py:57",
            "function": "evaluate",
            "bytes": 90 << 20,
            "count": 90,
            "summary": "keeps memory alive every step",
            "fix": "at evaluate.py:57, run the loop under torch.no_grad()",
            "made_at": "model.py:201",
            "frames": ["evaluate.py:57 (evaluate)", "model.py:201 (forward)"],
        }
    )
    assert finding.made_at == "model.py:201"
    assert finding.frames[0].startswith("evaluate.py:57")
    assert "at evaluate.py:57 in evaluate (made at model.py:201)" in finding.text


def test_a_plain_leak_says_one_line():
    finding = Finding.from_json(
        {
            "kind": "retained_per_step",
            "severity": "warning",
            "site": "train.py:163",
            "function": "train",
            "bytes": 5120,
            "count": 10,
            "summary": "keeps memory alive every step",
            "fix": "store loss.item()",
            "made_at": "train.py:163",
        }
    )
    assert "made at" not in finding.text


def test_a_finding_is_the_native_type_and_reads_like_the_dataclass_it_replaces():
    finding = Finding(
        kind="sync_in_loop",
        severity="warning",
        site="train.py:80",
        function="train",
        bytes=0,
        count=24,
        summary="waits for the device 24 times in 12 steps",
        fix="accumulate on the device and read once per step",
        bytes_per_step=0.0,
        first_step=1,
        last_step=12,
        evidence={"syncs": 24, "per_step": 2.0, "what": "item"},
    )
    assert type(finding).__module__ == "vramscope._native"
    assert finding.evidence == {"syncs": 24, "per_step": 2.0, "what": "item"}
    assert list(finding.evidence) == ["syncs", "per_step", "what"]
    assert finding.made_at is None and finding.frames == []
    assert str(finding) == finding.text == (
        "warning sync_in_loop at train.py:80 in train: waits for the device 24 times in 12 "
        "steps Fix: accumulate on the device and read once per step")
    assert repr(finding).startswith("Finding(kind='sync_in_loop', severity='warning', ")
    assert "evidence={'syncs': 24, 'per_step': 2.0, 'what': 'item'}" in repr(finding)
    same = Finding.from_json({
        "kind": "sync_in_loop", "severity": "warning", "site": "train.py:80",
        "function": "train", "bytes": 0, "count": 24,
        "summary": "waits for the device 24 times in 12 steps",
        "fix": "accumulate on the device and read once per step",
        "per_step": {"bytes": 0.0, "count": 2.0}, "first_step": 1, "last_step": 12,
        "evidence": {"syncs": 24, "per_step": 2.0, "what": "item"},
    })
    assert same.count_per_step == 2.0
    assert same.text == finding.text


def test_findings_without_a_site_say_so():
    finding = Finding("oom", "error", None, "", 1 << 30, 1, "an allocation failed", "free memory")
    assert finding.site is None
    assert finding.text.startswith("error oom at (no site): an allocation failed")
