"""What torch.compile needs of this package, without importing torch._dynamo at import time (that import costs
about 1.2 s and sets TORCHINDUCTOR_CACHE_DIR in os.environ)."""

from __future__ import annotations

import sys
from typing import Callable, TypeVar

import torch

F = TypeVar("F", bound=Callable)


def constant_under_compile(fn: F) -> F:
    """torch.compiler.assume_constant_result(fn): traced code keeps the result of the call it traced.

    That decorator only marks `fn` (torch._dynamo.assume_constant_result sets the attribute below), and torch.compile
    reads the mark when it traces, by which time torch._dynamo is imported. So the mark is set here directly unless
    torch._dynamo is already loaded; tests/test_modules.py checks that both give `fn` the same attributes.
    """
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn
