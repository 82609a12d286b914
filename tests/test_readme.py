"""The README's code runs as printed (with a shorter training budget)."""

import math
import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_own_training_loop_runs_and_ends_on_its_best_validation():
    text = README.read_text()
    code = re.search(r"### Training in your own loop.*?```python\n(.*?)```", text, re.S).group(1)
    assert "range(1, 2001)" in code and "clip = SpikeClip(ntm.parameters())" in code
    scope: dict = {}
    exec(compile(code.replace("range(1, 2001)", "range(1, 101)"), str(README), "exec"), scope)
    errors, cost = scope["keeper"].score
    assert math.isfinite(cost) and 0 <= errors < 40  # one validation of an untrained model
    assert scope["keeper"].restore() == (errors, cost)


def test_the_module_examples_run_with_the_shapes_they_state():
    import textwrap

    text = README.read_text()
    module = re.search(r"## Using the module\n\n```python\n(.*?)```", text, re.S).group(1)
    packed = re.search(r"\*\*Packed sequences\*\*.*?```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(module + textwrap.dedent(packed), str(README), "exec"), scope)
    assert tuple(scope["padded"].shape) == (30, 3, 8)
    assert scope["lengths"].tolist() == [12, 5, 30]
    assert tuple(scope["logits"].data.shape) == (47, 8)
