"""Tests of torch_ntm.omniglot: the shipped images, episode layout, splits, seeding, scoring.

Episodes are checked against the shipped images themselves: with jitter off, every step's image is
looked up among the drawings (and their quarter turns), so each test knows which character,
drawing and rotation a step shows and can check the episode's structure step by step.
"""

from __future__ import annotations

import io
import math
import zipfile
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch

from torch_ntm import omniglot
from torch_ntm.omniglot import (
    DATA_FILE,
    OmniglotTask,
    accuracy_by_instance,
    downscale,
    instance_numbers,
    load_characters,
    read_zips,
    save_characters,
    split_characters,
)
from torch_ntm.tasks import TASKS

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src" / "torch_ntm"


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _lookup(rotations: bool) -> dict[bytes, tuple[int, int, int]]:
    """``{image bytes: (character, drawing, quarter turns)}`` over all shipped images."""
    images = load_characters().images
    table = {}
    for r in range(4 if rotations else 1):
        turned = images.rot90(r, dims=(-2, -1))
        for k in range(images.shape[0]):
            for d in range(images.shape[1]):
                table.setdefault(turned[k, d].contiguous().numpy().tobytes(), (k, d, r))
    return table


def _identify(batch, table) -> list[list[tuple[int, int, int]]]:
    """``[B][T]`` (character, drawing, turns) of each step of a jitter-free batch."""
    pixels = (batch.inputs[..., : omniglot.PIXELS] * 255).round().to(torch.uint8)
    T, B = pixels.shape[:2]
    key = [[pixels[t, b].view(20, 20).numpy().tobytes() for t in range(T)] for b in range(B)]
    return [[table[k] for k in row] for row in key]


# ---------------------------------------------------------------------------------------------
# Shipped data


def test_embedded_data_shapes_dtype_range():
    chars = load_characters()
    assert chars.images.shape == (242, 20, 20, 20)
    assert chars.images.dtype == torch.uint8
    assert int(chars.images.min()) == 0 and int(chars.images.max()) == 255
    assert len(chars.alphabets) == len(chars.names) == 242
    assert len(set(zip(chars.alphabets, chars.names))) == 242  # Greek/Latin kept once
    assert len(set(chars.alphabets)) == 8
    # ink high: a few percent of the page is ink, and the border is mostly blank paper
    ink = chars.images.float() / 255
    assert 0.02 < float(ink.mean()) < 0.2
    assert float(ink[..., 0, :].mean()) < float(ink.mean()) / 4
    # every drawing has some ink (the thinnest, a Latin "i", peaks at 121 / 255), and the 20
    # drawings of a character differ
    assert bool((ink.flatten(2).amax(-1) > 0.4).all())
    assert not torch.equal(chars.images[0, 0], chars.images[0, 1])


def test_package_data_small_licensed_and_declared():
    assert DATA_FILE.is_file() and DATA_FILE.stat().st_size < 3_000_000
    folder = DATA_FILE.parent
    assert "MIT" in (folder / "LICENSE").read_text()
    readme = (folder / "README.md").read_text()
    assert "prepare_omniglot.py" in readme and "omniglot" in readme.lower()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["torch_ntm.data"]
    data_root = SRC / "data"
    for name in (DATA_FILE.name, "LICENSE", "README.md"):
        relative = (folder / name).relative_to(data_root).as_posix()
        assert any(fnmatch(relative, g) for g in globs), relative


_OPENED = """
import sys
opened = []
sys.addaudithook(lambda event, args: opened.append(str(args[0])) if event == "open" else None)
import torch
from torch_ntm import omniglot, pretrained
from torch_ntm.tasks import make_task
task = make_task("omniglot")
task.sample(2, torch.Generator().manual_seed(0))
task.held_out().sample(2, torch.Generator().manual_seed(0))
omniglot.load_characters()
pretrained.load("omniglot")
print("\\n".join(opened))
"""


@pytest.mark.slow
def test_no_data_is_read_from_the_shared_folder(tmp_path):
    """The library ships its Omniglot subset: sampling episodes of both splits and loading the
    shipped model open the package's copy, and nothing in the development checkout's shared/
    folder beside it (files opened, as Python's audit hook reports them)."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", _OPENED], capture_output=True, text=True,
                            timeout=300, cwd=tmp_path, check=True)
    opened = [Path(p) for p in result.stdout.splitlines() if p]
    shipped = SRC / "data" / "omniglot"
    assert any(p.resolve().is_relative_to(shipped) for p in opened)  # the hook sees the reads
    shared = REPO.parent / "shared"
    assert not [p for p in opened if p.resolve().is_relative_to(shared)]


def test_downscale_is_exact_area_average():
    # oracle: 7 -> 3 is not an integer ratio; blow each source pixel up to 3 x 3 (21 x 21), then
    # each output pixel is the mean of a 7 x 7 block
    ink = torch.rand(4, 7, 7, generator=_gen(0)) < 0.4
    fine = ink.double().repeat_interleave(3, 1).repeat_interleave(3, 2)  # (4, 21, 21)
    expected = fine.view(4, 3, 7, 3, 7).mean((2, 4))
    got = downscale(ink, 3)
    assert got.dtype == torch.uint8
    assert torch.equal(got, (expected * 255).round().to(torch.uint8))
    full = torch.full((1, 20, 20), 255, dtype=torch.uint8)
    assert torch.equal(downscale(torch.ones(1, 105, 105)), full)


# ---------------------------------------------------------------------------------------------
# Episodes


def test_layout_sizes_and_mask():
    task = OmniglotTask(classes=3, instances=4)
    batch = task.sample(5, _gen(1))
    assert task.input_size == 403 and task.output_size == 3
    assert batch.inputs.shape == (12, 5, 403) and batch.targets.shape == (12, 5, 3)
    assert batch.mask.shape == (12, 5) and batch.mask.dtype == torch.bool and bool(batch.mask.all())
    assert batch.inputs.dtype == torch.float32
    assert float(batch.inputs[..., :400].min()) >= 0 and float(batch.inputs[..., :400].max()) <= 1
    default = OmniglotTask().sample(2, _gen(0))
    assert default.inputs.shape == (50, 2, 405)


@pytest.mark.parametrize("labels", ["one_hot", "string"])
def test_label_input_is_previous_target(labels):
    batch = OmniglotTask(classes=4, instances=3, labels=labels).sample(6, _gen(2))
    label_in = batch.inputs[..., 400:]
    assert bool((label_in[0] == 0).all())
    assert torch.equal(label_in[1:], batch.targets[:-1])


def test_episode_has_n_instances_of_c_classes_each_one_character():
    task = OmniglotTask(classes=3, instances=4, split="test")
    batch = task.sample(7, _gen(3))
    seen = _identify(batch, _lookup(rotations=False))
    label = batch.targets.argmax(-1)  # (T, B)
    assert bool((batch.targets.sum(-1) == 1).all())
    for b in range(7):
        counts = torch.bincount(label[:, b], minlength=3)
        assert counts.tolist() == [4, 4, 4]
        chars = {}
        for t in range(12):
            character, drawing, turns = seen[b][t]
            assert turns == 0
            chars.setdefault(int(label[t, b]), []).append((character, drawing))
        # one character per label, 4 distinct drawings of it, 3 distinct characters
        assert all(len({c for c, _ in v}) == 1 for v in chars.values())
        assert all(len({d for _, d in v}) == 4 for v in chars.values())
        assert len({v[0][0] for v in chars.values()}) == 3


def test_labels_are_drawn_afresh_per_episode():
    # the test split has 63 characters; 64 episodes of 5 show many characters several times
    batch = OmniglotTask(split="test").sample(64, _gen(4))
    seen = _identify(batch, _lookup(rotations=False))
    label = batch.targets.argmax(-1)
    labels_of = {}
    order_labels = set()
    for b in range(64):
        mapping = {seen[b][t][0]: int(label[t, b]) for t in range(50)}
        assert sorted(mapping.values()) == [0, 1, 2, 3, 4]  # a bijection
        for character, y in mapping.items():
            labels_of.setdefault(character, set()).add(y)
        order_labels.add(tuple(mapping[c] for c in sorted(mapping)))
    assert max(len(v) for v in labels_of.values()) > 1
    assert len(order_labels) > 10  # not tied to the characters' order


def test_splits_disjoint_including_rotations():
    chars = load_characters()
    train, val, test = (split_characters(s) for s in ("train", "val", "test"))
    assert (len(train), len(val), len(test)) == (162, 17, 63)
    assert sorted(train.tolist() + val.tolist() + test.tolist()) == list(range(242))
    assert set(chars.alphabets[i] for i in test) == set(omniglot.TEST_ALPHABETS)
    assert not set(chars.alphabets[i] for i in train) & set(omniglot.TEST_ALPHABETS)
    # validation: every 10th character of the training alphabets, from each of them
    training = sorted(train.tolist() + val.tolist())
    assert val.tolist() == training[9::10]
    assert set(chars.alphabets[i] for i in val) == set(chars.alphabets[i] for i in train)
    # no test drawing equals any train drawing in any rotation
    train_bytes = {
        chars.images[i].rot90(r, dims=(-2, -1))[d].contiguous().numpy().tobytes()
        for i in train.tolist()
        for r in range(4)
        for d in range(20)
    }
    test_bytes = {chars.images[i, d].numpy().tobytes() for i in test.tolist() for d in range(20)}
    assert not train_bytes & test_bytes


def test_train_episodes_use_rotated_train_characters_only():
    table = _lookup(rotations=True)
    train = set(split_characters("train").tolist())
    batch = OmniglotTask(classes=5, jitter=False).sample(16, _gen(5))
    seen = _identify(batch, table)
    label = batch.targets.argmax(-1)
    turns = set()
    for b in range(16):
        classes = {}
        for t in range(50):
            character, _, r = seen[b][t]
            assert character in train
            classes.setdefault(int(label[t, b]), set()).add((character, r))
            turns.add(r)
        assert all(len(v) == 1 for v in classes.values())  # one rotation of one character
    assert turns == {0, 1, 2, 3}
    test_batch = OmniglotTask(split="test").sample(8, _gen(6))
    test = set(split_characters("test").tolist())
    assert all(c in test and r == 0 for row in _identify(test_batch, table) for c, _, r in row)


def test_reflections_are_classes_of_their_own_in_training_only():
    task = OmniglotTask(classes=5, jitter=False, reflections=True)
    assert task.num_classes == 162 * 8
    assert OmniglotTask(reflections=True, rotations=False).num_classes == 162
    assert task.held_out().num_classes == 63  # held out: upright, as without reflections
    images = load_characters().images
    matches = {}  # image bytes -> every (character, transform) it is: some drawings are symmetric
    for r in range(8):
        turned = (images.flip(-1) if r >= 4 else images).rot90(r % 4, dims=(-2, -1))
        for k in range(images.shape[0]):
            for d in range(images.shape[1]):
                matches.setdefault(turned[k, d].contiguous().numpy().tobytes(), set()).add((k, r))
    batch = task.sample(32, _gen(14))
    label = batch.targets.argmax(-1)
    pixels = (batch.inputs[..., : omniglot.PIXELS] * 255).round().to(torch.uint8)
    transforms = set()
    for b in range(32):
        classes = {}
        for t in range(50):
            found = matches[pixels[t, b].view(20, 20).numpy().tobytes()]
            common = classes.setdefault(int(label[t, b]), found)
            classes[int(label[t, b])] = common & found
        for (common,) in classes.values():  # exactly one transform of one character per class
            transforms.add(common[1])
    assert transforms == set(range(8))
    with pytest.raises(ValueError, match="reflections must be True or False"):
        OmniglotTask(reflections=None)


def test_jitter_moves_pixels_and_zero_jitter_is_identity():
    plain = OmniglotTask(jitter=False).sample(4, _gen(7))
    jittered = OmniglotTask().sample(4, _gen(7))
    assert not torch.equal(plain.inputs, jittered.inputs)
    assert torch.equal(plain.targets, jittered.targets)
    x = jittered.inputs[..., :400]
    assert float(x.min()) >= 0 and float(x.max()) <= 1
    images = torch.rand(6, 20, 20, generator=_gen(8))
    same = omniglot._jitter(images, 0.0, 0.0, _gen(9))
    torch.testing.assert_close(same, images, atol=1e-5, rtol=0)


def test_affine_turns_and_shifts_by_whole_pixels():
    x = torch.rand(2, 20, 20, generator=_gen(13))
    zero = torch.zeros(2)
    quarter = omniglot._affine(x, zero + math.pi / 2, torch.zeros(2, 2))
    torch.testing.assert_close(quarter, x.rot90(1, dims=(-2, -1)), atol=1e-5, rtol=0)
    right = omniglot._affine(x, zero, torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    torch.testing.assert_close(right[..., 1:], x[..., :-1], atol=1e-5, rtol=0)
    assert float(right[..., 0].abs().max()) < 1e-6  # blank paper comes in
    down = omniglot._affine(x, zero, torch.tensor([[0.0, 2.0], [0.0, 2.0]]))
    torch.testing.assert_close(down[:, 2:], x[:, :-2], atol=1e-5, rtol=0)


def test_same_seed_same_batch_and_batch_first():
    task = OmniglotTask(classes=4, instances=5)
    a, b = task.sample(3, _gen(10)), task.sample(3, _gen(10))
    for x, y in zip(a, b):
        assert torch.equal(x, y)
    c = task.sample(3, _gen(11))
    assert not torch.equal(a.inputs, c.inputs)
    first = task.sample(3, _gen(10), batch_first=True)
    for x, y in zip(a, first):
        assert torch.equal(x.transpose(0, 1), y)


def test_string_labels():
    task = OmniglotTask(classes=15, labels="string", split="test")
    assert task.input_size == 425 and task.output_size == 25
    batch = task.sample(4, _gen(12))
    y = batch.targets.view(150, 4, 5, 5)
    assert bool((y.sum(-1) == 1).all())  # each of 5 characters one-hot over 5 symbols
    for b in range(4):
        strings = {tuple(y[t, b].argmax(-1).tolist()) for t in range(150)}
        assert len(strings) == 15
    assert instance_numbers(batch.targets).max() == 10


def test_bad_parameters():
    with pytest.raises(ValueError, match="63 classes"):
        OmniglotTask(classes=64, split="test")
    OmniglotTask(classes=162, split="train", rotations=False)
    with pytest.raises(ValueError, match="162 classes"):
        OmniglotTask(classes=163, split="train", rotations=False)
    with pytest.raises(ValueError, match="17 classes"):
        OmniglotTask(classes=18, split="val")
    with pytest.raises(ValueError, match="instances"):
        OmniglotTask(instances=21)
    with pytest.raises(ValueError, match="classes"):
        OmniglotTask(classes=0)
    with pytest.raises(ValueError, match="split"):
        OmniglotTask(split="valid")
    with pytest.raises(ValueError, match="labels"):
        OmniglotTask(labels="onehot")
    with pytest.raises(ValueError, match="rotations"):
        OmniglotTask(rotations="yes")
    with pytest.raises(ValueError, match="max_shift"):
        OmniglotTask(max_shift=-1.0)
    with pytest.raises(ValueError, match="images_background.zip"):
        OmniglotTask(root="/nonexistent/omniglot")
    with pytest.raises(ValueError, match="split"):
        split_characters("all")


def test_task_interface_and_registered():
    task = OmniglotTask()
    assert task.train_size == 10 and task.with_size(15).instances == 15
    assert task.num_classes == 162 * 4
    assert OmniglotTask(split="test").num_classes == 63
    assert OmniglotTask(split="val").num_classes == 17
    assert TASKS["omniglot"] is OmniglotTask and OmniglotTask.loss == "cross_entropy"
    assert task.held_out() == OmniglotTask(split="test")  # what evaluation reports
    assert task.validation() == OmniglotTask(split="val")  # what a run keeps its weights on
    assert (task.label_groups, OmniglotTask(labels="string").label_groups) == (1, 5)


# ---------------------------------------------------------------------------------------------
# Reading zips (the preprocessing of scripts/prepare_omniglot.py and of root=)


def _png(square: int) -> bytes:
    """A 105 x 105 Omniglot-like PNG: white paper with a black square of side ``square``."""
    image_mod = pytest.importorskip("PIL.Image")
    image = image_mod.new("1", (105, 105), 1)
    for x in range(square):
        for y in range(square):
            image.putpixel((x, y), 0)
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def _zip(path: Path, top: str, characters: dict[tuple[str, str], int]) -> None:
    with zipfile.ZipFile(path, "w") as archive:
        for (alphabet, name), square in characters.items():
            for d in range(1, 21):
                archive.writestr(f"{top}/{alphabet}/{name}/0001_{d:02d}.png", _png(square))


def test_read_zips_order_dedupe_and_round_trip(tmp_path):
    _zip(tmp_path / "a.zip", "a", {("Beta", "character01"): 21, ("Alpha", "character02"): 0})
    _zip(tmp_path / "b.zip", "b", {("Beta", "character01"): 21, ("Gamma", "character01"): 105})
    chars = read_zips([tmp_path / "a.zip", tmp_path / "b.zip"])
    assert chars.alphabets == ("Alpha", "Beta", "Gamma") and chars.images.shape == (3, 20, 20, 20)
    assert int(chars.images[0].max()) == 0  # blank paper
    assert bool((chars.images[2] == 255).all())  # all ink
    beta = chars.images[1, 0].float() / 255  # a 21 x 21 square is 4 x 4 output pixels (5.25)
    assert bool((beta[:4, :4] == 1).all()) and float(beta[4:].sum() + beta[:, 4:].sum()) == 0
    save_characters(chars, tmp_path / "x.safetensors.gz")
    back = omniglot._read_characters(tmp_path / "x.safetensors.gz")
    assert torch.equal(back.images, chars.images) and back.names == chars.names
    assert back.alphabets == chars.alphabets

    _zip(tmp_path / "c.zip", "c", {("Beta", "character01"): 10})
    with pytest.raises(ValueError, match="differs"):
        read_zips([tmp_path / "a.zip", tmp_path / "c.zip"])


def test_root_reads_full_zips(tmp_path):
    _zip(tmp_path / "images_background.zip", "images_background", {("A", "character01"): 30})
    _zip(tmp_path / "images_evaluation.zip", "images_evaluation", {("B", "character01"): 40})
    chars = load_characters(tmp_path)
    assert chars.alphabets == ("A", "B")
    # fewer than 1,200 characters: all are training characters
    assert split_characters("train", tmp_path).tolist() == [0, 1]
    assert split_characters("test", tmp_path).tolist() == []
    batch = OmniglotTask(classes=2, instances=3, root=str(tmp_path)).sample(2, _gen(0))
    assert batch.inputs.shape == (6, 2, 402)
    with pytest.raises(ValueError, match="0 classes"):
        OmniglotTask(classes=1, split="test", root=str(tmp_path))


# ---------------------------------------------------------------------------------------------
# Scoring


def _one_hot(labels: list[list[int]], width: int) -> torch.Tensor:
    """``[T, B, width]`` from per-sequence label lists ``[B][T]``."""
    return torch.nn.functional.one_hot(torch.tensor(labels).T, width).float()


def test_instance_numbers_by_hand():
    targets = _one_hot([[0, 1, 0, 0, 1], [2, 2, 1, 2, 1]], 3)  # (5, 2, 3)
    expected = torch.tensor([[1, 1, 2, 3, 2], [1, 2, 1, 3, 2]]).T
    assert torch.equal(instance_numbers(targets), expected)
    assert torch.equal(instance_numbers(targets.transpose(0, 1), batch_first=True), expected.T)


def test_accuracy_by_instance_by_hand():
    targets = _one_hot([[0, 1, 0, 0, 1], [2, 2, 1, 2, 1]], 3)
    # predictions: seq 0 [0, 2, 0, 1, 1] (right, wrong, right, wrong, right)
    #              seq 1 [1, 2, 1, 2, 0] (wrong, right, right, right, wrong)
    logits = _one_hot([[0, 2, 0, 1, 1], [1, 2, 1, 2, 0]], 3) * 3 - 1
    # instance 1: steps (0,0) r, (1,0) w, (0,1) w, (2,1) r -> 2/4
    # instance 2: (2,0) r, (4,0) r, (1,1) r, (4,1) w -> 3/4; instance 3: (3,0) w, (3,1) r -> 1/2
    got = accuracy_by_instance(logits, targets, instances=(1, 2, 3, 4))
    assert got[1] == 0.5 and got[2] == 0.75 and got[3] == 0.5 and math.isnan(got[4])
    first = accuracy_by_instance(logits.transpose(0, 1), targets.transpose(0, 1), (1,), True)
    assert first == {1: 0.5}


def test_accuracy_by_instance_string_labels_need_every_character():
    # labels of 2 characters over 3 symbols (6 units): step right only if both characters are
    def label(a, b):
        return [float(i == a) for i in range(3)] + [float(i == b) for i in range(3)]

    targets = torch.tensor([[label(0, 1)], [label(0, 1)], [label(2, 2)]])  # (3, 1, 6)
    logits = torch.tensor([[label(0, 1)], [label(0, 2)], [label(2, 2)]])
    got = accuracy_by_instance(logits, targets, instances=(1, 2))
    assert got == {1: 1.0, 2: 0.0}
    with pytest.raises(ValueError, match="same shape"):
        accuracy_by_instance(logits[:2], targets)


def _affine_oracle(x, angle, shift, scale, shear):
    """Float64 bilinear sampling written apart from `omniglot._affine`: output pixel q (pixel
    units, centre c) takes the input at M^-1 (q - c) + c - shift, M = rotation x scale x shear."""
    import numpy as np

    S = x.shape[-1]
    c = (S - 1) / 2
    out = np.zeros(x.shape)
    img = x.double().numpy()
    for n in range(x.shape[0]):
        cos, sin = math.cos(angle[n]), math.sin(angle[n])
        rot = np.array([[cos, -sin], [sin, cos]])  # inverse rotation, (x right, y down)
        unshear = np.array([[1.0, -shear[n]], [0.0, 1.0]])
        inverse = unshear @ rot / scale[n]
        for i in range(S):  # row (y)
            for j in range(S):  # column (x)
                px, py = inverse @ np.array([j - c, i - c]) + c - np.array(shift[n])
                x0, y0 = math.floor(px), math.floor(py)
                value = 0.0
                for yy, wy in ((y0, 1 - (py - y0)), (y0 + 1, py - y0)):
                    for xx, wx in ((x0, 1 - (px - x0)), (x0 + 1, px - x0)):
                        if 0 <= yy < S and 0 <= xx < S:
                            value += wy * wx * img[n, yy, xx]
                out[n, i, j] = value
    return torch.from_numpy(out)


def test_affine_with_scale_and_shear_matches_a_float64_oracle():
    x = torch.rand(3, 20, 20, generator=_gen(21))
    angle, scale, shear = [0.3, -0.2, 0.0], [1.3, 0.8, 1.0], [0.25, 0.0, -0.4]
    shift = [[0.5, -1.0], [0.0, 0.0], [1.5, 0.25]]
    got = omniglot._affine(x, torch.tensor(angle), torch.tensor(shift), torch.tensor(scale),
                           torch.tensor(shear))
    want = _affine_oracle(x, angle, shift, scale, shear)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=0)
    # enlarging by 2 doubles a centred square's side
    square = torch.zeros(1, 20, 20)
    square[:, 8:12, 8:12] = 1
    big = omniglot._affine(square, torch.zeros(1), torch.zeros(1, 2), torch.tensor([2.0]))
    assert abs(float(big.sum()) - 64) < 1e-3


def test_scale_and_shear_jitter_change_images_and_leave_the_stream_alone():
    plain = OmniglotTask().sample(4, _gen(7))
    assert torch.equal(plain.inputs, OmniglotTask(max_scale=0.0, max_shear=0.0)
                       .sample(4, _gen(7)).inputs)  # the default draws nothing more
    for extra in ({"max_scale": 0.2}, {"max_shear": 0.3}):
        batch = OmniglotTask(**extra).sample(4, _gen(7))
        assert not torch.equal(plain.inputs, batch.inputs)
        assert torch.equal(plain.targets, batch.targets)
        x = batch.inputs[..., :400]
        assert float(x.min()) >= 0 and float(x.max()) <= 1 + 1e-6
    with pytest.raises(ValueError, match="max_scale"):
        OmniglotTask(max_scale=-0.1)
    with pytest.raises(ValueError, match="max_shear"):
        OmniglotTask(max_shear=float("nan"))


def test_a_run_validates_on_the_validation_split_and_evaluation_reports_the_test_split():
    # Honest selection: the weights a run keeps are chosen on characters it never trained on and
    # that the reported figures do not use.
    from torch_ntm.evaluate import fixed_batches
    from torch_ntm.presets import resolve_config
    from torch_ntm.train import validation_batches

    config = resolve_config("omniglot", None, ["eval_sequences=32", "batch_size=16"])
    table = _lookup(rotations=False)
    val, test = (set(split_characters(s).tolist()) for s in ("val", "test"))
    batches = validation_batches(config, config.task_params)
    assert batches and all(task.split == "val" for _, task in batches)
    seen = {c for (batch, _) in batches for row in _identify(batch, table) for c, _, _ in row}
    assert seen and seen <= val
    held_out = config.task_params.held_out()
    (batch, _), *_ = fixed_batches(held_out, 16, 16)
    assert {c for row in _identify(batch, table) for c, _, _ in row} <= test


@pytest.mark.slow
def test_ntm_train_and_evaluate_on_the_full_zips_layout(tmp_path, monkeypatch, capsys):
    # A user with the full Omniglot: `task.root=` a folder with images_background.zip and
    # images_evaluation.zip in the archives' own layout. Here 7 + 3 characters with the split
    # point and the validation stride scaled down (1,200 and 10 for the real archives): the
    # first 7 are the training alphabets' (2 of them validation), the last 3 the test split.
    import json

    from torch_ntm.cli import main
    from torch_ntm.runlog import read_metrics

    background = {("Alpha", f"character{i:02d}"): 9 + 4 * i for i in range(1, 5)}
    background |= {("Beta", f"character{i:02d}"): 30 + 6 * i for i in range(1, 4)}
    evaluation = {("Gamma", f"character{i:02d}"): 60 + 7 * i for i in range(1, 4)}
    _zip(tmp_path / "images_background.zip", "images_background", background)
    _zip(tmp_path / "images_evaluation.zip", "images_evaluation", evaluation)
    monkeypatch.setattr(omniglot, "PAPER_TRAIN_CHARACTERS", 7)
    monkeypatch.setattr(omniglot, "VAL_EVERY", 3)
    root = str(tmp_path)
    assert [len(split_characters(s, root)) for s in ("train", "val", "test")] == [5, 2, 3]
    run = tmp_path / "run"
    settings = [f"task.root={root}", "task.classes=2", "task.instances=2", "batch_size=4",
                "max_sequences=16", "eval_every=2", "eval_sequences=8", "controller_size=8",
                "memory_size=8", "memory_width=4", "read_heads=1", "ema_decay=0"]
    argv = ["train", "omniglot", "--out", str(run)]
    for item in settings:
        argv += ["--set", item]
    assert main(argv) == 0
    assert json.loads((run / "config.json").read_text())["task_params"]["root"] == root
    assert len(read_metrics(run / "metrics.csv", "val")) == 2
    capsys.readouterr()
    assert main(["evaluate", str(run), "--json", "--sequences", "8"]) == 0
    report = json.loads(capsys.readouterr().out)  # the test split's 3 characters
    assert report["split"] == "test" and report["sequences"] == 8
    assert set(report["accuracy_by_instance"]) == {"1", "2"}
