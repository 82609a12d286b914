"""`MANN(encoder="conv")`: the `ConvEncoder` against a float64 loop over output pixels written
from its definition, its shapes and errors, and the MANN around it: the native engine against
the eager loop (values and every gradient), the cell against the sequence, `gradcheck`, and
training from the command line (and `test_omniglot_cli.test_cross_entropy_falls`: it learns)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_omniglot_cli import TINY  # the Omniglot CLI tests' small run

from torch_ntm import MANN
from torch_ntm.config import ConfigError
from torch_ntm.engines import library
from torch_ntm.mann import CONV_CHANNELS, ConvEncoder, MANNCell
from torch_ntm.omniglot import PIXELS, SIZE

SIDE, LABELS = 6, 3  # a 6 x 6 image and 3 label values per step
IN = SIDE * SIDE + LABELS

native_only = pytest.mark.skipif(not library.available("mann", torch.float64),
                                 reason="native library not built")


def rand(*shape, seed: int = 1) -> torch.Tensor:
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def conv_reference(image: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """ReLU of a 4 x 4 convolution with stride 2 and zero padding 1, output pixel by output
    pixel: out[c, i, j] = b[c] + sum over d, a, e of w[c, d, a, e] x padded[d, 2i + a, 2j + e]."""
    channels, side = image.shape[0], image.shape[1]
    padded = np.zeros((channels, side + 2, side + 2))
    padded[:, 1:-1, 1:-1] = image
    out_side = (side + 2 - 4) // 2 + 1
    out = np.zeros((weight.shape[0], out_side, out_side))
    for c in range(weight.shape[0]):
        for i in range(out_side):
            for j in range(out_side):
                patch = padded[:, 2 * i:2 * i + 4, 2 * j:2 * j + 4]
                out[c, i, j] = bias[c] + (weight[c] * patch).sum()
    return np.maximum(out, 0)


@pytest.mark.parametrize("keep_pixels", [False, True])
def test_conv_encoder_equals_the_loop_reference(keep_pixels):
    """Leading dimensions kept; the image read row by row from the first SIDE^2 values; the
    feature maps flattened channel by channel; the label values (or with ``keep_pixels`` the
    whole step) appended unchanged."""
    torch.manual_seed(0)
    encoder = ConvEncoder(IN, SIDE, keep_pixels=keep_pixels, dtype=torch.float64)
    x = rand(2, 3, IN) - 0.3
    y = encoder(x)
    assert y.shape == (2, 3, encoder.output_size)
    kept = IN if keep_pixels else LABELS
    assert encoder.output_size == CONV_CHANNELS[-1] * 1 * 1 + kept  # 6 -> 3 -> 1
    weights = [(c.weight.detach().numpy(), c.bias.detach().numpy()) for c in encoder.convs]
    for index in np.ndindex(2, 3):
        maps = x[index][:SIDE * SIDE].numpy().reshape(1, SIDE, SIDE)
        for weight, bias in weights:
            maps = conv_reference(maps, weight, bias)
        expected = np.concatenate([maps.reshape(-1), x[index][IN - kept:].numpy()])
        np.testing.assert_allclose(y[index].detach().numpy(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("side, features", [(SIZE, 32 * 5 * 5), (7, 32 * 1 * 1), (4, 32)])
def test_conv_encoder_sizes(side, features):
    """Each layer halves the side (rounding down): 20 -> 10 -> 5, 7 -> 3 -> 1, 4 -> 2 -> 1."""
    encoder = ConvEncoder(side * side + 5, side)
    assert encoder.output_size == features + 5
    assert encoder(torch.zeros(4, side * side + 5)).shape == (4, features + 5)


def test_he_initialisation_keeps_the_pixels_scale():
    """Weights of variance 2 / fan-in, zero biases; on Omniglot episodes the 800 features carry
    as much input to the controller as the 400 pixels (sum of squares within a factor of 2)."""
    from torch_ntm.omniglot import OmniglotTask

    torch.manual_seed(0)
    encoder = ConvEncoder(PIXELS + 5, SIZE)
    for conv in encoder.convs:
        fan_in = conv.weight[0].numel()
        assert conv.weight.std().item() == pytest.approx((2 / fan_in) ** 0.5, rel=0.1)
        assert not conv.bias.any()
    x = OmniglotTask().sample(16, torch.Generator().manual_seed(0)).inputs
    with torch.no_grad():
        features = encoder(x)[..., :-5].square().sum(-1).mean()
    pixels = x[..., :PIXELS].square().sum(-1).mean()
    assert 0.5 < (features / pixels).item() < 2


def test_omniglot_sized_mann_reads_800_features():
    mann = MANN(PIXELS + 5, 5, encoder="conv")
    assert mann.encoder == "conv" and mann.image_size == SIZE
    assert mann.features.output_size == 805
    assert mann.controller.cells[0].weight_ih.shape[1] == 805 + 4 * 40
    assert MANN(PIXELS + 5, 5).features is None  # the paper's: the pixels themselves
    both = MANN(PIXELS + 5, 5, encoder="conv+pixels")
    assert both.features.output_size == 800 + 405 and both.features.keep_pixels


@pytest.mark.parametrize("options, message", [
    ({"encoder": "cnn"}, "unknown encoder 'cnn'; valid choices: none, conv, conv\\+pixels"),
    ({"encoder": "conv", "image_size": 7}, "image_size=7 needs 49 input values per step"),
    ({"encoder": "conv", "image_size": 3}, "image_size must be >= 4"),
    ({"encoder": "conv", "image_size": 0}, "image_size"),
])
def test_bad_encoder_options(options, message):
    with pytest.raises(ValueError, match=message):
        MANN(IN, 3, **options)


def build(seed: int = 0, encoder: str = "conv") -> MANN:
    torch.manual_seed(seed)
    return MANN(IN, 3, controller_size=8, memory_size=7, memory_width=5, read_heads=2,
                learned_beta=True, encoder=encoder, image_size=SIDE, dtype=torch.float64)


def run(mann: MANN, engine: str, x: torch.Tensor):
    mann.engine = engine
    mann.zero_grad()
    x = x.clone().requires_grad_()
    y, state = mann(x)
    ((y * rand(*y.shape, seed=9)).sum() + state.memory.square().sum()).backward()
    return y.detach(), x.grad, {name: p.grad.clone() for name, p in mann.named_parameters()}


@native_only
@pytest.mark.parametrize("encoder", ["conv", "conv+pixels"])
def test_native_engine_equals_the_eager_loop(encoder):
    """Values, and the gradients of every parameter (the convolutions' among them) and of the
    input, in float64."""
    mann = build(encoder=encoder)
    assert mann.runs_on(torch.zeros(5, 3, IN, dtype=torch.float64)) == "native"
    x = rand(5, 3, IN, seed=2)
    (y, dx, grads), (y_e, dx_e, grads_e) = run(mann, "native", x), run(mann, "eager", x)
    torch.testing.assert_close(y, y_e, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(dx, dx_e, rtol=1e-10, atol=1e-12)
    assert {name for name in grads if name.startswith("features.")} == {
        "features.convs.0.weight", "features.convs.0.bias", "features.convs.1.weight",
        "features.convs.1.bias"}
    for name in grads:
        assert grads[name].abs().sum() > 0, name
        torch.testing.assert_close(grads[name], grads_e[name], rtol=1e-10, atol=1e-12,
                                   msg=lambda s, name=name: f"{name}: {s}")


def test_cell_steps_as_the_sequence():
    mann = build(1)
    cell = MANNCell(IN, 3, controller_size=8, memory_size=7, memory_width=5, read_heads=2,
                    learned_beta=True, encoder="conv", image_size=SIDE, dtype=torch.float64)
    cell.load_state_dict(mann.state_dict())
    x = rand(4, 2, IN, seed=3)
    with torch.no_grad():
        y, _ = mann(x)
        state, steps = None, []
        for x_t in x:
            y_t, state = cell(x_t, state)
            steps.append(y_t)
    torch.testing.assert_close(torch.stack(steps), y, rtol=1e-12, atol=1e-12)


@native_only
def test_gradcheck():
    mann = build(2)
    mann.engine = "native"
    x = rand(3, 2, IN, seed=4).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: mann(x)[0], (x,))


def test_trains_from_the_command_line(tmp_path, capsys):
    """``--set encoder=conv``: the run's model has the convolutions, its checkpoint loads into
    `ntm evaluate`, and a wrong name is a one-line error."""
    from torch_ntm.checkpoint import load_checkpoint
    from torch_ntm.cli import main

    run_dir = tmp_path / "run"
    sets = [arg for kv in [*TINY, "task.classes=3", "encoder=conv"] for arg in ("--set", kv)]
    assert main(["train", "omniglot", *sets, "--out", str(run_dir), "--no-progress",
                 "--no-plots"]) == 0
    checkpoint = load_checkpoint(run_dir)
    assert checkpoint.config.model_params.encoder == "conv"
    assert "features.convs.1.weight" in checkpoint.state_dict
    capsys.readouterr()
    assert main(["evaluate", str(run_dir), "--sequences", "16"]) == 0
    assert "instance" in capsys.readouterr().out
    assert main(["train", "omniglot", "--set", "encoder=cnn", "--out", str(tmp_path / "bad"),
                 "--no-progress", "--no-plots"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown encoder 'cnn'" in err, err


def test_config_error_names_the_encoder():
    from torch_ntm.presets import resolve_config

    # refused with the config, before a model, a task or a run folder exists
    with pytest.raises(ConfigError, match="the model cannot be built from this config: "
                                          "image_size=30 needs 900 input values per step"):
        resolve_config("omniglot", None, ["encoder=conv", "image_size=30"])
