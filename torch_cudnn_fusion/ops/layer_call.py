"""The state a fused layer owns: its decision and the recorded form of its last call."""

from __future__ import annotations

from typing import Any, Optional, Union

from .decide import BatchNormConfig, ConvConfig, Decision, FusionStatus, status_of


class LayerCall:
    """What one fused layer decided for the inputs it last saw, and how it runs a call that repeats them.

    signature: the metadata of every tensor and setting the decision depends on; a call with the same signature
    skips the checks and the decision, which cost more host time than a small layer's kernels. decision, config:
    the decision and the configuration it was made for (what `fusion_status` and `explain` report). run: the op's
    arguments for a repeated call. recorded: the call recorded in C++ (csrc/ops/conv_call.h, conv_bn_call.h,
    bn_call.h), which checks a repeat and runs it without returning to Python; for a conv layer decided eager, it only
    checks the repeat (Python then runs eager's composition). fold: Conv2dBN's folded eval weight and bias with the
    key and the tensors they were computed from (let go when the module enters training, is moved or is converted).
    mode: Conv2dBN's last forward, "batch statistics" or "folded".

    A module holds one (`module._call`); a functional call without one decides anew. A copy of a module (deepcopy,
    pickle) starts with a fresh record: it is another layer, with other tensors.
    """

    def __init__(self) -> None:
        self.signature: Optional[tuple] = None
        self.decision: Optional[Decision] = None
        self.config: Union[ConvConfig, BatchNormConfig, None] = None
        self.run: Optional[tuple] = None
        self.recorded: Any = None
        self.fold: Optional[tuple] = None
        self.mode = ""

    def remember(self, decision: Decision, config=None, signature: Optional[tuple] = None,
                 run: Optional[tuple] = None, recorded: Any = None) -> None:
        self.decision, self.config, self.signature, self.run, self.recorded = decision, config, signature, run, recorded

    @property
    def status(self) -> FusionStatus:
        return status_of(self.decision, self.config)

    def __reduce__(self):
        return LayerCall, ()

    def __deepcopy__(self, memo) -> "LayerCall":
        return LayerCall()

    def __repr__(self) -> str:
        return f"LayerCall({self.status})"
