"""The models a training configuration can name (``--set model=NAME``), one entry each.

Every place that turns a configuration into a model reads this table: the configuration's checks
and its meta-device model (`torch_ntm.config`), the keys refused for a model they do not shape
(`torch_ntm.overrides`), `torch_ntm.factories.build_model` and the bench. A new model is one
`ModelEntry` here (and, while the configuration is flat, its keys as fields of `TrainConfig`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from torch import nn

from torch_ntm.baseline import LSTMBaseline
from torch_ntm.checks import positive_int
from torch_ntm.dnc import DNC, DNCOptions
from torch_ntm.mann import MANN, MANNOptions
from torch_ntm.model import NTM, NTMOptions

__all__ = ["ModelEntry", "MODELS", "MEMORY_MODELS"]


@dataclass(frozen=True)
class ModelEntry:
    """A model a configuration builds, and which of its keys shape it.

    Attributes:
        name: its ``model=`` value.
        title: how messages name it (``"the LSTM baseline"``).
        cls: the module, built as ``cls(input_size, output_size, **arguments, device=...)``.
        options: its options dataclass (whose fields are configuration keys of the same name,
            checked by its ``checked()``), or None for a model without one.
        keys: for a model without ``options``, configuration key -> constructor argument.
        none_if_zero: keys where a configuration's 0 means the option's None (JSON configs and
            ``--set`` have numbers, not None: ``max_beta=0`` is the paper's unbounded strength).
        memory: whether it has memory rows (``memory_size`` and ``eval_memory_size`` apply).
    """

    name: str
    title: str
    cls: type[nn.Module]
    options: type | None = None
    keys: Mapping[str, str] = field(default_factory=dict)
    none_if_zero: frozenset[str] = frozenset()
    memory: bool = True

    def config_keys(self) -> frozenset[str]:
        """The configuration keys that shape this model."""
        if self.options is None:
            return frozenset(self.keys)
        return frozenset(f.name for f in dataclasses.fields(self.options))

    def options_of(self, config) -> object:
        """Its options dataclass, from a configuration's keys."""
        values = {f.name: getattr(config, f.name) for f in dataclasses.fields(self.options)}
        return self.options(**{**values,
                                **{k: values[k] or None for k in self.none_if_zero}})

    def arguments(self, config) -> dict:
        """Its constructor's keyword arguments (but the sizes and device) from a
        configuration."""
        if self.options is None:
            return {argument: getattr(config, key) for key, argument in self.keys.items()}
        return dataclasses.asdict(self.options_of(config))

    def check(self, config) -> None:
        """Raise `ValueError` if a configuration's keys cannot build this model."""
        if self.options is None:
            for key in self.keys:
                positive_int(key, getattr(config, key))
        else:
            self.options_of(config).checked()


MODELS: Mapping[str, ModelEntry] = MappingProxyType({entry.name: entry for entry in (
    ModelEntry("ntm", "the NTM", NTM, NTMOptions,
               none_if_zero=frozenset({"max_beta", "max_gamma"})),
    ModelEntry("lstm", "the LSTM baseline", LSTMBaseline, memory=False,
               keys={"controller_size": "hidden_size", "controller_layers": "num_layers"}),
    ModelEntry("mann", "the MANN", MANN, MANNOptions),
    ModelEntry("dnc", "the DNC", DNC, DNCOptions, none_if_zero=frozenset({"sparse_link"})),
)})
# The models with a memory: what `ntm bench --model` measures.
MEMORY_MODELS = tuple(name for name, entry in MODELS.items() if entry.memory)
