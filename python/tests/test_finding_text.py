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
