"""Stability tools: soft caps on beta and gamma, diagnostics, `BestWeights`, `SpikeClip`."""

import math

import pytest
import torch

from torch_ntm import NTM
from torch_ntm.diagnostics import gradient_norms, head_statistics
from torch_ntm.layout import soft_cap
from torch_ntm.stability import BestWeights, SpikeClip

SMALL = {"controller_size": 10, "memory_size": 9, "memory_width": 4}


def _model(**kwargs):
    torch.manual_seed(0)
    return NTM(5, 3, engine="eager", **{**SMALL, **kwargs})


# --------------------------------------------------------------------------------------------
# Soft caps.
# --------------------------------------------------------------------------------------------


def test_soft_cap_is_identity_near_zero_bounded_and_monotone():
    x = torch.linspace(0, 1000, 10001, dtype=torch.float64)
    y = soft_cap(x, 3.0)
    assert (y <= 3.0).all() and (y.diff() >= 0).all()
    torch.testing.assert_close(soft_cap(x[:10] * 1e-4, 3.0), x[:10] * 1e-4, rtol=1e-8, atol=0)
    assert soft_cap(x, 0.0) is x  # 0 means unbounded


def test_capped_beta_and_gamma_never_exceed_their_caps_even_for_huge_head_outputs():
    ntm = _model(max_beta=2.5, max_gamma=1.75)
    with torch.no_grad():
        ntm.head_params.bias.fill_(50.0)  # softplus(50) = 50: far beyond both caps
    _, _, trace = ntm.trace(torch.rand(6, 2, 5))
    for beta in (trace.read_beta, trace.write_beta):
        assert beta.max() <= 2.5 and beta.max() > 2.4
    for gamma in (trace.read_gamma, trace.write_gamma):
        assert gamma.max() <= 1.75 and gamma.min() >= 1.0
    unbounded = _model()
    with torch.no_grad():
        unbounded.head_params.bias.fill_(50.0)
    _, _, trace = unbounded.trace(torch.rand(6, 2, 5))
    assert trace.read_beta.min() > 49 and trace.write_gamma.min() > 50  # the paper's form


@pytest.mark.slow
def test_capped_model_gradcheck():
    ntm = _model(max_beta=1.5, max_gamma=2.0, dtype=torch.float64)
    x = torch.rand(4, 2, 5, dtype=torch.float64)
    params = (ntm.head_params.weight, ntm.head_params.bias)

    def f(weight, bias):
        logits, _ = torch.func.functional_call(
            ntm, {"head_params.weight": weight, "head_params.bias": bias}, (x,))
        return logits

    assert torch.autograd.gradcheck(f, params, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize("name, value", [
    ("max_beta", 0.0), ("max_beta", -1.0), ("max_gamma", 1.0), ("max_gamma", 0.5),
    ("max_gamma", float("inf")), ("max_beta", float("nan")), ("max_beta", "3"), ("max_gamma", True),
])
def test_bad_caps_are_rejected_with_the_rule(name, value):
    with pytest.raises(ValueError, match=name):
        NTM(5, 3, **{name: value})


def test_caps_are_part_of_the_config_and_repr():
    ntm = NTM(5, 3, max_beta=4, max_gamma=3.0)
    assert ntm.config()["max_beta"] == 4.0 and ntm.config()["max_gamma"] == 3.0
    assert "max_gamma=3.0" in repr(ntm)
    assert NTM(5, 3).config()["max_gamma"] is None


def test_checkpoints_from_before_the_caps_load_unbounded(tmp_path):
    import json

    from torch_ntm.checkpoint import load_checkpoint, save_checkpoint
    from torch_ntm.presets import resolve_config
    from torch_ntm.train import make_optimizer

    config = resolve_config("copy", overrides=["controller_size=8", "memory_size=8",
                                               "memory_width=4", "max_gamma=3"])
    from torch_ntm.factories import build_model, build_task

    model = build_model(config, build_task(config))
    assert model.max_gamma == 3.0
    save_checkpoint(tmp_path, config, model, make_optimizer(config, model.parameters()),
                    torch.Generator(), step=1, sequences=1, elapsed_s=0.0, metrics={}, extra={})
    record = json.loads((tmp_path / "checkpoint.json").read_text())
    # as an older version wrote it: flat, without the caps
    flat = record["config"].pop("model_params")
    record["config"].update({k: v for k, v in flat.items() if k not in ("max_beta", "max_gamma")})
    (tmp_path / "checkpoint.json").write_text(json.dumps(record))
    ckpt = load_checkpoint(tmp_path)
    assert ckpt.config.model_params.max_gamma is None and ckpt.model().max_gamma is None


# --------------------------------------------------------------------------------------------
# Diagnostics.
# --------------------------------------------------------------------------------------------


def test_head_statistics_agree_with_the_trace():
    ntm = _model(read_heads=2, write_heads=1)
    x = torch.rand(7, 3, 5)
    stats = head_statistics(ntm, x)
    with torch.no_grad():
        _, state, trace = ntm.trace(x)
    assert stats["read_beta_max"] == pytest.approx(float(trace.read_beta.max()))
    assert stats["write_gamma_max"] == pytest.approx(float(trace.write_gamma.max()))
    assert 0 <= stats["read_entropy_min"] <= stats["read_entropy_mean"] <= math.log(9) + 1e-6
    norms = state.memory.norm(dim=-1)
    assert stats["memory_row_norm_min"] == pytest.approx(float(norms.min()))
    assert stats["memory_row_norm_max"] == pytest.approx(float(norms.max()))
    assert "write_beta_max" not in head_statistics(_model(write_heads=0), x)


def test_one_hot_weighting_has_zero_entropy_and_uniform_has_log_n():
    from torch_ntm.diagnostics import _entropy

    w = torch.zeros(2, 9)
    w[0, 3] = 1.0
    w[1] = 1 / 9
    torch.testing.assert_close(_entropy(w), torch.tensor([0.0, math.log(9)]))


def test_gradient_norms_per_group_add_up_to_the_total():
    ntm = _model()
    logits, _ = ntm(torch.rand(5, 2, 5))
    logits.square().sum().backward()
    groups = gradient_norms(ntm)
    assert set(groups) == {"controller", "heads", "output", "initial"}
    total = torch.nn.utils.get_total_norm([p.grad for p in ntm.parameters()])
    assert math.sqrt(sum(v * v for v in groups.values())) == pytest.approx(float(total), rel=1e-5)


# --------------------------------------------------------------------------------------------
# BestWeights.
# --------------------------------------------------------------------------------------------


def test_best_weights_keeps_the_best_and_restores_weights_and_optimizer_state():
    ntm = _model()
    opt = torch.optim.Adam(ntm.parameters(), lr=0.1)
    keeper = BestWeights(ntm, opt)
    with pytest.raises(RuntimeError, match="update"):
        keeper.restore()

    def step():
        opt.zero_grad()
        ntm(torch.rand(3, 2, 5))[0].sum().backward()
        opt.step()

    step()
    assert keeper.update((1.0, 5.0))
    kept = {k: v.clone() for k, v in ntm.state_dict().items()}
    kept_opt = opt.state_dict()["state"][0]["exp_avg"].clone()
    step()
    assert not keeper.update((1.0, 6.0))  # worse: not kept
    assert not keeper.update((float("nan"), 0.0))  # NaN never counts as better
    step()
    assert keeper.restore() == (1.0, 5.0)
    for k, v in ntm.state_dict().items():
        assert torch.equal(v, kept[k]), k
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], kept_opt)
    assert keeper.update((0.0, 9.0))  # fewer wrong bits wins whatever the cost


def test_best_weights_state_dict_round_trip():
    ntm = _model()
    keeper = BestWeights(ntm)
    keeper.update(0.5)
    other = BestWeights(_model())
    other.load_state_dict(keeper.state_dict())
    assert other.score == 0.5 and not other.update(0.7) and other.update(0.1)


# --------------------------------------------------------------------------------------------
# SpikeClip.
# --------------------------------------------------------------------------------------------


def _set_grad(p, norm):
    p.grad = torch.full_like(p, norm / math.sqrt(p.numel()))


def test_spike_clip_clips_at_a_multiple_of_the_recent_median():
    p = torch.nn.Parameter(torch.zeros(16))
    clip = SpikeClip([p], factor=2.0, window=5, max_norm=100.0, warmup=3)
    for norm in (1.0, 3.0, 2.0):  # warm-up: only the absolute clip
        _set_grad(p, norm)
        assert float(clip()) == pytest.approx(norm)
        assert float(p.grad.norm()) == pytest.approx(norm)
    assert clip.threshold == pytest.approx(4.0)  # 2 x median(1, 3, 2)
    _set_grad(p, 500.0)  # a spike: returned as measured, clipped to the threshold
    assert float(clip()) == pytest.approx(500.0)
    assert float(p.grad.norm()) == pytest.approx(4.0)
    _set_grad(p, 1.5)  # an ordinary step is left alone
    clip()
    assert float(p.grad.norm()) == pytest.approx(1.5)
    assert clip.threshold == pytest.approx(2 * 2.0)  # median(1, 3, 2, 500, 1.5) = 2


def test_spike_clip_keeps_the_absolute_bound_ignores_nan_and_round_trips():
    p = torch.nn.Parameter(torch.zeros(4))
    clip = SpikeClip([p], factor=10.0, max_norm=3.0, warmup=1)
    _set_grad(p, 2.0)
    clip()
    _set_grad(p, 50.0)
    clip()
    assert float(p.grad.norm()) == pytest.approx(3.0)  # min(3, 10 x 2)
    p.grad = torch.full_like(p, float("nan"))
    assert not torch.isfinite(clip())
    assert list(clip.norms) == [2.0, 50.0]  # the NaN step is not recorded
    other = SpikeClip([p], factor=10.0, max_norm=3.0, warmup=1)
    other.load_state_dict(clip.state_dict())
    assert other.threshold == clip.threshold
    with pytest.raises(ValueError, match="factor"):
        SpikeClip([p], factor=0.5)


def test_training_with_spike_clipping_resumes_exactly(tmp_path):
    """The recent norms are part of the checkpoint: without them the resumed run would clip
    at clip_norm during a new warm-up, and end on other weights."""
    from torch_ntm.checkpoint import load_checkpoint
    from torch_ntm.presets import resolve_config
    from torch_ntm.train import train

    def config(steps):
        return resolve_config("copy", overrides=[
            "controller_size=8", "memory_size=8", "memory_width=4", "task.max_length=3",
            "task.width=3", "engine=auto", "optimizer=adam", "lr=0.01", "clip_norm=10",
            "clip_spikes=1.0", "batch_size=2", f"max_sequences={2 * steps}", "eval_every=12",
            "eval_sequences=4", "log_every=4", "eval_sizes=", "stop_bit_errors=-1",
            "rollback_bit_errors=-1"])

    train(config(24), tmp_path / "full", progress=False)
    train(config(12), tmp_path / "split", progress=False)
    train(config(24), tmp_path / "split", resume=True, progress=False)
    a, b = load_checkpoint(tmp_path / "full"), load_checkpoint(tmp_path / "split")
    assert len(a.extra["recent_grad_norms"]) == 24
    assert a.extra == b.extra
    for key, value in a.state_dict.items():
        assert torch.equal(value, b.state_dict[key]), key
