"""A griffe extension (not a script) for the API pages: each model's constructor as ``help()``
shows it.

The models take their options as ``**options`` (`torch_ntm.base.MemoryModule`) and present them
in the class's ``__signature__``, built from the model's ``Options`` dataclass. Griffe reads the
source, where it would see only ``**options``; this extension gives each such class an
``__init__`` with that runtime signature, so the documented signature lists the options with
their types and defaults, and the class docstring's ``Args`` are checked against it.
Loaded by mkdocs.yml (``extensions:`` of the python handler).
"""

from __future__ import annotations

import importlib
import inspect

import griffe

_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _text(annotation) -> str | None:
    if annotation is inspect.Parameter.empty:
        return None
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def _parameters(signature: inspect.Signature) -> griffe.Parameters:
    parameters = [griffe.Parameter("self", kind=griffe.ParameterKind.positional_or_keyword)]
    for p in signature.parameters.values():
        default = None if p.default is inspect.Parameter.empty else repr(p.default)
        parameters.append(griffe.Parameter(p.name, annotation=_text(p.annotation),
                                           kind=_KINDS[p.kind], default=default))
    return griffe.Parameters(*parameters)


class ModelSignatures(griffe.Extension):
    """Gives every class whose runtime ``__signature__`` it defines itself (the models and their
    cells) an ``__init__`` with that signature."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        self._visit(pkg)

    def _visit(self, module: griffe.Module) -> None:
        for member in list(module.members.values()):
            if member.is_alias:
                continue
            if member.is_module:
                self._visit(member)
            elif member.is_class:
                self._give_signature(module, member)

    @staticmethod
    def _give_signature(module: griffe.Module, cls: griffe.Class) -> None:
        runtime = getattr(importlib.import_module(module.path), cls.name, None)
        if runtime is None or "__signature__" not in vars(runtime):
            return
        init = griffe.Function("__init__", parameters=_parameters(runtime.__signature__),
                               returns="None", lineno=cls.lineno, endlineno=cls.lineno)
        cls.set_member("__init__", init)
