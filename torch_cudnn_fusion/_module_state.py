"""A module's parameters, buffers and children read on every call, without nn.Module.__getattr__.

`module.weight` finds a Parameter only after Python's own lookup failed (the instance's __dict__, the class), through
nn.Module.__getattr__. Up to Python 3.11 that failed lookup raises an AttributeError inside, about 0.6 us a name; a
fused conv + BatchNorm layer reads seven names a call, and `module_attributes` reads them from the module's dicts for
about a tenth of that (benchmarks/module_python_time.py: 7.4-11.5 -> 4.9-6.8 us a call on Python 3.11). From Python
3.12 the lookup no longer raises inside, and the two cost about the same (3.6-3.8 us a call either way).

The cache below holds one entry per module class; a parametrization makes a class for each module it is registered
on, so a process that parametrizes many modules keeps as many (small) entries.
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

# per module class: the names its class defines (a parametrization's property shadows the Parameter it replaces),
# or None where the class changes attribute lookup itself (then every read goes through getattr)
_CLASS_NAMES: dict[type, Optional[frozenset]] = {}


def _class_names(cls: type) -> Optional[frozenset]:
    if cls.__getattribute__ is not nn.Module.__getattribute__ or cls.__getattr__ is not nn.Module.__getattr__:
        return None
    return frozenset(dir(cls))


def module_attributes(module: nn.Module, names: tuple[str, ...]) -> list:
    """[getattr(module, name) for name in names], each read from the module's _parameters, _buffers or _modules
    where getattr would find it there (nn.Module.__getattr__'s order). Through getattr instead: a name in the
    instance's __dict__ (weight_norm's computed weight) or defined on its class (a parametrization's property), every
    name of a class that changes attribute lookup, and every call under torch.compile, which traces getattr."""
    cls = type(module)
    try:
        on_class = _CLASS_NAMES[cls]
    except KeyError:
        on_class = _CLASS_NAMES[cls] = _class_names(cls)
    if on_class is None or torch.compiler.is_compiling():
        return [getattr(module, name) for name in names]
    d = module.__dict__
    parameters, buffers, children = d["_parameters"], d["_buffers"], d["_modules"]
    values = []
    for name in names:
        if name in d or name in on_class:
            values.append(getattr(module, name))
        elif name in parameters:
            values.append(parameters[name])
        elif name in buffers:
            values.append(buffers[name])
        elif name in children:
            values.append(children[name])
        else:
            values.append(getattr(module, name))  # raises nn.Module's AttributeError
    return values
