"""The models a training configuration can name (``--set model=NAME``), one entry each.

Every place that turns a configuration into a model reads this table: the configuration's
``model_params`` (the model's own options dataclass) and its checks (`torch_ntm.config`), the keys
refused for a model they do not shape (`torch_ntm.overrides`), `torch_ntm.factories.build_model`
and the bench. A new model is one `ModelEntry` here: its module and its options dataclass, whose
fields are its configuration keys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from torch import nn

from torch_ntm.baseline import LSTMBaseline
from torch_ntm.checks import positive_fields
from torch_ntm.dnc import DNC, DNCOptions
from torch_ntm.mann import MANN, MANNOptions
from torch_ntm.model import NTM, NTMOptions

__all__ = ["LSTMOptions", "ModelEntry", "MODELS", "MEMORY_MODELS"]


@dataclass
class LSTMOptions:
    """The LSTM baseline's architecture as a configuration holds it: ``controller_size`` units in
    each of ``controller_layers`` layers (`torch_ntm.baseline.LSTMBaseline`'s ``hidden_size`` and
    ``num_layers``; its defaults)."""

    controller_size: int = 256
    controller_layers: int = 3

    def checked(self) -> LSTMOptions:
        """These options, unchanged if valid; else a `ValueError` naming the first invalid one."""
        positive_fields(self, "controller_size", "controller_layers")
        return self


@dataclass(frozen=True)
class ModelEntry:
    """A model a configuration builds, and the options that shape it.

    Attributes:
        name: its ``model=`` value.
        title: how messages name it (``"the LSTM baseline"``).
        cls: the module, built as ``cls(input_size, output_size, **arguments, device=...)``.
        options: its options dataclass: a configuration's ``model_params``, whose fields are
            configuration keys of the same name, checked by its ``checked()``.
        renamed: option -> constructor argument, where the module names one otherwise.
        none_if_zero: options where a configuration's 0 means None (config.json files of earlier
            versions and ``--set`` have numbers: ``max_beta=0`` is the paper's unbounded strength).
        memory: whether it has memory rows (``memory_size`` and ``eval_memory_size`` apply).
    """

    name: str
    title: str
    cls: type[nn.Module]
    options: type
    renamed: Mapping[str, str] = field(default_factory=dict)
    none_if_zero: frozenset[str] = frozenset()
    memory: bool = True

    def config_keys(self) -> frozenset[str]:
        """The configuration keys that shape this model: its options' fields."""
        return frozenset(f.name for f in dataclasses.fields(self.options))

    def params(self, values: Mapping) -> object:
        """Its options from configuration values by key (a value 0 of ``none_if_zero``: None);
        the keys it has not are left out, a field without a value takes its default."""
        own = {key: values[key] for key in self.config_keys() if key in values}
        return self.options(**{**own, **{key: None for key in self.none_if_zero
                                        if key in own and own[key] == 0}})

    def arguments(self, config) -> dict:
        """Its constructor's keyword arguments (but the sizes and device) from a
        configuration."""
        return {self.renamed.get(key, key): value
                for key, value in dataclasses.asdict(config.model_params).items()}


MODELS: Mapping[str, ModelEntry] = MappingProxyType({entry.name: entry for entry in (
    ModelEntry("ntm", "the NTM", NTM, NTMOptions,
               none_if_zero=frozenset({"max_beta", "max_gamma"})),
    ModelEntry("lstm", "the LSTM baseline", LSTMBaseline, LSTMOptions, memory=False,
               renamed={"controller_size": "hidden_size", "controller_layers": "num_layers"}),
    ModelEntry("mann", "the MANN", MANN, MANNOptions),
    ModelEntry("dnc", "the DNC", DNC, DNCOptions, none_if_zero=frozenset({"sparse_link"})),
)})
# The models with a memory: what `ntm bench --model` measures.
MEMORY_MODELS = tuple(name for name, entry in MODELS.items() if entry.memory)
