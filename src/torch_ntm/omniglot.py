"""Omniglot one-shot classification episodes (Santoro et al. 2016, "One-shot learning with
memory-augmented neural networks", section 4.1), with the images shipped in the package.

The package holds 242 characters of the Omniglot background set (Lake et al. 2015, MIT licence;
8 alphabets, 20 drawings each) downscaled to 20 x 20, in
``data/omniglot/omniglot20.safetensors.gz`` (made by ``scripts/prepare_omniglot.py``); no file
outside the package is read. ``root=`` points at a folder with the full Omniglot zips instead,
for the paper's 1,200 / 423 character split (needs Pillow to read the PNGs).

    task = OmniglotTask()                    # 5 classes x 10 instances, training split
    inputs, targets, mask = task.sample(16, torch.Generator().manual_seed(0))
    # ... logits = model(inputs)[0]
    accuracy_by_instance(logits, targets)    # {1: 0.2, 2: 0.6, ..., 10: 0.9}

Images are uint8, ink high: 0 is blank paper, 255 a pixel fully covered by ink (the PNGs are dark
ink on white; each 105 x 105 image is inverted and averaged over exact pixel areas to 20 x 20).
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import json
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import ClassVar, NamedTuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from torch_ntm.task_base import Batch, Task

__all__ = [
    "OmniglotCharacters",
    "OmniglotTask",
    "load_characters",
    "split_characters",
    "read_zips",
    "save_characters",
    "downscale",
    "instance_numbers",
    "accuracy_by_instance",
]

DATA_FILE = Path(__file__).parent / "data" / "omniglot" / "omniglot20.safetensors.gz"
SIZE = 20  # images are SIZE x SIZE
PIXELS = SIZE * SIZE  # 400 image values at the start of every input step
DRAWINGS = 20  # drawings of every character (by 20 different people)
ROTATIONS = 4  # training classes: each character at 0, 90, 180 and 270 degrees
# Embedded data: these alphabets (63 characters) are the test split; the other 5 (179 characters)
# are the training alphabets (split into "train" and "val", `split_characters`).
TEST_ALPHABETS = ("Balinese", "Early_Aramaic", "Tagalog")
# Full data (root=): background then evaluation characters; the first 1,200 train, 423 test.
FULL_ZIPS = ("images_background.zip", "images_evaluation.zip")
PAPER_TRAIN_CHARACTERS = 1200
# String labels (Santoro et al. for 15 classes): 5 characters, each one of 5 symbols.
STRING_LENGTH = 5
STRING_SYMBOLS = 5
SPLITS = ("train", "val", "test")
# The validation split: every VAL_EVERY-th character of the training alphabets (the 10th, 20th,
# ...), never trained on, on which a run chooses the weights it keeps; the test split is for
# reporting only.
VAL_EVERY = 10
LABELS = ("one_hot", "string")


class OmniglotCharacters(NamedTuple):
    """Omniglot characters, K of them, in a fixed order."""

    images: Tensor  # (K, DRAWINGS, SIZE, SIZE) uint8, ink high
    alphabets: tuple[str, ...]  # (K,) alphabet of each character, e.g. "Greek"
    names: tuple[str, ...]  # (K,) folder name of each character, e.g. "character01"


# ---------------------------------------------------------------------------------------------
# Preprocessing: PNG zips -> uint8 20 x 20 (scripts/prepare_omniglot.py, and root=)


def _area_matrix(source: int, size: int) -> Tensor:
    """``[size, source]`` float64: row i averages the source pixels under output pixel i.

    Output pixel i covers ``[i s, (i + 1) s)`` of the source axis with ``s = source / size``;
    ``A[i, j]`` is the length of its overlap with source pixel ``[j, j + 1)``, divided by s.
    """
    scale = source / size
    lo = torch.arange(size, dtype=torch.float64).unsqueeze(1) * scale  # (size, 1)
    j = torch.arange(source, dtype=torch.float64)  # (source,)
    overlap = (torch.minimum(lo + scale, j + 1) - torch.maximum(lo, j)).clamp(min=0)
    return overlap / scale


def downscale(ink: Tensor, size: int = SIZE) -> Tensor:
    """Average ink over exact pixel areas (an antialiased box filter) and quantise to uint8.

    Args:
        ink: ``[N, S, S]`` ink coverage in [0, 1] (any float or bool dtype), ink high.
        size: output side.

    Returns:
        ``[N, size, size]`` uint8, ``round(255 * mean ink under each output pixel)``.
    """
    area = _area_matrix(ink.shape[-1], size)  # (size, S)
    out = area @ ink.double() @ area.T  # (N, size, size)
    return (out * 255).round().clamp(0, 255).to(torch.uint8)


def _decode_png(data: bytes) -> np.ndarray:
    """``[105, 105]`` bool ink mask of one Omniglot PNG (dark ink on white paper)."""
    try:
        from PIL import Image
    except ImportError as error:  # only the preprocessing path reads PNGs
        raise ImportError(
            "reading Omniglot PNG zips (OmniglotTask(root=...), scripts/prepare_omniglot.py) "
            "needs Pillow: pip install pillow; the embedded data does not"
        ) from error
    with Image.open(io.BytesIO(data)) as image:
        pixels = np.asarray(image.convert("L"))
    return pixels < 128


def _decode_named(data: bytes, path, entry: str) -> np.ndarray:
    """`_decode_png` of ``entry`` in zip ``path``; a `ValueError` naming both if it is not a
    105 x 105 image."""
    try:
        ink = _decode_png(data)
    except ImportError:
        raise
    except Exception as e:  # Pillow's own errors for what it cannot read
        raise ValueError(f"{os.fspath(path)}: {entry} is not a PNG image Pillow reads ({e})"
                         ) from None
    if ink.shape != (105, 105):
        raise ValueError(f"{os.fspath(path)}: {entry} is {ink.shape[1]} x {ink.shape[0]} "
                         f"pixels, not the 105 x 105 of an Omniglot drawing")
    return ink


def read_zips(paths: list[str | os.PathLike]) -> OmniglotCharacters:
    """Read Omniglot zips (``.../ALPHABET/CHARACTER/NNNN_DD.png``) into 20 x 20 characters.

    Characters are in the order of ``paths``, sorted by (alphabet, character) inside a zip; a
    character found again in a later zip (the two small background subsets share Greek and
    Latin) must have the same PNGs, and is kept once. Needs Pillow.

    Raises:
        ValueError: a character without exactly `DRAWINGS` drawings, or two different copies,
            or a drawing that is not a 105 x 105 image (naming the zip and the entry).
    """
    files: dict[tuple[str, str], tuple[str | os.PathLike, dict[str, bytes]]] = {}
    for path in paths:
        found: dict[tuple[str, str], dict[str, bytes]] = {}
        try:
            with zipfile.ZipFile(path) as archive:
                for entry in archive.namelist():
                    parts = PurePosixPath(entry).parts
                    if len(parts) >= 3 and parts[-1].endswith(".png"):
                        drawings = found.setdefault((parts[-3], parts[-2]), {})
                        drawings[parts[-1]] = archive.read(entry)
        except (zipfile.BadZipFile, OSError, EOFError) as e:  # not a zip, or a damaged one
            raise ValueError(f"{os.fspath(path)}: not a readable zip file ({e})") from None
        for key in sorted(found):
            if key in files:
                if files[key][1] != found[key]:
                    raise ValueError(f"{os.fspath(path)}: {'/'.join(key)} differs from before")
                continue
            if len(found[key]) != DRAWINGS:
                raise ValueError(
                    f"{os.fspath(path)}: {'/'.join(key)} has {len(found[key])} drawings, "
                    f"expected {DRAWINGS}"
                )
            files[key] = (path, found[key])
    if not files:
        raise ValueError(f"no Omniglot PNGs in {[os.fspath(p) for p in paths]}")
    ink = np.stack(
        [_decode_named(drawings[name], path, "/".join((*key, name)))
         for (key, (path, drawings)) in files.items() for name in sorted(drawings)]
    )  # (K * DRAWINGS, 105, 105)
    images = downscale(torch.from_numpy(ink)).view(len(files), DRAWINGS, SIZE, SIZE)
    return OmniglotCharacters(
        images, tuple(key[0] for key in files), tuple(key[1] for key in files)
    )


def save_characters(characters: OmniglotCharacters, path: str | os.PathLike) -> None:
    """Write characters as gzipped safetensors: tensor ``images``, JSON metadata ``characters``.

    The gzip header carries no time stamp, and the metadata one key (safetensors writes several
    in no fixed order), so the same characters give the same bytes.
    """
    from safetensors.torch import save

    index = [[a, n] for a, n in zip(characters.alphabets, characters.names)]
    metadata = {"characters": json.dumps(index)}
    data = save({"images": characters.images.contiguous()}, metadata=metadata)
    Path(path).write_bytes(gzip.compress(data, mtime=0))


def _read_characters(path: Path) -> OmniglotCharacters:
    """Read what `save_characters` wrote."""
    from safetensors.torch import load

    data = gzip.decompress(path.read_bytes())
    # a safetensors file opens with its header's length (u64, little-endian), then the header
    header = json.loads(data[8 : 8 + int.from_bytes(data[:8], "little")])
    index = json.loads(header["__metadata__"]["characters"])
    images = load(data)["images"]
    return OmniglotCharacters(images, tuple(a for a, _ in index), tuple(n for _, n in index))


@functools.lru_cache(maxsize=4)
def _load(root: str | None) -> OmniglotCharacters:
    if root is None:
        return _read_characters(DATA_FILE)
    paths = [Path(root) / name for name in FULL_ZIPS]
    missing = [os.fspath(p) for p in paths if not p.is_file()]
    if missing:
        raise ValueError(
            f"root={root!r} must hold the full Omniglot zips {', '.join(FULL_ZIPS)}; "
            f"missing: {', '.join(missing)}"
        )
    return read_zips(paths)


def load_characters(root: str | os.PathLike | None = None) -> OmniglotCharacters:
    """The embedded characters (``root=None``), or those of the full zips in folder ``root``.

    Cached: each source is read once per process (the full zips take a few seconds), and every
    caller gets the same tensors, so treat them as read-only.
    """
    return _load(None if root is None else os.path.abspath(os.fspath(root)))


def split_characters(split: str, root: str | os.PathLike | None = None) -> Tensor:
    """Indices ``[K_split]`` (long) into `load_characters` of one split's characters; the three
    splits share no character.

    Embedded data: ``"test"`` is every character of `TEST_ALPHABETS` (Balinese, Early_Aramaic,
    Tagalog: 63 characters); the rest (Greek, Japanese_(katakana), Korean, Latin, Sanskrit: 179)
    are the training alphabets, of which every `VAL_EVERY`-th character in order (the 10th, 20th,
    ...: 17) is ``"val"`` and the others (162) ``"train"``. Full data (``root``): the background
    characters then the evaluation ones, in the order of `read_zips`; the first 1,200 are the
    training characters (120 ``"val"``, 1,080 ``"train"``), the remaining 423 ``"test"``.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
    characters = load_characters(root)
    if root is None:
        is_test = torch.tensor([a in TEST_ALPHABETS for a in characters.alphabets])
    else:
        is_test = torch.arange(len(characters.names)) >= PAPER_TRAIN_CHARACTERS
    if split == "test":
        return is_test.nonzero().squeeze(1)
    training = (~is_test).nonzero().squeeze(1)
    is_val = torch.arange(len(training)) % VAL_EVERY == VAL_EVERY - 1
    return training[is_val if split == "val" else ~is_val]


# ---------------------------------------------------------------------------------------------
# The task


@dataclass
class OmniglotTask(Task):
    """One-shot classification episodes: label each drawing, learning the labels on the way.

    An episode draws ``classes`` = C classes of the split and ``instances`` = n distinct drawings
    of each, shown in a random order over ``T = C n`` steps (50 at the defaults). Each episode
    gives its classes fresh labels (a random permutation of the C one-hot labels, or C distinct
    random strings), so labels can only be learnt inside the episode: the label of every step is
    given as input one step later. With L the label width (C one-hot, 25 for strings):

        step      0            1            2          ...  T-1
        input    [x_0    ]    [x_1    ]    [x_2    ]   ...  [x_{T-1}]   0 .. 399: image
                 [0      ]    [y_0    ]    [y_1    ]   ...  [y_{T-2}]   400 .. 400+L-1: label
        target   [y_0    ]    [y_1    ]    [y_2    ]   ...  [y_{T-1}]   0 .. L-1: label
        mask      1            1            1          ...   1

    ``x_t``: the 20 x 20 image row by row (index ``20 r + c``), values in [0, 1], ink high.
    ``y_t``: the label of step t's class: one-hot over C (``labels="one_hot"``), or
    ``labels="string"`` (the paper's, for 15 classes): 5 characters, each one-hot over 5
    symbols, character j at units ``5 j .. 5 j + 4`` (25 units; C <= 3125 distinct strings).
    ``input_size = 400 + L``, ``output_size = L``; every step is scored.

    Splits (`split_characters`: ``"train"``, ``"val"``, ``"test"``) share no character. In training
    (``rotations``, ``jitter``: None means ``split == "train"``) a character rotated by 90, 180 or
    270 degrees is a class of its own (4 x 162 classes in the embedded data); with
    ``reflections=True`` (default False, effective only with rotations) each rotation's mirror image
    (columns reversed, then turned) is one more class (8 x 162). Each image is jittered: rotated by
    a uniform angle in ``[-max_angle, max_angle]`` degrees and shifted by uniform ``[-max_shift,
    max_shift]`` pixels on each axis (bilinear, blank outside); with ``max_scale`` > 0 also scaled
    about its centre by ``(1 + max_scale) ** u``, u uniform in [-1, 1] (as likely shrunk as
    enlarged), and with ``max_shear`` > 0 sheared horizontally by a uniform factor in ``[-max_shear,
    max_shear]`` (pixels of sideways move per pixel down), both off by default. The C classes are
    drawn uniformly without replacement from the split's classes (so in training two classes of an
    episode can be one character in two orientations), each class's n drawings uniformly without
    replacement from its 20, and the C n steps are in a uniformly random order. Without jitter,
    ``x_t`` is the stored 8-bit image divided by 255 (turned, where rotations apply). The size knob
    of `with_size` is ``instances``. Score with `accuracy_by_instance`; `instance_numbers` tells the
    k-th occurrence of a class. """

    classes: int = 5
    instances: int = 10
    split: str = "train"
    labels: str = "one_hot"
    rotations: bool | None = None
    jitter: bool | None = None
    reflections: bool = False
    max_shift: float = 1.5
    max_angle: float = 10.0
    max_scale: float = 0.0
    max_shear: float = 0.0
    root: str | None = None

    name: ClassVar[str] = "omniglot"
    size_name: ClassVar[str] = "instances"
    eval_sizes: ClassVar[tuple[int, ...]] = (10,)
    loss: ClassVar[str] = "cross_entropy"  # a softmax per label (per character of a string)

    def __post_init__(self) -> None:
        self._check(classes=1, instances=1)
        if self.instances > DRAWINGS:
            raise ValueError(
                f"OmniglotTask.instances must be <= {DRAWINGS} (distinct drawings of a "
                f"character), got {self.instances}"
            )
        if self.split not in SPLITS:
            raise ValueError(f"unknown split {self.split!r}; valid splits: {', '.join(SPLITS)}")
        if self.labels not in LABELS:
            raise ValueError(f"unknown labels {self.labels!r}; valid labels: {', '.join(LABELS)}")
        for field in ("rotations", "jitter"):
            if getattr(self, field) not in (None, True, False):
                raise ValueError(f"OmniglotTask.{field} must be None, True or False")
        if not isinstance(self.reflections, bool):
            raise ValueError("OmniglotTask.reflections must be True or False")
        for field in ("max_shift", "max_angle", "max_scale", "max_shear"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"OmniglotTask.{field} must be a number >= 0, got {value!r}")
        if self.labels == "string" and self.classes > STRING_SYMBOLS**STRING_LENGTH:
            raise ValueError(
                f"string labels name at most {STRING_SYMBOLS**STRING_LENGTH} classes, "
                f"got classes={self.classes}"
            )
        available = self.num_classes
        if self.classes > available:
            raise ValueError(
                f"OmniglotTask: classes={self.classes} is more than the {available} classes of "
                f"split {self.split!r} (rotations={self._rotations})"
            )

    @property
    def _rotations(self) -> bool:
        return self.split == "train" if self.rotations is None else self.rotations

    @property
    def _jitter(self) -> bool:
        return self.split == "train" if self.jitter is None else self.jitter

    @property
    def _transforms(self) -> int:
        """Classes per character: quarter turns, each also mirrored with ``reflections``."""
        if not self._rotations:
            return 1
        return ROTATIONS * (2 if self.reflections else 1)

    @property
    def num_classes(self) -> int:
        """Classes of the split that episodes draw from (characters, times 4 with rotations,
        times 8 with rotations and reflections)."""
        return len(split_characters(self.split, self.root)) * self._transforms

    @property
    def label_size(self) -> int:
        """L: units of one label."""
        return STRING_LENGTH * STRING_SYMBOLS if self.labels == "string" else self.classes

    @property
    def input_size(self) -> int:
        return PIXELS + self.label_size

    @property
    def output_size(self) -> int:
        return self.label_size

    @property
    def train_size(self) -> int:
        return self.instances

    def with_size(self, size: int) -> OmniglotTask:
        return dataclasses.replace(self, instances=size)

    @property
    def label_groups(self) -> int:
        """Softmax groups of a label: 1 (one-hot over C), or the 5 characters of a string."""
        return STRING_LENGTH if self.labels == "string" else 1

    def held_out(self) -> OmniglotTask:
        """The test split (alphabets never trained on: what evaluation reports), without
        rotations or jitter unless set explicitly.

        Raises:
            ValueError: ``classes`` is more than the test split has.
        """
        return dataclasses.replace(self, split="test")

    def validation(self) -> OmniglotTask:
        """The validation split (characters of the training alphabets never trained on: what a
        run chooses its kept weights on), without rotations or jitter unless set explicitly.

        Raises:
            ValueError: ``classes`` is more than the validation split has.
        """
        return dataclasses.replace(self, split="val")

    @property
    def extra_metrics(self) -> tuple[str, ...]:
        """``accuracy_1`` .. ``accuracy_n``: accuracy at the k-th instance of a class."""
        return tuple(f"accuracy_{k}" for k in range(1, self.instances + 1))

    def extra_scores(self, logits: Tensor, targets: Tensor, mask: Tensor) -> dict[str, float]:
        """`accuracy_by_instance` for every instance 1..n, as ``accuracy_k``."""
        accuracy = accuracy_by_instance(logits, targets, tuple(range(1, self.instances + 1)))
        return {f"accuracy_{k}": value for k, value in accuracy.items()}

    def _label_vectors(self, batch_size: int, generator: torch.Generator | None) -> Tensor:
        """``[B, C, L]`` the label of each class of each episode, fresh per episode."""
        B, C = batch_size, self.classes
        if self.labels == "one_hot":
            code = _permutations(B, C, generator)  # class c gets label code[b, c]
            return F.one_hot(code, C).float()
        code = _permutations(B, STRING_SYMBOLS**STRING_LENGTH, generator)[:, :C]  # distinct
        place = STRING_SYMBOLS ** torch.arange(STRING_LENGTH)  # character j is digit j, base 5
        digits = code.unsqueeze(-1) // place % STRING_SYMBOLS  # (B, C, 5)
        return F.one_hot(digits, STRING_SYMBOLS).flatten(-2).float()  # (B, C, 25)

    def _sample(self, batch_size: int, generator: torch.Generator | None) -> Batch:
        B, C, n = batch_size, self.classes, self.instances
        T = C * n
        images = load_characters(self.root).images  # (K, DRAWINGS, 20, 20)
        pool = split_characters(self.split, self.root)  # (K_split,)
        R = self._transforms
        chosen = _permutations(B, len(pool) * R, generator)[:, :C]  # class ids, (B, C)
        character, rotation = pool[chosen // R], chosen % R  # (B, C) each
        labels = self._label_vectors(B, generator)  # (B, C, L)
        drawing = _permutations(B * C, DRAWINGS, generator)[:, :n].reshape(B, C * n)
        # step t shows instance k of class c, where order[b, t] = c n + k
        order = _permutations(B, T, generator)  # (B, T)
        step_class = order // n  # (B, T)
        x = images[character.gather(1, step_class), drawing.gather(1, order)].float() / 255
        if R > 1:  # class (character, r): the character turned r % 4 quarter turns
            # anticlockwise, after reversing its columns (a mirror image) when r >= 4; each a
            # permutation of the pixels, so one gather moves every image's pixels at once
            step_rotation = rotation.gather(1, step_class)  # (B, T)
            x = x.view(B, T, PIXELS).gather(-1, _TURNS[step_rotation]).view(B, T, SIZE, SIZE)
        if self._jitter:
            x = _jitter(x.view(B * T, SIZE, SIZE), self.max_angle, self.max_shift, generator,
                        self.max_scale, self.max_shear)
        x = x.reshape(B, T, PIXELS)
        targets = labels.gather(1, step_class.unsqueeze(-1).expand(-1, -1, labels.shape[-1]))
        previous = F.pad(targets[:, :-1], (0, 0, 1, 0))  # y_{t-1}, zeros at t = 0
        inputs = torch.cat([x, previous], dim=-1)
        mask = torch.ones(T, B, dtype=torch.bool)
        inputs, targets = (z.transpose(0, 1).contiguous() for z in (inputs, targets))  # (T, B, .)
        return Batch(inputs, targets, mask)


def _turn_indices() -> Tensor:
    """``[2 ROTATIONS, PIXELS]``: for transform r (r % 4 anticlockwise quarter turns, after a
    mirror image when r >= 4), the source pixel of each output pixel, so that ``image.flatten()
    [_TURNS[r]]`` is the transformed image flattened."""
    pixels = torch.arange(PIXELS).view(SIZE, SIZE)
    faces = (pixels, pixels.flip(-1))
    return torch.stack([face.rot90(r, dims=(-2, -1)).flatten() for face in faces
                        for r in range(ROTATIONS)])


_TURNS = _turn_indices()


def _permutations(rows: int, n: int, generator: torch.Generator | None) -> Tensor:
    """``[rows, n]`` long: an independent uniform permutation of ``0..n-1`` per row."""
    return torch.rand(rows, n, generator=generator, dtype=torch.float64).argsort(dim=1)


def _jitter(x: Tensor, max_angle: float, max_shift: float, generator, max_scale: float = 0.0,
            max_shear: float = 0.0) -> Tensor:
    """`_affine` with angles uniform in ``[-max_angle, max_angle]`` degrees and shifts uniform in
    ``[-max_shift, max_shift]`` pixels per axis, one draw per image of ``x`` ``[N, S, S]``; scale
    factors ``(1 + max_scale) ** u`` and shears ``max_shear u`` (u uniform in [-1, 1)) when those
    are > 0, drawn after the others, so that without them the random stream is unchanged."""
    N = x.shape[0]
    u = torch.rand(N, 3, generator=generator) * 2 - 1  # (N, 3) in [-1, 1)
    scale = shear = None
    if max_scale > 0:
        scale = torch.exp((torch.rand(N, generator=generator) * 2 - 1) * math.log1p(max_scale))
    if max_shear > 0:
        shear = (torch.rand(N, generator=generator) * 2 - 1) * max_shear
    return _affine(x, u[:, 0] * math.radians(max_angle), u[:, 1:] * max_shift, scale, shear)


def _affine(x: Tensor, angle: Tensor, shift: Tensor, scale: Tensor | None = None,
            shear: Tensor | None = None) -> Tensor:
    """Shift images, then shear, scale and rotate them about their centres (in that order;
    bilinear, blank outside): ``out(c + M (p + shift - c)) = x(p)``, M = rotation x scale x
    shear, c the centre.

    Args:
        x: ``[N, S, S]`` images.
        angle: ``[N]`` radians, anticlockwise as displayed (pi / 2 is ``rot90(1, (-2, -1))``).
        shift: ``[N, 2]`` pixels, (right, down).
        scale: ``[N]`` factors (2 doubles the drawing's size); None: 1.
        shear: ``[N]`` horizontal shear, pixels moved right per pixel down; None: 0.

    Returns:
        ``[N, S, S]``.
    """
    N, S = x.shape[0], x.shape[-1]
    move = shift * (2 / S)  # one pixel is 2 / S in affine_grid's coordinates
    cos, sin = angle.cos(), angle.sin()
    # theta maps output coordinates to input coordinates: out(q) = x(A q - move), A = M^-1
    a = torch.stack([torch.stack([cos, -sin], 1), torch.stack([sin, cos], 1)], 1)  # (N, 2, 2)
    if scale is not None:
        a = a / scale[:, None, None]
    if shear is not None:
        unshear = torch.eye(2).repeat(N, 1, 1)
        unshear[:, 0, 1] = -shear
        a = unshear @ a
    theta = torch.cat([a, -move.unsqueeze(-1)], 2)  # (N, 2, 3)
    grid = F.affine_grid(theta, [N, 1, S, S], align_corners=False)
    out = F.grid_sample(x.unsqueeze(1), grid, mode="bilinear", align_corners=False)
    return out.squeeze(1)


# ---------------------------------------------------------------------------------------------
# Scoring


def instance_numbers(targets: Tensor, batch_first: bool = False) -> Tensor:
    """Which occurrence of its class each step is: 1 for the first, 2 for the second, ...

    A class is known by its label, so this works from the targets alone (either label kind).

    Args:
        targets: ``[T, B, L]`` labels (``[B, T, L]`` if ``batch_first``).

    Returns:
        ``[T, B]`` long (``[B, T]`` if ``batch_first``): the number of steps ``s <= t`` of the
        same sequence whose target equals step t's.
    """
    if targets.dim() != 3:
        raise ValueError(f"expected targets [T, B, L], got shape {list(targets.shape)}")
    y = targets.transpose(0, 1) if batch_first else targets  # (T, B, L)
    same = (y.unsqueeze(0) == y.unsqueeze(1)).all(-1)  # (T, T, B): [t, s] step s matches t
    T = y.shape[0]
    upto = torch.ones(T, T, dtype=torch.bool).tril().unsqueeze(-1)  # s <= t
    counts = (same & upto).sum(1)  # (T, B)
    return counts.transpose(0, 1) if batch_first else counts


def accuracy_by_instance(
    logits: Tensor,
    targets: Tensor,
    instances: tuple[int, ...] = (1, 2, 3, 4, 5, 10),
    batch_first: bool = False,
) -> dict[int, float]:
    """Accuracy on the steps that show the k-th instance of their class, for each k.

    A step is right when the argmax of the logits matches the target's one-hot: over all L units
    for one-hot labels, and in every 5-unit character for string labels (the number of
    characters is the number of ones in a target).

    Args:
        logits: ``[T, B, L]`` (``[B, T, L]`` if ``batch_first``).
        targets: the same shape, the task's labels.
        instances: the k to report (the paper: 1st, 2nd, 3rd, 4th, 5th, 10th).

    Returns:
        ``{k: fraction of the steps with instance number k that are right}``; NaN for a k that no
        step has.
    """
    if logits.shape != targets.shape or targets.dim() != 3:
        raise ValueError(
            f"expected logits and targets of the same shape [T, B, L], got "
            f"{list(logits.shape)} and {list(targets.shape)}"
        )
    chars = max(1, int(targets.sum(-1).max().round()))  # 1 (one-hot) or 5 (string)
    if targets.shape[-1] % chars:
        raise ValueError(f"labels of {targets.shape[-1]} units do not split into {chars} parts")
    shape = (*targets.shape[:-1], chars, targets.shape[-1] // chars)
    right = (logits.reshape(shape).argmax(-1) == targets.reshape(shape).argmax(-1)).all(-1)
    number = instance_numbers(targets, batch_first)
    result = {}
    for k in instances:
        at_k = number == k
        result[k] = float(right[at_k].float().mean()) if at_k.any() else math.nan
    return result
