"""The README's code, and the module guide's, runs as printed (with a shorter training
budget)."""

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


def test_the_module_guides_examples_run_with_the_shapes_they_state():
    import textwrap

    guide = README.parent / "docs" / "guide.md"
    text = guide.read_text()
    module = re.search(r"## NTM\n\n```python\n(.*?)```", text, re.S).group(1)
    packed = re.search(r"\*\*Packed sequences\*\*.*?```python\n(.*?)```", text, re.S).group(1)
    scope: dict = {}
    exec(compile(module + textwrap.dedent(packed), str(guide), "exec"), scope)
    assert tuple(scope["padded"].shape) == (30, 3, 8)
    assert scope["lengths"].tolist() == [12, 5, 30]
    assert tuple(scope["logits"].data.shape) == (47, 8)


def _documented_train_commands():
    """Every ``ntm train ...`` the README and docs/ print (code blocks, with their line
    continuations, and inline code), but templates (``TASK``, ``[--preset P]``, ``a|b``,
    ``...``, ``RUN``) and resumes, which need a run."""
    import shlex

    docs = [README, *sorted((README.parent / "docs").rglob("*.md"))]
    for path in docs:
        text = path.read_text()
        blocks = re.findall(r"```[a-z]*\n(.*?)```", text, re.S)
        spans = [line for b in blocks for line in b.replace("\\\n", " ").splitlines()]
        spans += re.findall(r"`([^`]+)`", re.sub(r"```.*?```", " ", text, flags=re.S)
                            .replace("\n", " "))
        for span in spans:
            command = re.sub(r"\s+", " ", span).split(" #")[0].strip()
            if (not command.startswith("ntm train ") or any(t in command for t in "[|")
                    or "..." in command or command.endswith("--set")):
                continue
            argv = shlex.split(command)[1:]
            if "--resume" in argv or any(re.fullmatch(r"[A-Z][A-Z_]*|S|N", a) for a in argv):
                continue
            yield path.relative_to(README.parent), argv


def test_every_documented_training_command_parses_and_resolves():
    """A renamed key, preset or option would leave the documents' commands failing; each is
    parsed by `ntm train`'s parser and its config resolved (no training)."""
    from torch_ntm.cli import _parser
    from torch_ntm.presets import resolve_config

    commands = list(_documented_train_commands())
    assert len(commands) >= 40  # the scan finds them (49 on 2026-11-26)
    for path, argv in commands:
        args, unknown = _parser().parse_known_args(argv)
        assert not unknown, (path, argv)
        resolve_config(args.task, args.preset, args.overrides, args.seed)
