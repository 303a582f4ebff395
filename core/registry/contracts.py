"""The base classes that registered names are checked against, declared by the layers that define them.

The registry sits below everything it registers, so it imports none of the contracts:
``PolicyConfig``, ``DatasetConfig`` and ``EnvConfig`` (config), ``DatasetMeta`` (data),
``Launcher`` (distributed), ``Policy`` (model), ``CheckpointFormat`` (checkpoint) and
``VectorEnv`` (eval) each declare themselves here with ``@contract`` where they are
defined. A contract not declared yet has not been defined, so no class can subclass it
and no object can be its instance: the checks below then refuse, exactly as the base's
own ``issubclass`` and ``isinstance`` would, without the registry importing its layer
(or torch) to ask.
"""

from __future__ import annotations

from typing import Literal, TypeVar, get_args

Contract = Literal[
    "PolicyConfig", "DatasetConfig", "EnvConfig", "DatasetMeta", "Launcher", "Policy", "CheckpointFormat", "VectorEnv"
]
CONTRACTS: tuple[Contract, ...] = get_args(Contract)

T = TypeVar("T", bound=type)
_declared: dict[str, type] = {}


def contract(base: T) -> T:
    """Class decorator: ``base`` is the contract of its name, the class registered targets are checked against."""
    _declared[base.__name__] = base
    return base


def declared(name: Contract) -> type | None:
    return _declared.get(name)


def is_subclass(target: object, name: Contract) -> bool:
    base = _declared.get(name)
    return base is not None and isinstance(target, type) and issubclass(target, base)


def is_instance(value: object, name: Contract) -> bool:
    base = _declared.get(name)
    return base is not None and isinstance(value, base)
