"""Training configurations: one dataclass and its checks.

A run is fully described by a `TrainConfig`; it is printed at the start of a run and saved with
every checkpoint, so evaluation needs nothing else. The presets are in `torch_ntm.presets`, the
``--set key=value`` parser in `torch_ntm.overrides`. The model's keys are the fields of its own
options dataclass (`torch_ntm.model.NTMOptions`, `torch_ntm.mann.MANNOptions`,
`torch_ntm.dnc.DNCOptions`, `torch_ntm.registry.LSTMOptions`), nested in the config as
``model_params`` and set by their names: ``--set memory_size=64``; so are the keys of its
sections, `Optimiser`, `Stabilisation` and `Evaluation` (``--set lr=3e-4``). The task's
parameters are the task's own dataclass in `torch_ntm.tasks`, nested likewise and set with dotted
keys: ``--set task.max_length=30``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from dataclasses import dataclass, field
from types import MappingProxyType

from torch_ntm.dnc import DNCOptions
from torch_ntm.engines import ENGINES, LEGACY_ENGINES
from torch_ntm.mann import MANNOptions
from torch_ntm.model import NTMOptions
from torch_ntm.registry import MODELS, LSTMOptions
from torch_ntm.tasks import TASKS, Task, make_task

__all__ = [
    "TrainConfig", "Optimiser", "Stabilisation", "Evaluation", "SECTIONS", "ConfigError",
    "resolve_device", "check_memory_size", "check_steps",
    "check_data_size", "check_set_size", "check_state_size", "MAX_DATA_BYTES", "MAX_PARAMETERS",
    "check_resume", "list_kind", "MODELS", "MODEL_DEFAULTS", "MODEL_KEYS", "OPTIMIZERS",
    "RESUMABLE", "differing_keys", "model_params", "KEY_TYPES", "MODEL_KEY_TYPES", "type_hints",
]

# The models a config can train (`torch_ntm.registry.MODELS`): an `NTM`, the paper's LSTM
# baseline, a `torch_ntm.mann.MANN` (LRUA memory, Santoro et al. 2016) or a `torch_ntm.dnc.DNC`.
# The config keys that shape each model (its options' fields): a key of another model's only
# is refused when set (`torch_ntm.overrides.apply_overrides`), rather than ignored and recorded.
MODEL_KEYS = {name: entry.config_keys() for name, entry in MODELS.items()}
_ANY_MODEL_KEY = frozenset().union(*MODEL_KEYS.values())
# A config's value of each model key where it gives none: the NTM's default for the keys the
# models share (a DNC configured on copy has the copy NTM's controller and memory, as the flat
# configs of earlier versions had), and each model's own default for its own keys.
MODEL_DEFAULTS = MappingProxyType({
    **{key: value for entry in MODELS.values()
       for key, value in dataclasses.asdict(entry.options()).items()},
    **dataclasses.asdict(NTMOptions())})


def model_params(model: str, values: dict | None = None) -> object:
    """The options of ``model`` (a name in `MODELS`) from config values by key: ``values``'
    own keys, `MODEL_DEFAULTS` for the rest (another model's keys are left out)."""
    return MODELS[model].params({**MODEL_DEFAULTS, **(values or {})})


OPTIMIZERS = ("rmsprop", "adam")  # the paper's, and Adam (`torch_ntm.train.make_optimizer`)


class ConfigError(ValueError):
    """A user's configuration mistake; the message names the key and the fix."""


@dataclass
class Optimiser:
    """How a run updates the weights: a `TrainConfig`'s ``optim``."""

    optimizer: str = "rmsprop"  # "rmsprop" (paper: momentum 0.9) or "adam"
    lr: float = 1e-4
    momentum: float = 0.9  # RMSProp momentum
    rmsprop_alpha: float = 0.95  # RMSProp decay of the squared-gradient average
    amsgrad: bool = False  # Adam: normalise by the running maximum of the squared-gradient average
    # Weight decay: with Adam, decoupled (AdamW: each step shrinks every weight by lr x this);
    # with RMSProp, torch's L2 term (this x the weight added to its gradient). 0 disables.
    weight_decay: float = 0.0
    # An exponential moving average of the weights (Polyak averaging): after every step,
    # average = ema_decay x average + (1 - ema_decay) x weights. Validation, the weights a run
    # keeps (its best) and so `ntm evaluate` use the average; training goes on from the weights
    # themselves. 0 disables.
    ema_decay: float = 0.0
    clip_value: float = 10.0  # clip each gradient element to [-v, v]; 0 disables
    clip_norm: float = 0.0  # clip the global gradient norm; 0 disables
    # Also clip the global norm at this multiple of the median of the last 100 steps' norms
    # (torch_ntm.stability.SpikeClip; docs/stability.md); 0 disables.
    clip_spikes: float = 0.0
    # A cap on the weights that chosen input channels feed (docs/results/, repeat copy's
    # count): after every update, each channel's column of the controller's first-layer input
    # weights (an LSTM baseline's first layer) is scaled down to norm input_max_norm where it
    # is above it. The channels are input_max_norm_channels (numbered from 0 as in the task's
    # layout; empty: all of the task's input channels). With input_max_norm_ramp, the cap starts
    # at those columns' largest norm after the first update and falls linearly to
    # input_max_norm over that many training sequences. 0 disables.
    input_max_norm: float = 0.0
    input_max_norm_channels: list[int] = field(default_factory=list)
    input_max_norm_ramp: int = 0


@dataclass
class Stabilisation:
    """What keeps a run's learning steady: a `TrainConfig`'s ``stabilise``."""

    # A stabiliser: once a validation first has <= lr_decay_bit_errors bit errors per sequence,
    # the learning rate is multiplied by lr_decay (once), so a solved task is fine-tuned gently
    # instead of being kicked out of its solution by full-size steps. <0 disables.
    lr_decay_bit_errors: float = -1.0
    lr_decay: float = 0.1
    # A stabiliser: once a validation has no wrong bit, a later validation with more than
    # rollback_bit_errors wrong bits per sequence restores the weights and optimizer state of the
    # best validation and multiplies the learning rate by lr_decay. A converged model that falls
    # apart is caught and put back. <0 disables.
    rollback_bit_errors: float = -1.0
    # A step schedule: the learning rate is multiplied by lr_decay as training passes each of
    # these numbers of sequences (in increasing order), for tasks without a solved state to
    # decay at (n-grams, priority sort). Empty: none.
    lr_milestones: list[int] = field(default_factory=list)
    # A curriculum: train first on sizes up to curriculum_start (the task's main size knob:
    # copy length, recall items; `Task.up_to`), and go up one size each time the training rows'
    # bit errors per sequence (over log_every steps) fall to curriculum_bit_errors or below,
    # until the task's own sizes. Validation and stopping use the task's own distribution
    # throughout. 0 disables.
    curriculum_start: int = 0
    curriculum_bit_errors: float = 0.5
    # Several starts (random restarts): train `starts` models, from seeds seed + 1,000,000 k
    # (mod 2**64; k = 0 .. starts - 1: the first from seed itself), start_sequences sequences each,
    # in RUN/starts/K, then go on with the one whose last validation is best (as a run ranks its
    # own) to max_sequences. For a task whose runs leave a plateau at a time that is a draw
    # (n-grams: docs/results/ngrams.md); the other starts' sequences come on top of
    # max_sequences. 1: one start.
    starts: int = 1
    start_sequences: int = 0


@dataclass
class Evaluation:
    """How a run validates, keeps weights and stops: a `TrainConfig`'s ``evaluation``."""

    eval_every: int = 500  # optimizer steps between validations and checkpoints
    eval_sequences: int = 256  # fixed validation set drawn from the training distribution
    # Generalisation: task sizes beyond training (copy: lengths) validated too, with
    # eval_size_sequences fixed sequences each, once the training distribution has no wrong bit.
    # Stopping needs them clean too, and the run keeps the weights that did best on all of them.
    eval_sizes: list[int] = field(default_factory=list)
    # Tasks with a repeat count (repeat copy): the same validations at these counts, with the
    # task's longest training length (logged as val@rR, ranked and stopping with eval_sizes'):
    # eval_sizes varies the length only, and draws the count from the training range.
    eval_repeats: list[int] = field(default_factory=list)
    # Tasks with a repeat count: the same validations at (length, count) pairs, given as
    # LENGTHxCOUNT, comma-separated (e.g. "20x10"; logged as val@20r10), ranked and stopping with
    # eval_sizes'.
    eval_pairs: str = ""
    eval_size_sequences: int = 100
    # Which validation's weights a run keeps. After the fewest wrong bits in the training
    # distribution: by default the fewest summed over the generalisation sets above; keep_by
    # ranks by one set's metric instead, as SET:METRIC with SET as logged without "val@" (e.g.
    # "r20:data_bit_errors", repeat copy's wrong data bits at 20 repeats). keep_perfect_above,
    # SET:FRACTION, ranks the validations with more than FRACTION of that set's sequences
    # perfect first, the others after them by how far short they fall (e.g. "20r10:0.95": more
    # than 190 of 200). Empty: none.
    keep_by: str = ""
    keep_perfect_above: str = ""
    # Rows of memory for those validations and for the generalisation tables of `ntm train` and
    # `ntm evaluate` (no parameter depends on it); 0: memory_size. A copy of 120 items needs more
    # room than the 128 rows it trains with (a model perfect at 120 with 256 rows got 14 of 100
    # right with 128: docs/stability.md).
    eval_memory_size: int = 0
    stop_bit_errors: float = -1.0  # stop when validation bit errors/sequence <= this; <0: never
    # Validations that must meet it (with eval_sizes: there too), with none in between over
    # it in the training distribution (one over it only at eval_sizes neither counts nor resets)
    patience_evals: int = 1


@dataclass
class TrainConfig:
    """Everything that defines a training run.

    ``model`` names the model (`torch_ntm.registry.MODELS`): ``"ntm"`` an `NTM`, ``"lstm"`` the
    paper's LSTM baseline (``controller_size`` units x ``controller_layers`` layers), ``"mann"``
    a `torch_ntm.mann.MANN` and ``"dnc"`` a `torch_ntm.dnc.DNC`; ``model_params`` is its options
    dataclass. The optimiser, the stabilisers and the validation are sections of their own
    (``optim``, ``stabilise``, ``evaluation``). Every key of the options and sections is a config
    key of its own name (``--set memory_size=64 --set lr=3e-4``): `replaced` sets and `value`
    reads one so.
    """

    task: str = "copy"  # a name in `torch_ntm.tasks.TASKS`
    # The task's parameters: an instance of the task's dataclass (`CopyTask` for "copy", ...),
    # set as task.KEY. A dict of parameters (as config.json holds them) is turned into one.
    task_params: Task | dict = field(default_factory=dict)
    preset: str = "ntm-lstm"
    model: str = "ntm"  # one of MODELS: "ntm", "lstm" (baseline), "mann" or "dnc"
    # The model's options: `NTMOptions`, `LSTMOptions`, `MANNOptions` or `DNCOptions`, as
    # ``model``. A dict of them (as config.json holds it) is turned into one, the keys it lacks
    # from `MODEL_DEFAULTS`.
    model_params: NTMOptions | LSTMOptions | MANNOptions | DNCOptions | dict = field(
        default_factory=dict)
    # The model's engine (`torch_ntm.engines`): "auto" (the fastest that can serve the call),
    # "native", "graphs" or "eager"; the same function on each. The LSTM baseline ignores it.
    engine: str = "auto"
    # How the weights are updated, how they are kept steady, and how runs are validated,
    # kept and stopped: `Optimiser`, `Stabilisation`, `Evaluation` (their keys are set by their
    # own names: ``--set lr=3e-4``).
    optim: Optimiser = field(default_factory=Optimiser)
    stabilise: Stabilisation = field(default_factory=Stabilisation)
    evaluation: Evaluation = field(default_factory=Evaluation)
    # Budget.
    max_sequences: int = 2_000_000
    # Wall-clock budget of training, checked between steps (so a first step that compiles, as
    # the compiled engine's do for a minute or two, runs past a smaller one); 0 means none.
    max_seconds: float = 0.0
    # Start from trained weights instead of fresh ones (to fine-tune): a run directory or
    # checkpoint file (its kept weights, those `ntm evaluate` uses), or `pretrained:NAME` (a
    # shipped model). Its model configuration must be this one's. Optimizer state, counters
    # and the average start afresh. Empty: fresh weights.
    init_from: str = ""
    # A second stage that the same run trains: a fine-tune from this stage's kept weights, given
    # as KEY=VALUE settings separated by spaces (each as --set takes it), changed from this
    # config. The first stage trains without them in RUN/stages/0, then the fine-tune, from
    # the weights that stage kept (as init_from takes them), in RUN itself; its checkpoint is
    # the run's. It keeps the model's weights' shapes. Empty: one stage.
    finetune: str = ""
    batch_size: int = 1
    # Housekeeping.
    seed: int = 0
    threads: int = 1  # torch intra-op threads; 2 win only at batch >= 64 on an idle 2-core CPU
    log_every: int = 50  # optimizer steps between CSV/TensorBoard rows
    device: str = "cpu"

    def __post_init__(self) -> None:
        if isinstance(self.task_params, dict) and isinstance(self.task, str):  # else: `check`
            self.task_params = make_task(self.task, **self.task_params)
        if isinstance(self.model_params, dict) and self.model in MODELS:  # else: `check`
            self.model_params = model_params(self.model, self.model_params)

    def replaced(self, **values) -> TrainConfig:
        """This config with ``values`` by key as ``--set`` names them (not checked): its fields,
        its sections' keys (``lr=3e-4``) and the model's options (``memory_size=64``); with a
        new ``model``, options of that model, keeping the values of the keys the two share."""
        options = {key: values.pop(key) for key in list(values) if key in _ANY_MODEL_KEY}
        model = values.get("model", self.model)
        if (options or model != self.model) and model in MODELS:  # else: `check` says so
            values["model_params"] = model_params(
                model, {**dataclasses.asdict(self.model_params), **options})
        for name in SECTIONS:
            changed = {key: values.pop(key) for key in list(values) if SECTION_OF.get(key) == name}
            if changed:
                values[name] = dataclasses.replace(getattr(self, name), **changed)
        return dataclasses.replace(self, **values)

    def value(self, key: str):
        """The value of config key ``key`` as ``--set`` names it: a field, a key of a section
        (``lr``), one of the model's options (``memory_size``) or of the task's parameters
        (``task.max_length``)."""
        if key in MODEL_KEYS.get(self.model, ()):
            return getattr(self.model_params, key)
        if key.startswith("task."):
            return getattr(self.task_params, key.removeprefix("task."))
        if key in SECTION_OF:
            return getattr(getattr(self, SECTION_OF[key]), key)
        return getattr(self, key)

    def _meta_model(self, memory_size: int):
        """The model this config describes with ``memory_size`` rows, on the meta device (its
        shapes, no memory); None for a model without memory (the LSTM baseline)."""
        entry = MODELS[self.model]
        if not entry.memory:
            return None
        task = self.task_params
        return entry.cls(task.input_size, task.output_size, device="meta",
                         **{**entry.arguments(self), "memory_size": memory_size})

    def to_dict(self) -> dict:
        """The config as config.json holds it: its keys, its sections (``optim``, ``stabilise``,
        ``evaluation``), the model's options (``model_params``, all of them; None as null) and
        the task's parameters that differ from their defaults (``task_params``)."""
        data = dataclasses.asdict(self)
        task, default = self.task_params, type(self.task_params)()
        data["task_params"] = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)
                               if getattr(task, f.name) != getattr(default, f.name)}
        return data

    def eval_overrides(self) -> dict:
        """What `build_model` changes for generalisation: the rows of ``eval_memory_size``."""
        rows = self.evaluation.eval_memory_size
        wider = rows and MODELS[self.model].memory  # the LSTM has no rows
        return {"memory_size": rows} if wider else {}

    def eval_pair_values(self) -> list[tuple[int, int]]:
        """``eval_pairs`` as (length, count) pairs (`check` has checked its form)."""
        return [_pair(item) for item in self.evaluation.eval_pairs.split(",") if item.strip()]

    def generalisation_sets(self) -> dict:
        """The generalisation validation sets, by their name in ``metrics.csv`` without
        ``val@``: the validation task (`Task.validation`) at each of ``eval_sizes`` ("SIZE"), at
        the longest training
        length with each of ``eval_repeats`` ("rR"), and at each of ``eval_pairs`` ("LrR")."""
        return {name: task for name, _, _, task in self._generalisation()}

    def _generalisation(self, source: str = "config") -> list[tuple[str, str, int, Task]]:
        """`generalisation_sets` with the setting that asks for each (``eval_sizes=20``) and
        its size: (name, setting, size, task). A size the task has not is a `ConfigError`
        naming the setting."""
        valid, longest = self.task_params.validation(), self.task_params.train_size
        wanted = [
            *((str(size), f"eval_sizes={size}", size, lambda s=size: valid.with_size(s))
              for size in self.evaluation.eval_sizes),
            *((f"r{r}", f"eval_repeats={r}", longest,
               lambda r=r: valid.with_size(longest).with_repeats(r))
              for r in self.evaluation.eval_repeats),
            *((f"{length}r{r}", f"eval_pairs={length}x{r}", length,
               lambda n=length, r=r: valid.with_size(n).with_repeats(r))
              for length, r in self.eval_pair_values())]
        sets = []
        for name, setting, size, make in wanted:
            try:
                sets.append((name, setting, size, make()))
            except ValueError as e:
                raise ConfigError(f"{source}: {setting}: {self.task} has no sequences of that "
                                  f"size ({e}); choose another or leave "
                                  f"{setting.partition('=')[0]} empty") from None
        return sets

    def keep_by_set(self) -> tuple[str, str] | None:
        """``keep_by`` as (set, metric), or None."""
        return tuple(self.evaluation.keep_by.split(":")) if self.evaluation.keep_by else None

    def keep_perfect_floor(self) -> tuple[str, float] | None:
        """``keep_perfect_above`` as (set, fraction), or None."""
        if not self.evaluation.keep_perfect_above:
            return None
        name, _, fraction = self.evaluation.keep_perfect_above.partition(":")
        return name, float(fraction)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict, source: str = "config") -> "TrainConfig":
        """The config that `to_dict` gave, checked. The model's keys may stand at the top level
        too (the flat config.json of earlier versions, a preset's keys): those of the config's
        model go into its ``model_params``; those of the other models only, which such a file
        holds for every model, are left out."""
        data = dict(data)
        model = data.get("model", TrainConfig.model)
        if model in MODELS:  # else: `check` names the model key
            data["model_params"] = _gather(data, "model_params", MODEL_KEYS[model], source,
                                           f" for model={model}")
        for key in _ANY_MODEL_KEY & set(data):  # another model's, as a flat file holds them
            del data[key]
        for name, kind in SECTIONS.items():
            data[name] = kind(**_gather(data, name, _SECTION_KEYS[name], source))
        valid = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - valid)
        if unknown:
            raise ConfigError(
                f"{source}: unknown key(s) {', '.join(unknown)}; "
                f"valid keys: "
                f"{', '.join(sorted(valid - set(SECTIONS) | set(SECTION_OF) | _ANY_MODEL_KEY))}"
            )
        if data.get("engine") in LEGACY_ENGINES:  # a config of an earlier version
            data = {**data, "engine": "auto"}
        try:
            config = cls(**data)
        except (TypeError, ValueError) as e:  # the task or model rejects its name or parameters
            raise ConfigError(f"{source}: {e}") from None
        config.check(source)
        return config

    def check(self, source: str = "config") -> None:
        """Raise `ConfigError` naming the first key whose value has the wrong type, is out of
        range, or is not one of the key's choices."""
        hints = type_hints(TrainConfig)
        for f in dataclasses.fields(self):
            if f.name in SECTIONS:
                self._check_nested(f.name, SECTIONS[f.name], source)
            elif f.name not in ("task_params", "model_params"):  # checked below
                _check_type(f.name, getattr(self, f.name), hints[f.name], source)
        if type(self.task_params) is not TASKS.get(self.task):
            raise ConfigError(f"{source}: task_params must be the parameters of task "
                              f"{self.task!r}, got {self.task_params!r}")
        self.check_choices(source)
        self._check_nested("model_params", MODELS[self.model].options, source,
                           f"the options of model {self.model!r}")
        for key, (test, wanted) in _RANGES.items():
            value = self.value(key)
            if not test(value):
                raise ConfigError(f"{source}: {key}={value!r} is out of range; it must be {wanted}")
        try:  # the options of the model it builds (a DNC has no shift_range to fit its rows)
            self.model_params.checked()
        except ValueError as e:
            raise ConfigError(f"the model cannot be built from this config: {e}") from None
        for what, kind in (("held_out", "held-out data (evaluation)"),
                           ("validation", "validation data")):
            try:
                other = getattr(self.task_params, what)()
            except ValueError as e:
                raise ConfigError(f"{source}: the task's {kind} cannot be drawn: {e}") from None
            if (other.input_size, other.output_size) != (self.task_params.input_size,
                                                         self.task_params.output_size):
                raise ConfigError(f"{source}: the task's {kind} has other input or output "
                                  f"widths than its training data")
        for key in ("eval_repeats", "eval_pairs"):
            if self.value(key) and not hasattr(self.task_params, "with_repeats"):
                raise ConfigError(f"{source}: {key} applies to a task with a repeat count "
                                  f"(repeat_copy), not {self.task}; use eval_sizes, or leave "
                                  f"it empty")
        self._check_pairs_and_keeping(source)
        self._check_input_max_norm(source)
        if MODELS[self.model].memory:
            self._check_memory(source)
        check_sequence_steps(self, source)
        check_data_size(self, source)
        drawable = getattr(self.task_params, "check_drawable", None)
        if drawable is not None:  # a task whose sequences may be too rare to draw
            try:
                drawable()
            except ValueError as e:
                raise ConfigError(f"{source}: {e}") from None
        stab = self.stabilise
        if stab.starts > 1 and not 0 < stab.start_sequences < self.max_sequences:
            raise ConfigError(f"{source}: starts={stab.starts} needs start_sequences, each "
                              f"start's budget, above 0 and below max_sequences "
                              f"({self.max_sequences}); got {stab.start_sequences}")
        self._check_finetune(source)
        milestones = self.stabilise.lr_milestones
        if any(a >= b for a, b in zip(milestones, milestones[1:])):
            raise ConfigError(f"{source}: lr_milestones={milestones} must increase "
                              f"(numbers of training sequences, e.g. 400000,600000)")
        if self.stabilise.curriculum_start:
            task, start = self.task_params, self.stabilise.curriculum_start
            if start > task.train_size:
                raise ConfigError(f"{source}: curriculum_start={start} is above the task's own "
                                  f"{task.size_name} ({task.train_size}); set it lower, or 0 "
                                  f"for none")
            try:
                task.up_to(start)
            except ValueError as e:
                raise ConfigError(f"{source}: curriculum_start={start} is not a size of this "
                                  f"task: {e}") from None

    def finetune_settings(self) -> list[str]:
        """``finetune`` as its KEY=VALUE settings (`check` has checked their form)."""
        return self.finetune.split()

    def _check_finetune(self, source: str) -> None:
        """The form of ``finetune``: KEY=VALUE settings; none of them a second ``finetune`` or
        an ``init_from`` (the fine-tune starts from the first stage). Their keys and values are
        checked with the fine-tune's config (`torch_ntm.overrides.finetune_config`)."""
        for item in self.finetune_settings():
            key, sep, _ = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"{source}: finetune={self.finetune!r}: {item!r} is not "
                                  f"KEY=VALUE; give the fine-tune's settings as KEY=VALUE "
                                  f"separated by spaces, or leave finetune empty")
            if key in ("finetune", "init_from"):
                raise ConfigError(f"{source}: finetune sets {key}: a fine-tune starts from the "
                                  f"run's first stage, and has no stage after it; drop {item}")

    def _check_nested(self, name: str, kind: type, source: str, what: str = "") -> None:
        """That field ``name`` (a section, the model's options) is a ``kind``, ``what`` it
        must be, and the type of each of its keys."""
        nested = getattr(self, name)
        if type(nested) is not kind:
            raise ConfigError(f"{source}: {name} must be {what + ' (' if what else ''}"
                              f"{kind.__name__}{')' if what else ''}, got {nested!r}")
        hints = type_hints(kind)
        for f in dataclasses.fields(kind):
            _check_type(f.name, getattr(nested, f.name), hints[f.name], source)

    def _check_memory(self, source: str) -> None:
        """The memory's size, and the model's state, at ``memory_size`` and
        ``eval_memory_size`` rows: built on the meta device (its sizes, no memory), before any
        run folder."""
        params = self.model_params
        check_memory_size(params.memory_size, params.memory_width, self.batch_size, source)
        check_memory_size(self.evaluation.eval_memory_size, params.memory_width, 64, source,
                          key="eval_memory_size")
        for rows, key in ((params.memory_size, "memory_size"),
                          (self.evaluation.eval_memory_size, "eval_memory_size")):
            if rows:
                try:
                    model = self._meta_model(rows)
                except ValueError as e:  # e.g. one sequence's state too large, an encoder
                    where = "" if key == "memory_size" else f" with {key}={rows}"
                    raise ConfigError(f"{source}: the model cannot be built from this "
                                      f"config{where}: {e}") from None
                check_state_size(model, self.batch_size, source, key)

    def _check_pairs_and_keeping(self, source: str) -> None:
        """The forms of ``eval_pairs``, ``keep_by`` and ``keep_perfect_above``, and that the
        sets these two name are validated."""
        for item in self.evaluation.eval_pairs.split(","):
            if item.strip() and _pair(item) is None:
                raise ConfigError(f"{source}: eval_pairs={self.evaluation.eval_pairs!r}: "
                                  f"{item.strip()!r} is not LENGTHxCOUNT with two integers >= 1 "
                                  f"(e.g. 20x10)")
        if not (self.evaluation.keep_by or self.evaluation.keep_perfect_above):
            return
        names = list(self.generalisation_sets())
        metrics = ("bit_errors", "cost_bits", *self.task_params.extra_metrics)
        for key, form, example in (("keep_by", "SET:METRIC", "r20:data_bit_errors"),
                                   ("keep_perfect_above", "SET:FRACTION", "20r10:0.95")):
            value = self.value(key)
            if not value:
                continue
            name, sep, second = value.partition(":")
            if not sep or name not in names:
                listed = ", ".join(names) or "none (set eval_sizes, eval_repeats or eval_pairs)"
                raise ConfigError(f"{source}: {key}={value!r} must be {form} (e.g. {example}) "
                                  f"with SET one of the generalisation sets: {listed}")
            if key == "keep_by" and second not in metrics:
                raise ConfigError(f"{source}: keep_by={value!r}: {second!r} is not a metric of "
                                  f"{self.task}; valid metrics: {', '.join(metrics)}")
            if key == "keep_perfect_above":
                try:
                    fraction = float(second)
                except ValueError:
                    fraction = math.nan
                if not 0 <= fraction < 1:
                    raise ConfigError(f"{source}: keep_perfect_above={value!r}: the fraction "
                                      f"must be a number in [0, 1)")

    def _check_input_max_norm(self, source: str) -> None:
        width = self.task_params.input_size
        wrong = [c for c in self.optim.input_max_norm_channels if c >= width]
        if wrong:
            raise ConfigError(f"{source}: input_max_norm_channels="
                              f"{self.optim.input_max_norm_channels}: {self.task} has input "
                              f"channels 0 to {width - 1}")
        optim = self.optim
        if not optim.input_max_norm and (optim.input_max_norm_channels
                                         or optim.input_max_norm_ramp):
            raise ConfigError(f"{source}: input_max_norm_channels and input_max_norm_ramp act "
                              f"only with a cap: set input_max_norm (> 0)")

    def check_choices(self, source: str = "config") -> None:
        """Raise `ConfigError` if a key with a fixed set of values holds another one."""
        for key, valid in _CHOICES.items():
            value = self.value(key)
            if value not in valid:
                raise ConfigError(
                    f"{source}: {key}={value!r} is not valid; valid choices: {', '.join(valid)}"
                )


# The config's sections, by field, and the section of each of their keys.
SECTIONS = {"optim": Optimiser, "stabilise": Stabilisation, "evaluation": Evaluation}
_SECTION_KEYS = {name: frozenset(f.name for f in dataclasses.fields(section))
                 for name, section in SECTIONS.items()}
SECTION_OF = MappingProxyType({key: name for name, keys in _SECTION_KEYS.items()
                               for key in keys})


@functools.cache
def type_hints(kind: type) -> dict:
    """The type of each field of dataclass ``kind`` (`typing.get_type_hints`, read once)."""
    return typing.get_type_hints(kind)


# The type of each key a config holds in a model's options (every model's: for a key that
# several models have, the last one's) or in a section, by the name `--set` gives it.
MODEL_KEY_TYPES = MappingProxyType({key: hint for entry in MODELS.values()
                                    for key, hint in type_hints(entry.options).items()})
KEY_TYPES = MappingProxyType({**MODEL_KEY_TYPES, **{
    key: hint for section in SECTIONS.values() for key, hint in type_hints(section).items()}})


def _gather(data: dict, name: str, keys: frozenset, source: str, whose: str = "") -> dict:
    """The keys of ``data[name]`` (a section, the model's options, as config.json nests them)
    and those of ``keys`` at the top level of ``data`` (as earlier, flat versions wrote them),
    which it takes out of ``data``; a `ConfigError` for a ``data[name]`` that is not a dict of
    ``keys``."""
    given = data.get(name, {})
    if not isinstance(given, dict):
        raise ConfigError(f"{source}: {name} must hold keys, got {given!r}")
    unknown = sorted(set(given) - keys)
    if unknown:
        raise ConfigError(f"{source}: {name}: unknown key(s) {', '.join(unknown)}{whose}; "
                          f"valid keys: {', '.join(sorted(keys))}")
    return {**{key: data.pop(key) for key in keys & set(data)}, **given}


def _finite(lo: float, hi: float = math.inf, lo_open=False, hi_open=False):
    """A test for a finite float in the interval from ``lo`` to ``hi``."""
    def test(value) -> bool:
        return (math.isfinite(value) and (lo < value if lo_open else lo <= value)
                and (value < hi if hi_open else value <= hi))
    return test


_AT_LEAST_1 = (lambda v: v >= 1, "an integer >= 1")
# The range of every number in a config but the model's (`NTMOptions.checked` checks those);
# a value outside is a mistake, caught before training.
_RANGES = {
    **{key: _AT_LEAST_1 for key in (
        "batch_size", "max_sequences", "eval_every", "eval_sequences", "patience_evals",
        "threads", "log_every")},
    "seed": (lambda v: 0 <= v < 2**64, "an integer from 0 to 2**64 - 1"),
    "lr": (_finite(0, lo_open=True), "a finite number > 0"),
    "momentum": (_finite(0, 1, hi_open=True), "a number in [0, 1)"),
    "rmsprop_alpha": (_finite(0, 1, hi_open=True), "a number in [0, 1)"),
    "clip_value": (_finite(0), "a finite number >= 0 (0 disables)"),
    "weight_decay": (_finite(0), "a finite number >= 0 (0 disables)"),
    "ema_decay": (_finite(0, 1, hi_open=True), "a number in [0, 1) (0 disables)"),
    "clip_norm": (_finite(0), "a finite number >= 0 (0 disables)"),
    "lr_decay": (_finite(0, 1, lo_open=True), "a number in (0, 1]"),
    "max_seconds": (_finite(0), "a finite number >= 0 (0 means no limit)"),
    "eval_size_sequences": _AT_LEAST_1,
    "eval_memory_size": (lambda v: v >= 0, "an integer >= 0 (0: memory_size)"),
    "clip_spikes": (lambda v: v == 0 or _finite(1)(v), "0 (off) or a finite number >= 1"),
    "curriculum_start": (lambda v: v >= 0, "an integer >= 0 (0 disables)"),
    "starts": (lambda v: 1 <= v <= 100, "an integer from 1 to 100"),
    "start_sequences": (lambda v: v >= 0, "an integer >= 0"),
    "curriculum_bit_errors": (_finite(0), "a finite number >= 0"),
    "input_max_norm": (_finite(0), "a finite number >= 0 (0 disables)"),
    "input_max_norm_ramp": (lambda v: v >= 0, "an integer >= 0 (0: the cap at once)"),
    **{key: (_finite(-math.inf), "a finite number (< 0 disables)")
       for key in ("lr_decay_bit_errors", "rollback_bit_errors", "stop_bit_errors")},
}
# One batch of memory matrices (float32) above this is a typo, not a plan: the run would only
# fail later for lack of memory (validation and evaluation use batches of at least 64).
MAX_MEMORY_BYTES = 4 << 30


# A training or validation sequence longer than this is a typo, not a plan: an NTM runs its
# controller and every head once per step, so a batch of such sequences takes minutes on a CPU
# before training says anything.
MAX_SEQUENCE_STEPS = 10_000


def check_sequence_steps(config: TrainConfig, source: str = "config") -> None:
    """Raise `ConfigError` if the task's longest training sequence, or one at ``eval_sizes``,
    ``eval_repeats`` or ``eval_pairs``, has more than `MAX_SEQUENCE_STEPS` time steps."""
    task = config.task_params
    training = ("", "training", task.train_size, task.with_size(task.train_size))
    for _, what, size, each in (training, *config._generalisation(source)):
        key = what.partition("=")[0]
        check_steps(each, size, f"{source}: a {config.task} sequence of {task.size_name} {size} "
                    f"({what})", f"lower {size_keys(task)}" + (
                        f" or the {key}" if key != "training" else ""))


# The same for `ntm evaluate`, which runs no backward and keeps no step's state for one: ten
# times as long, beyond what any of the paper's tests asks (copy at L = 120).
MAX_EVAL_STEPS = 100_000


def check_steps(task, size: int, what: str, fix: str, limit: int = MAX_SEQUENCE_STEPS) -> None:
    """Raise `ConfigError` (``what`` takes N steps, more than ``limit``: ``fix``) if the longest
    sequence of ``task`` (at ``size``) has more steps than ``limit``. A sequence has at least as
    many steps as its size and its repeat count, so a larger one is refused before a sequence
    is drawn (one of a billion steps would not fit in memory)."""
    knows = getattr(task, "max_steps", None) is not None  # its longest sequence, undrawn
    least = max(size, getattr(task, "max_repeats", 0))
    if not knows and least > limit:
        steps = f"at least {least:,}"
    else:
        count = _steps(task)
        if count <= limit:
            return
        steps = f"up to {count:,}" if knows else f"{count:,}"
    raise ConfigError(f"{what} takes {steps} steps, more than {limit:,}: {fix}")


def _steps(task) -> int:
    """The time steps of the longest sequence of ``task``: its ``max_steps`` where it knows it
    from its parameters (a graph task, whose sequences differ in length), else those of one
    drawn (the others' sequences at a size all take as many)."""
    bound = getattr(task, "max_steps", None)
    if bound is not None:
        return bound
    import torch

    return task.sample(1, torch.Generator().manual_seed(0)).inputs.shape[0]


def size_keys(task) -> str:
    """The task keys that set its sequences' length, for an error's fix."""
    if hasattr(task, "max_path"):
        return "task.max_nodes or task.max_path"
    if task.size_range is not None:
        return f"task.{task.size_range[1]}"
    return "the task's size"


# The sequences held in memory at once (a training batch, the validation set, a generalisation
# set: float32 inputs, targets and mask) above this are a typo, not a plan: the run would only
# fail later for lack of memory.
MAX_DATA_BYTES = 2 << 30
# A model with more parameters than this is a typo (1 GiB of float32; training holds about four
# times that with gradients and optimizer state). `torch_ntm.factories.build_model` checks it.
MAX_PARAMETERS = 1 << 28


def check_data_size(config: TrainConfig, source: str = "config") -> None:
    """Raise `ConfigError` naming the count key (``batch_size``, ``eval_sequences``,
    ``eval_size_sequences``) if its sequences would take more than `MAX_DATA_BYTES`."""
    task = config.task_params
    sets = [("a training batch", "batch_size", task.with_size(task.train_size)),
            ("the validation set", "eval_sequences", task.validation().with_size(task.train_size)),
            *((f"the validation set of {what}", "eval_size_sequences", each)
              for _, what, _, each in config._generalisation(source))]
    for what, key, each in sets:
        check_set_size(each, config.value(key), f"{source}: {what}", f"{key}=")


def check_set_size(task, count: int, what: str, key: str) -> None:
    """Raise `ConfigError` if ``count`` sequences of ``task`` (held in memory at once, as a
    validation or evaluation set is) would take more than `MAX_DATA_BYTES`; ``what`` names the
    set and ``key`` the setting that gives ``count`` (``"eval_sequences="``, ``"--sequences "``)."""
    steps, width = _steps(task), task.input_size + task.output_size
    need = count * steps * (width + 1) * 4  # float32 inputs, targets and the mask
    if need > MAX_DATA_BYTES:
        raise ConfigError(f"{what} ({key}{count:,} sequences of {steps:,} steps x {width:,} "
                          f"channels) needs {need / 2**30:.3g} GiB, more than the limit of "
                          f"{MAX_DATA_BYTES / 2**30:g} GiB: lower {key.strip(' =')}, or the "
                          f"task's size or width")


def check_memory_size(memory_size: int, memory_width: int, batch_size: int = 1,
                      source: str = "config", key: str = "memory_size") -> None:
    """Raise `ConfigError` if a batch's memory (at least 64 sequences) would exceed
    `MAX_MEMORY_BYTES`."""
    need = max(batch_size, 64) * memory_size * memory_width * 4
    if need > MAX_MEMORY_BYTES:
        raise ConfigError(
            f"{source}: {key}={memory_size} x memory_width={memory_width} needs "
            f"{need / 2**30:.3g} GiB per batch of {max(batch_size, 64)} sequences; the limit is "
            f"{MAX_MEMORY_BYTES / 2**30:g} GiB"
        )


def check_state_size(model, batch_size: int = 1, source: str = "config",
                     key: str = "memory_size") -> None:
    """Raise `ConfigError` if the state of a batch (at least 64 sequences, as validation and
    evaluation run) of the memory ``model`` (its shape table, ``_state_shapes``: memory, and for
    a DNC the N x N link matrices of each write head) would exceed `MAX_MEMORY_BYTES` in
    float32; ``key`` names the setting to lower. A model without memory passes."""
    shapes = getattr(model, "_state_shapes", None)
    if shapes is None:
        return
    batch = max(batch_size, 64)
    parts = {name: math.prod(shape) * 4 for name, shape in shapes(batch).items()}
    need = sum(parts.values())
    if need > MAX_MEMORY_BYTES:
        largest = max(parts, key=parts.get)
        shape = " x ".join(str(n) for n in shapes(batch)[largest])
        lower = [key, "memory_width"] if largest != "link" else [key, "write_heads"]
        raise ConfigError(
            f"{source}: a {type(model).__name__} state of {need / 2**30:.3g} GiB per batch of "
            f"{batch} sequences ({largest} {shape} the largest, with {key}={model.memory_size}"
            + (f" and write_heads={model.write_heads}: the link matrices grow with the square "
               f"of the rows" if largest == "link" else "")
            + f") is more than the limit of {MAX_MEMORY_BYTES / 2**30:g} GiB: lower "
            f"{' or '.join(lower)}")


# The keys with a fixed set of values but the model's (`NTMOptions.checked` checks those).
_CHOICES = {"model": MODELS, "engine": ENGINES, "optimizer": OPTIMIZERS}


# Keys that do not change the model or the data, so a run may be resumed with new values; an lr
# given replaces the optimizer's current rate and the kept best's (to fine-tune a run at a lower
# one; `train`'s new_lr says when, `ntm train --resume --set lr=` always), milestones not
# yet passed apply from the resumed step on, and an ema_decay given to a run without one starts
# the average from the resumed weights.
RESUMABLE = frozenset({"max_sequences", "max_seconds", "eval_every", "log_every",
                       "stop_bit_errors", "patience_evals", "threads", "device", "lr",
                       "lr_milestones", "ema_decay"})


def differing_keys(a: TrainConfig, b: TrainConfig) -> list[str]:
    """The keys in which ``a`` and ``b`` differ, as ``--set`` names them: the sections' keys
    and the model's options by their names (the options where the two have one model), the
    task's as ``task.KEY`` (``task_params`` itself only where the two configs have different
    tasks)."""
    keys = [f.name for f in dataclasses.fields(a)
            if f.name not in ("task_params", "model_params", *SECTIONS)
            and getattr(a, f.name) != getattr(b, f.name)]
    keys += [key for key in SECTION_OF if a.value(key) != b.value(key)]
    if type(a.model_params) is type(b.model_params):
        keys += [f.name for f in dataclasses.fields(a.model_params)
                 if getattr(a.model_params, f.name) != getattr(b.model_params, f.name)]
    if type(a.task_params) is not type(b.task_params):
        return [*keys, "task_params"]
    return keys + [f"task.{f.name}" for f in dataclasses.fields(a.task_params)
                   if getattr(a.task_params, f.name) != getattr(b.task_params, f.name)]


def check_resume(saved: TrainConfig, config: TrainConfig) -> None:
    """Raise `ConfigError` naming the keys in which ``config`` differs from ``saved`` (the
    config of the run it would continue) outside `RESUMABLE`."""
    frozen = [key for key in differing_keys(config, saved) if key not in RESUMABLE]
    if frozen:
        raise ConfigError(f"--resume cannot change {', '.join(frozen)}; only "
                          f"{', '.join(sorted(RESUMABLE))} may be changed when resuming")


# Lists of numbers from 0 (channel indices); every other list holds positive integers.
_INDEX_LISTS = frozenset({"input_max_norm_channels"})


def list_kind(name: str) -> tuple[int, str]:
    """The least value of list key ``name`` (a `TrainConfig` field of type ``list[int]``), and
    what its values are called."""
    if name in _INDEX_LISTS:
        return 0, "integers >= 0"
    return 1, "positive integers"


def _pair(item: str) -> tuple[int, int] | None:
    """``"LxR"`` as (L, R), both >= 1; None if it is not of that form."""
    length, sep, count = item.strip().lower().partition("x")
    try:
        pair = int(length), int(count)
    except ValueError:
        return None
    return pair if sep and min(pair) >= 1 else None


def optional_type(expected):
    """The type ``T`` of an optional hint ``T | None``, or None for any other hint."""
    args = typing.get_args(expected)
    if typing.get_origin(expected) in (typing.Union, types.UnionType) and type(None) in args:
        others = [a for a in args if a is not type(None)]
        return others[0] if len(others) == 1 else None
    return None


def _check_type(name: str, value, expected, source: str) -> None:
    inner = optional_type(expected)
    if inner is not None:
        if value is None:  # an optional option's None
            return
        expected = inner
    if typing.get_origin(expected) is list:  # list[int]
        least, kind = list_kind(name)
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= least for v in value
        ):
            raise ConfigError(f"{source}: {name} must be a list of {kind}, got {value!r}")
        return
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return
    if expected is int and isinstance(value, bool):
        ok = False
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise ConfigError(
            f"{source}: {name} must be {expected.__name__}, got {value!r} ({type(value).__name__})"
        )


def resolve_device(name: str):
    """``torch.device(name)``, or a `ConfigError` if the name is invalid or the device absent."""
    import torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError) as e:
        raise ConfigError(f"device {name!r} is not a valid torch device ({e})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {name!r}: CUDA is not available on this machine; use cpu")
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"device {name!r}: only cpu and cuda are supported")
    if device.type == "cpu" and device.index not in (None, 0):
        raise ConfigError(f"device {name!r}: the CPU has no index {device.index}; use cpu")
    if device.type == "cuda" and device.index is not None:
        count = torch.cuda.device_count()
        if device.index >= count:
            raise ConfigError(f"device {name!r}: this machine has {count} CUDA device(s), "
                              f"cuda:0 to cuda:{count - 1}")
    return device
