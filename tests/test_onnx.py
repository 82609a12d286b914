"""ONNX export (``torch.onnx.export(..., dynamo=True)``) of an NTM with a dynamic sequence length:
onnxruntime runs the exported graph at lengths it was not traced at and gives the eager outputs
and final state. The batch size is fixed at export (see the README)."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from torch_ntm import NTM
from torch_ntm.layout import NTMState

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

STATE_NAMES = ["h", "c", *NTMState._fields[1:]]  # the LSTM controller's (h, c), then the rest


@pytest.mark.slow
def test_onnx_graph_is_the_eager_function_at_new_lengths(tmp_path):
    torch.manual_seed(0)
    model = NTM(9, 8, memory_size=16, controller_layers=2, read_heads=2, write_heads=2,
                shift_range=2).eval()
    program = torch.onnx.export(model, (torch.rand(5, 3, 9),), dynamo=True,
                                dynamic_shapes={"x": {0: Dim("T")}}, input_names=["x"],
                                output_names=["logits", *STATE_NAMES], verbose=False)
    program.save(tmp_path / "ntm.onnx")
    session = ort.InferenceSession(tmp_path / "ntm.onnx")
    assert [o.name for o in session.get_outputs()] == ["logits", *STATE_NAMES]
    for steps in (13, 1, 40):
        x = torch.rand(steps, 3, 9)
        got = session.run(None, {"x": x.numpy()})
        with torch.no_grad():
            logits, state = model(x)
        want = [logits, *state.controller, *state[1:]]
        for name, value, expected in zip(["logits", *STATE_NAMES], got, want):
            torch.testing.assert_close(torch.from_numpy(value), expected, rtol=1e-5, atol=1e-5,
                                       msg=lambda m, name=name: f"{name} at T={steps}: {m}")
