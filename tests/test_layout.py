"""The head layout is one description: the model's split, the engine's rows and the contract agree,
and the package's modules import one another without a circle."""

import ast
from pathlib import Path

import pytest
import torch

from torch_ntm import NTM
from torch_ntm.engines.ntm import head_blocks
from torch_ntm.layout import HEAD_FIELDS, HeadLayout

LAYOUTS = [HeadLayout(1, 1, 20, 3), HeadLayout(2, 3, 5, 5), HeadLayout(3, 0, 4, 1)]


def test_documented_order_of_a_write_head():
    # The contract in torch_ntm.layout's docstring, written out by hand for M = 4, R = 1.
    layout = HeadLayout(read_heads=1, write_heads=1, width=4, shifts=3)
    assert layout.fields("read") == {"key": 4, "beta": 1, "gate": 1, "shift": 3, "gamma": 1}
    assert layout.fields("write") == {**layout.fields("read"), "erase": 4, "add": 4}
    assert layout.rows("read", "key") == [0, 1, 2, 3]
    assert layout.rows("read", "gamma") == [9]
    assert layout.rows("write", "key") == [10, 11, 12, 13]  # the read head's 10 outputs first
    assert layout.rows("write", "shift") == [16, 17, 18]
    assert layout.rows("write", "add") == [24, 25, 26, 27]
    assert layout.size == 28


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_rows_are_what_activate_reads(layout):
    """Each field `activate` returns is its activation of exactly the rows `rows` names."""
    raw = torch.randn(2, layout.size, dtype=torch.float64)
    seen = []
    for kind in ("read", "write"):
        if not layout.heads(kind):
            continue
        params = layout.activate(raw, kind)
        for field in layout.fields(kind):
            rows = layout.rows(kind, field)
            seen += rows
            pre = raw[:, rows].view(2, layout.heads(kind), -1)
            expected = {"tanh": torch.tanh, "sigmoid": torch.sigmoid,
                        "softmax": lambda t: torch.softmax(t, -1),
                        "softplus": torch.nn.functional.softplus}[
                {f.name: f.activation for f in HEAD_FIELDS}[field]](pre)
            if field == "gamma":
                expected = 1.0 + expected
            torch.testing.assert_close(getattr(params, field), expected, rtol=1e-14, atol=1e-15)
    assert sorted(seen) == list(range(layout.size))


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_engine_blocks_are_a_permutation_by_activation(layout):
    blocks = head_blocks(layout)
    perm = blocks.perm.tolist()
    assert sorted(perm) == list(range(layout.size)) and blocks.block_end[-1] == layout.size
    activation = {}
    for kind in ("read", "write"):
        for field in layout.fields(kind):
            for row in layout.rows(kind, field):
                activation[row] = {f.name: f.activation for f in HEAD_FIELDS}[field]
    start = 0
    for name, end in zip(("tanh", "sigmoid", "softplus", "softmax"), blocks.block_end):
        assert {activation[r] for r in perm[start:end]} <= {name}
        start = end


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_engine_finds_each_field_of_each_head_where_the_layout_has_it(layout):
    """The kernels read field f of head h at field_start + h * field_width of the permuted
    rows (`NTMCall`): those are the rows `HeadLayout.rows` names, head by head."""
    blocks = head_blocks(layout)
    perm = blocks.perm.tolist()
    for f, field in enumerate(HEAD_FIELDS):
        width = blocks.field_width[f]
        for k, kind in enumerate(("write", "read")):
            start = blocks.field_start[2 * f + k]
            if field.name not in layout.fields(kind) or not layout.heads(kind):
                assert start == -1
                continue
            assert width == layout.fields(kind)[field.name]
            found = [perm[start + h * width + i] for h in range(layout.heads(kind))
                     for i in range(width)]
            assert found == layout.rows(kind, field.name), (kind, field.name)


def test_model_sizes_its_head_layer_from_the_layout():
    model = NTM(5, 4, read_heads=2, write_heads=3, memory_width=6, shift_range=2)
    assert model.head_layout == HeadLayout(2, 3, 6, 5)
    assert model.head_params.out_features == model.head_layout.size == 2 * 14 + 3 * 26


def test_unknown_head_kind_is_named():
    with pytest.raises(ValueError, match="unknown head kind 'erase'; valid: read, write"):
        HeadLayout(1, 1, 4, 3).fields("erase")


def _package_imports() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere (functions included), except under
    ``if TYPE_CHECKING``; the modules of the ``engines`` package count as one."""
    graph = {}
    src = Path(__file__).parents[1].joinpath("src", "torch_ntm")
    for path in [*src.glob("*.py"), *src.glob("engines/*.py")]:
        deps: set[str] = set()

        class Visitor(ast.NodeVisitor):
            def visit_If(self, node):
                if isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                    for child in node.orelse:
                        self.visit(child)
                else:
                    self.generic_visit(node)

            def visit_ImportFrom(self, node):
                parts = (node.module or "").split(".")
                if parts[0] == "torch_ntm":
                    deps.update(parts[1:2] or [a.name for a in node.names])

            def visit_Import(self, node):
                deps.update(a.name.split(".")[1] for a in node.names
                            if a.name.startswith("torch_ntm."))

        Visitor().visit(ast.parse(path.read_text()))
        name = "engines" if path.parent.name == "engines" else path.stem
        graph[name] = (graph.get(name, set()) | deps) - {name}
    return graph


def test_no_import_circle():
    graph = _package_imports()
    assert "engines" in graph["model"] and "model" not in graph["engines"]
    done, active = set(), []

    def visit(module):
        if module in active:
            pytest.fail("import circle: " + " -> ".join(active[active.index(module):] + [module]))
        if module in done or module not in graph:
            return
        active.append(module)
        for dep in sorted(graph[module]):
            visit(dep)
        active.pop()
        done.add(module)

    for module in sorted(graph):
        if module != "__init__":
            visit(module)


def test_no_module_imports_another_modules_private_names():
    """What two modules share has a public name in one of them (an engine reads a model through
    its public attributes; MANN uses the shared checks of torch_ntm.checks)."""
    src = Path(__file__).parents[1].joinpath("src", "torch_ntm")
    found = []
    for path in src.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("torch_ntm"):
                found += [f"{path.relative_to(src)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_")]
    assert found == []
