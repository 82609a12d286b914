"""ONNX export (``torch.onnx.export(..., dynamo=True)``) of the NTM, the MANN and the DNC with a
dynamic sequence length: onnxruntime runs the exported graph at lengths it was not traced at and
gives the eager outputs and final state. The batch size is fixed at export (see the README)."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from torch_ntm import DNC, MANN, NTM
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


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mann", "dnc"])
def test_onnx_graph_of_the_mann_and_the_dnc_is_the_eager_function(tmp_path, name):
    """The DNC starts from an empty memory: its cosine similarity divides 0 by EPS-padded norms,
    an addition the exporter's optimizer dropped as ``x + 0`` (NaN from the first step); the MANN
    read 1e-3 off for the same reason. The MANN's final state is compared up to the order of its
    memory rows: rows whose usages tie in exact arithmetic round apart differently in
    onnxruntime, so the least-used row it writes may be the other one of a tie (the outputs,
    which do not depend on the rows' order, are compared as they are)."""
    torch.manual_seed(0)
    model = (MANN(9, 8, memory_size=16, read_heads=2) if name == "mann"
             else DNC(9, 8, memory_size=16, read_heads=2, write_heads=2)).eval()
    program = torch.onnx.export(model, (torch.rand(5, 3, 9),), dynamo=True,
                                dynamic_shapes={"x": {0: Dim("T")}}, verbose=False)
    program.save(tmp_path / f"{name}.onnx")
    session = ort.InferenceSession(tmp_path / f"{name}.onnx")
    for steps in (1, 13):
        x = torch.rand(steps, 3, 9)
        got = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        with torch.no_grad():
            logits, state = model(x)
        want = [logits, *state.controller, *state[1:]]
        got = [torch.from_numpy(value) for value in got]
        assert len(got) == len(want)
        if name == "mann":  # memory [B, N, M], usage [B, N], read_weights [B, H, N], least_used
            rows = _matching_rows(got[3], state.memory)
            got[3] = got[3].gather(1, rows.unsqueeze(-1).expand_as(got[3]))
            got[4], got[6] = got[4].gather(1, rows), got[6].gather(1, rows)
            got[5] = got[5].gather(2, rows.unsqueeze(1).expand_as(got[5]))
        for value, expected in zip(got, want):
            torch.testing.assert_close(value, expected, rtol=1e-5, atol=1e-5)


def _matching_rows(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """For each sequence, a permutation of the rows of ``got`` [B, N, M] matching those of
    ``want``: each row of ``want`` in turn takes the nearest row of ``got`` not yet taken (equal
    rows, such as the unwritten ones, are interchangeable)."""
    distance = torch.cdist(want, got)
    rows = torch.empty(got.shape[:2], dtype=torch.long)
    for b in range(got.shape[0]):
        taken = torch.zeros(got.shape[1], dtype=torch.bool)
        for i in range(got.shape[1]):
            rows[b, i] = distance[b, i].masked_fill(taken, float("inf")).argmin()
            taken[rows[b, i]] = True
    return rows
