"""What ``attach()`` marks in PyTorch's recorded history so that a dump says which module and
which phase made each block (issue 46), through the stand-in torch of ``stand_in/``: the module
calls and the forward and backward phases as annotations, and each allocation's module and
phase as its ``user_metadata``; the program's own metadata is put back, ``no_grad`` forwards
are told apart, steps are still numbered from the optimizer, and ``remove()`` stops it all."""

import json
import os
import subprocess
import sys
import textwrap

import vramscope

HERE = os.path.abspath(__file__)
STAND_IN = os.path.join(os.path.dirname(HERE), "stand_in")

MARKED = '''
    import json, sys
    import torch
    import vramscope

    class Block(torch.nn.Module):
        def forward(self, x):
            return torch.empty(1 << 20)


    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block(), Block()])

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return torch.empty(1 << 19)


    session = vramscope.attach(catch_syncs=False)
    torch.cuda.memory._set_memory_metadata("mine")
    model = Model()
    optimizer = torch.optim.Optimizer()
    grads = []
    for step in range(2):
        out = model(None)
        out.grad_fn = lambda: grads.append(torch.empty(1 << 21))
        out.backward()
        optimizer.step()
    with torch.no_grad():
        model(None)
    class Failing(torch.nn.Module):
        def forward(self, x):
            raise ValueError("a forward that raises")

    try:
        Failing()(None)
    except ValueError:
        pass
    session.marks.remove()
    model(None)
    after = torch.empty(1 << 18)
    vramscope.snapshot(sys.argv[1])
    history = torch.cuda.memory._snapshot()
    print(json.dumps({
        "allocs": [[e["size"], e["user_metadata"]] for e in history["device_traces"][0]
                   if e["action"] == "alloc"],
        "annotations": [[a["name"], a["stage"]] for a in history["external_annotations"]],
    }))
'''


def run(tmp_path, source, *args):
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(source))
    # The stand-in torch, and the vramscope these tests import (a source tree's, where one is
    # tried out, or the installed one).
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(vramscope.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([STAND_IN, package_root]),
               VRAMSCOPE_BACKEND="sim")
    out = subprocess.run([sys.executable, str(script), *map(str, args)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_attach_marks_each_allocations_module_and_phase(tmp_path):
    snap_path = tmp_path / "run.json"
    result = run(tmp_path, MARKED, snap_path)
    block, output, grad, plain = 1 << 20, 1 << 19, 1 << 21, 1 << 18
    forward = [[block, "vramscope:phase=forward;module=Model.layers.0"],
               [block, "vramscope:phase=forward;module=Model.layers.1"],
               [output, "vramscope:phase=forward;module=Model"]]
    no_grad = [[size, text.replace("phase=forward;", "phase=forward_no_grad;")]
               for size, text in forward]
    # Each allocation carries its innermost module and its phase; the backward's, the phase;
    # between calls and after `remove()`, the program's own metadata again.
    assert result["allocs"] == (
        (forward + [[grad, "vramscope:phase=backward"]]) * 2 + no_grad
        + [[block, "mine"], [block, "mine"], [output, "mine"], [plain, "mine"]])
    annotations = result["annotations"]
    one_forward = [["vramscope.phase#forward", "START"], ["vramscope.module#Model", "START"],
                   ["vramscope.module#Model.layers.0", "START"],
                   ["vramscope.module#Model.layers.0", "END"],
                   ["vramscope.module#Model.layers.1", "START"],
                   ["vramscope.module#Model.layers.1", "END"],
                   ["vramscope.module#Model", "END"], ["vramscope.phase#forward", "END"]]
    backward = [["vramscope.phase#backward", "START"], ["vramscope.phase#backward", "END"]]
    marked = [a for a in annotations if a[0].startswith("vramscope.")]
    # A forward that raises ends its marks all the same.
    failing = [["vramscope.phase#forward", "START"], ["vramscope.module#Failing", "START"],
               ["vramscope.module#Failing", "END"], ["vramscope.phase#forward", "END"]]
    assert marked == (one_forward + backward) * 2 + [
        [name.replace("phase#forward", "phase#forward_no_grad"), stage]
        for name, stage in one_forward] + failing
    # The optimizer's steps still number the steps of the dump.
    snap = json.loads(snap_path.read_text())
    assert [m["label"] for m in snap["steps"]] == ["ProfilerStep#1", "ProfilerStep#2"]
    # Every allocation of the loop's first pass is in step 0, those after in the later steps.
    steps = sorted({e["step"] for e in snap["events"] if e["kind"] == "alloc"})
    assert steps == [0, 1, 2]


NO_HOOKS = '''
    import json, sys
    import torch
    import vramscope

    del torch.nn  # a torch without global module hooks
    session = vramscope.attach(catch_syncs=False, modules=True)
    t = torch.empty(1 << 20)
    t.grad_fn = lambda: torch.empty(1 << 20)
    t.backward()
    unmarked = vramscope.attach(catch_syncs=False, modules=False)
    history = torch.cuda.memory._snapshot()
    print(json.dumps({
        "allocs": [e["user_metadata"] for e in history["device_traces"][0]
                   if e["action"] == "alloc"],
        "marks": [session.marks is not None, unmarked.marks is None],
    }))
'''


def test_without_module_hooks_only_the_backward_is_marked(tmp_path):
    result = run(tmp_path, NO_HOOKS)
    assert result["allocs"] == ["", "vramscope:phase=backward"]
    assert result["marks"] == [True, True]
