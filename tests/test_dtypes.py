"""Dtypes: float32, float64 and bfloat16 models on every engine, mixed precision by autocast,
and one clear error for float16 parameters."""

import pytest
import torch

from torch_ntm import NTM

ENGINES = ["eager", "auto"]


def model(engine, dtype=torch.float32):
    """The same weights (drawn in float32) in ``dtype``."""
    torch.manual_seed(0)
    ntm = NTM(6, 5, controller_size=12, memory_size=9, memory_width=4, read_heads=2,
              engine=engine)
    return ntm.to(dtype)


def run(ntm, x):
    """Logits, and the gradient of a loss of them, for every parameter."""
    ntm.zero_grad()
    y, _ = ntm(x)
    y.float().square().mean().backward()
    return y, {name: p.grad.clone() for name, p in ntm.named_parameters()}


@pytest.mark.parametrize("engine, dtype", [
    (e, d) for e in ("eager", "auto") for d in (torch.float32, torch.float64, torch.bfloat16)])
def test_each_dtype_runs_on_each_engine_like_a_float64_model(engine, dtype):
    x = torch.rand(7, 3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    reference, ref_grads = run(model("eager", torch.float64), x)
    y, grads = run(model(engine, dtype), x.to(dtype))
    assert y.dtype == dtype
    tol = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 5e-2}[dtype]
    torch.testing.assert_close(y.double(), reference, atol=tol, rtol=tol)
    for name, grad in grads.items():
        assert grad.dtype == dtype and torch.isfinite(grad).all(), name
        scale = ref_grads[name].abs().max().item() + 1e-3  # bfloat16: relative to the largest
        assert (grad.double() - ref_grads[name]).abs().max().item() <= 10 * tol * scale, name


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_runs_mixed_precision_on_each_engine(engine, dtype):
    x = torch.rand(7, 3, 6, generator=torch.Generator().manual_seed(1))
    full, full_grads = run(model(engine), x)
    ntm = model(engine)
    with torch.autocast("cpu", dtype=dtype):
        y, grads = run(ntm, x)
    assert y.dtype == dtype  # the linear layers ran in the low precision
    torch.testing.assert_close(y.float(), full, atol=3e-2, rtol=3e-2)
    for name, grad in grads.items():
        assert grad.dtype == torch.float32 and torch.isfinite(grad).all(), name


@pytest.mark.parametrize("cell", [False, True, "trace"])
def test_autocast_returns_a_state_of_one_dtype_that_every_engine_continues_from(cell):
    """Under autocast a step leaves the weightings and reads in bfloat16 and the memory in
    float32; the native engine met that state with a bare assertion. The state returned is in
    the input's dtype throughout, so it continues on any engine, with autocast or without."""
    from torch_ntm import NTMCell

    torch.manual_seed(0)
    x = torch.rand(5, 2, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        if cell == "trace":
            _, state, _ = model("eager").trace(x)
        elif cell:
            step = NTMCell(6, 5, controller_size=12, memory_size=9, memory_width=4, read_heads=2)
            state = None
            for x_t in x:
                _, state = step(x_t, state)
        else:
            _, state = model("eager")(x)
    assert {t.dtype for t in state.tensors().values()} == {torch.float32}
    ntm = model("eager")
    for engine in ("eager", "auto"):
        ntm.engine = engine
        y, _ = ntm(x, state)
        assert y.dtype == torch.float32 and torch.isfinite(y).all(), engine
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y, _ = ntm(x, state)
        assert y.dtype == torch.bfloat16, engine


@pytest.mark.parametrize("engine", ENGINES)
def test_float16_parameters_are_refused_with_the_alternatives(engine):
    ntm = model(engine, torch.float16)
    with pytest.raises(ValueError, match="does not run in float16.*bfloat16.*autocast"):
        ntm(torch.rand(3, 2, 6, dtype=torch.float16))
