"""The documentation stays true to the code: the README fits a screen and its links resolve, the
command-line reference is the parser's, and the tutorial's code runs as printed (with a shorter
training budget). `mkdocs build --strict` in CI checks the site's own links and docstrings."""

import importlib.util
import math
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def test_the_readme_fits_in_10_kb_and_its_local_links_and_figure_exist():
    assert len(README.read_bytes()) <= 10_000
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    local = [link.split("#")[0] for link in links if "://" not in link]
    assert "docs/figures/copy-attention.png" in local
    assert len(local) >= 10
    for link in local:
        assert (ROOT / link).exists(), link


def test_the_cli_reference_is_generated_from_the_current_parser():
    spec = importlib.util.spec_from_file_location("cli_reference",
                                                  ROOT / "scripts" / "cli_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    generated = module.render()
    assert module.current() == generated, "run python scripts/cli_reference.py"
    from torch_ntm.cli import _parser

    parser = _parser()
    for name, command in parser.commands.items():  # every command and option is listed
        assert f"### `ntm {name}`" in generated
        for action in command._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}" in generated, (name, option)


@pytest.mark.slow
def test_the_tutorial_runs_from_a_task_to_a_plotted_model(tmp_path, monkeypatch):
    text = (DOCS / "tutorial.md").read_text()
    code = "\n".join(re.findall(r"```python\n(.*?)```", text, re.S))
    assert "range(1, 2001)" in code and "plot_attention(trace" in code
    monkeypatch.chdir(tmp_path)  # the figures are written to the working directory
    scope: dict = {}
    exec(compile(code.replace("range(1, 2001)", "range(1, 101)"), "docs/tutorial.md", "exec"),
         scope)
    errors, cost = scope["keeper"].score
    assert math.isfinite(cost) and 0 <= errors < 40  # one validation of an untrained model
    assert (tmp_path / "attention.png").stat().st_size > 0
    assert (tmp_path / "io.png").stat().st_size > 0


def test_the_api_pages_show_each_models_options_in_its_signature_and_its_docstring_matches():
    """The models take ``**options``; scripts/_griffe_options.py gives the API pages the runtime
    signature (``help()``'s), so each documented option is a parameter with its type."""
    griffe = pytest.importorskip("griffe")  # the docs extra
    import inspect

    import torch_ntm

    extension = griffe.load_extensions(
        f"{ROOT / 'scripts' / '_griffe_options.py'}:ModelSignatures")
    package = griffe.load("torch_ntm", search_paths=[ROOT / "src"], extensions=extension,
                          docstring_parser="google")
    for name in ("NTM", "NTMCell", "MANN", "MANNCell", "DNC", "DNCCell"):
        documented = package[name].all_members["__init__"].parameters
        runtime = inspect.signature(getattr(torch_ntm, name)).parameters
        assert [p.name for p in documented][1:] == list(runtime), name
        assert all(p.annotation is not None for p in list(documented)[1:]), name
        for section in package[name].docstring.parse(warnings=False):
            if section.kind.value == "parameters":
                for p in section.value:
                    assert p.name in runtime, (name, p.name)
