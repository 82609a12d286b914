"""What is particular to the DNC's native engine (`torch_ntm.engines.dnc`, csrc/dnc.cpp; what
every model's native engine shares, the equivalence with the eager loop among it, is
test_native_models.py): a full memory and usages that tie allocate as the eager loop does, and the
models it does not serve run on the eager loop, saying why."""

from __future__ import annotations

import logging

import pytest
import torch
from test_native_models import DNC_SPEC, IN, TOL, assert_same, rand, random_state, run

from torch_ntm import engines
from torch_ntm.engines import library

pytestmark = pytest.mark.skipif(
    not (library.available("dnc", torch.float32) and library.available("dnc", torch.float64)),
    reason=f"native library not built: {library.error('dnc', torch.float64)}")

build = DNC_SPEC.build


def test_a_full_memory_and_tied_usages_allocate_as_the_eager_loop():
    """Usages of exactly 1 (nothing to allocate: a = 0) and exact ties (the stable sort's row
    order): values and gradients as the eager loop's, all finite."""
    dnc = build(7, read_heads=2, memory_size=6)
    state = random_state(dnc, 3, 40)
    usage = torch.tensor([[1.0] * 6, [0.5, 0.2, 0.2, 0.5, 0.0, 0.0], [0.3] * 6],
                         dtype=torch.float64)
    state = state._replace(usage=usage, write_weights=torch.zeros_like(state.write_weights))
    x = rand(4, 3, IN, seed=41)
    got, expected = run(dnc, "native", x, state), run(dnc, "eager", x, state)
    assert all(g is None or torch.isfinite(g).all() for g in got[2])
    assert_same(got, expected, **TOL)


@pytest.mark.parametrize("options,why", [
    ({"controller": "feedforward"}, "one-layer LSTM controller, not 1 feedforward"),
    ({"controller_layers": 2}, "one-layer LSTM controller, not 2 lstm"),
    ({"write_heads": 2}, "one write head, not 2"),
    ({"sparse_link": 3}, "the exact link matrix, not sparse_link"),
])
def test_the_models_it_does_not_serve_run_eager_saying_why(options, why, caplog, monkeypatch):
    monkeypatch.setattr(engines.common, "_SAID", set())  # said once per process: maybe said before
    dnc = build(15, **options)
    x = rand(4, 2, IN, seed=27)
    assert dnc.runs_on(x) == "eager"
    with caplog.at_level(logging.WARNING, logger="torch_ntm.engines"):
        y, _ = dnc(x)
    dnc.engine = "eager"
    torch.testing.assert_close(y, dnc(x)[0], rtol=0, atol=0)
    assert why in caplog.text
