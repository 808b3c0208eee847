"""fuse(model): a new model whose Conv2d / BatchNorm2d / ReLU patterns run as fused modules, with a report.

The user's model is never touched. fuse() works on a copy of its module tree that shares the original's Parameters
and buffers (an optimizer built on either updates both; running statistics are one set of tensors), rewrites the
copy, and returns it. Every module of the original keeps its class, attributes, hooks and behaviour, also when
fuse() raises.

How the copy is rewritten, per module, from the top:
  * torch.fx traces it, in training and in eval mode. When both traces agree, the patterns below are fused in the
    graph and the module becomes a torch.fx.GraphModule holding the same submodules.
  * Where tracing fails, or the two traces differ (its forward branches on self.training, e.g. stochastic depth or
    auxiliary heads, which a single trace would freeze), the module keeps its class and each of its children is
    rewritten the same way; in an nn.Sequential, consecutive children are matched in order first.

Then every global average pool of the copy (nn.AdaptiveAvgPool2d(1), F.adaptive_avg_pool2d(x, 1) in a traced graph)
becomes GlobalAvgPool2d / global_avg_pool2d, whose gradient for a channels_last CUDA input is channels_last (see
torch_cudnn_fusion/nn/pool.py); the report's `pools` lists them.

State_dict keys do not change: a fused conv takes the conv's place, and the BatchNorm it absorbed stays at its own
path as a BatchNorm2dFused placeholder (parameters and statistics kept, input passed through). A checkpoint of the
plain model loads into the fused one and back.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import itertools
import operator
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..ops.decide import NOT_RUN
from ..diagnostics.report import restoring_buffers
from ..nn import (ActivationFused, BatchNorm2dFused, BatchNorm2dReLU, Conv2dAddReLU, Conv2dBN, Conv2dBNAddReLU,
                 Conv2dBNReLU, Conv2dReLU, FusedConv2d, GlobalAvgPool2d, SqueezeExcite)
from ..nn.batchnorm import RELU_ACTIVATIONS
from ..nn.pool import global_avg_pool2d, is_global
from ..nn.squeeze_excite import block_problem
from ..ops.squeeze_excite import SQUEEZE_EXCITE_ACTIVATIONS

# ---- the patterns: (BatchNorm, residual add, activation) -> the fused module ----

PATTERNS: dict[tuple[bool, bool, Optional[str]], type] = {
    (True, False, "relu"): Conv2dBNReLU,
    (True, False, "relu6"): Conv2dBNReLU,  # activation="relu6"
    (True, False, "silu"): Conv2dBN,  # activation="silu"
    (True, False, "hardswish"): Conv2dBN,  # activation="hardswish"
    (True, False, "leaky_relu"): Conv2dBN,  # activation="leaky_relu", with the activation's negative_slope
    (True, False, None): Conv2dBN,  # an activation after it that none of these fuses stays where it is
    (True, True, "relu"): Conv2dBNAddReLU,
    (False, False, "relu"): Conv2dReLU,
    (False, True, "relu"): Conv2dAddReLU,
}
# Chains that match no pattern, and why.
NOT_FUSED: dict[tuple[bool, bool, Optional[str]], str] = {
    (False, False, "relu6"): "Conv2d -> ReLU6 without a BatchNorm: Conv2dReLU applies ReLU only",
    (False, False, "silu"): "Conv2d -> SiLU without a BatchNorm: the conv graphs express ReLU only (SiLU is fused "
                            "after a BatchNorm)",
    (False, False, "hardswish"): "Conv2d -> Hardswish without a BatchNorm: the conv graphs express ReLU only "
                                 "(Hardswish is fused after a BatchNorm)",
    (False, False, "leaky_relu"): "Conv2d -> LeakyReLU without a BatchNorm: the conv graphs express ReLU only "
                                  "(LeakyReLU is fused after a BatchNorm)",
    (False, False, None): "nothing fusable follows it (patterns: Conv2d -> BatchNorm2d / ReLU / add -> ReLU)",
}
# A squeeze-and-excitation block, matched before the conv patterns (its first conv and ReLU would otherwise make a
# Conv2dReLU): global average pool -> 1x1 Conv2d -> ReLU or SiLU -> 1x1 Conv2d -> sigmoid or hardsigmoid -> multiply
# by the pool's input. It becomes SqueezeExcite: one op call and one autograd node for the six modules and (under
# autocast) ten nodes eager runs, which is most of the block's cost in the small models that carry it.
_GATE_MODULES = {nn.Sigmoid: "sigmoid", nn.Hardsigmoid: "hardsigmoid"}
_GATE_FUNCTIONS = {torch.sigmoid: "sigmoid", F.hardsigmoid: "hardsigmoid"}
_GATE_METHODS = {"sigmoid": "sigmoid", "sigmoid_": "sigmoid"}
_MUL_FUNCTIONS = {operator.mul, torch.mul}
_SPATIAL_DIMS = ((2, 3), (3, 2), (-2, -1), (-1, -2))
# The activations a BatchNorm without a conv before it fuses (BatchNorm2dReLU).
_BATCH_NORM_ALONE_ACTIVATIONS = tuple(a for a in RELU_ACTIVATIONS if a is not None)
# What the report says of an activation after a fused layer that it does not fuse.
_NOT_EXPRESSED = "the fused layers express ReLU and ReLU6, and after a BatchNorm SiLU, Hardswish and LeakyReLU, only"

# Why each eligibility condition exists; every refusal below quotes one of these.
WHY = {
    "conv_type": "only nn.Conv2d itself is fused: a subclass may change forward (timm's Conv2dSame pads by the "
                 "input size)",
    "called_twice": "fusing it would change its other calls",
    "shared_output": "its output is also used elsewhere: fusing would drop a value another operation reads",
    "bn_type": "a BatchNorm2d subclass whose behaviour fuse() cannot know",
    "sync_bn": "SyncBatchNorm reduces its statistics across processes, which the fused BatchNorm does not do",
    "bn_drop": "timm's BatchNormAct2d applies its drop layer between BatchNorm and activation",
    "add_relu": "a residual add is fused only when a ReLU follows it (cuDNN 9.19 refuses BatchNorm + add alone)",
}

_OTHER_ACTIVATIONS = (nn.GELU, nn.Hardsigmoid, nn.ELU, nn.SELU, nn.Sigmoid, nn.Tanh, nn.Mish, nn.PReLU, nn.Hardtanh)
_OTHER_ACTIVATION_FUNCTIONS = {F.gelu, F.hardsigmoid, F.elu, F.selu, torch.sigmoid, torch.tanh, F.mish, F.hardtanh}
_OTHER_ACTIVATION_METHODS = {"sigmoid", "sigmoid_", "tanh", "tanh_"}
_RELU_FUNCTIONS = {F.relu, torch.relu, torch.relu_}
_FUSED_ACTIVATION_FUNCTIONS = {F.relu6: "relu6", F.silu: "silu", F.hardswish: "hardswish"}
_LEAKY_RELU_FUNCTIONS = {F.leaky_relu, F.leaky_relu_}
_ADD_FUNCTIONS = {operator.add, operator.iadd, torch.add}
_FUSED_TYPES = (FusedConv2d, BatchNorm2dReLU)  # already fused: leaves, reported as such
_PLACEHOLDERS = (BatchNorm2dFused, ActivationFused)


@dataclass(frozen=True)
class FuseRow:
    """One candidate of the model: a pattern (replaced or not, and why), a conv nothing fusable follows, or a
    module that could not be traced."""

    path: str  # the module path of the pattern's first module ("(model)" for the root)
    pattern: str  # e.g. "Conv2d -> BatchNorm2d -> ReLU"; "torch.fx trace" for a module that was not traced
    replaced: bool  # replaced by a fused module
    module: str  # the fused module's class, or "" when not replaced
    implementation: str  # how it runs: from its fusion_status once it ran (fuse(..., example_input) runs it)
    reason: str  # why not replaced, or a note
    convs: int  # the Conv2d layers (subclasses included) it holds: 1 in a conv pattern, 2 in a squeeze-and-excitation
    # block, 0 in a BatchNorm pattern or a module that was not traced (every row says: the coverage counts add them)

    @classmethod
    def fused(cls, path: str, pattern: str, module: str, note: str, *, convs: int) -> "FuseRow":
        """A pattern replaced by a fused module (`module`: its class name); how it runs is filled in once it ran."""
        return cls(path, pattern, True, module, "", note, convs)

    @classmethod
    def refused(cls, path: str, pattern: str, reason: str, *, convs: int) -> "FuseRow":
        """A pattern, conv or module left as it is, and why."""
        return cls(path, pattern, False, "", "", reason, convs)

    @property
    def runs_fused(self) -> Optional[bool]:
        """Whether its last forward ran fused (cuDNN); None when it has not run or was not replaced."""
        if not self.replaced or not self.implementation or self.implementation.startswith("decided on"):
            return None
        return not self.implementation.startswith("eager")


class FuseReport(list):
    """A list of FuseRow that prints as a table, with a summary of what was replaced and what runs fused.
    `pools`: where the fused model's global average pools run cudnn_fusion::global_avg_pool for a channels_last CUDA
    input (GlobalAvgPool2d in place of nn.AdaptiveAvgPool2d(1), global_avg_pool2d in place of
    F.adaptive_avg_pool2d(x, 1) in a traced graph), so that their gradient comes back channels_last."""

    def __init__(self, rows=(), pools=()) -> None:
        super().__init__(rows)
        self.pools: list[str] = list(pools)

    @property
    def replaced(self) -> list[FuseRow]:
        return [r for r in self if r.replaced]

    @property
    def not_replaced(self) -> list[FuseRow]:
        return [r for r in self if not r.replaced]

    def conv_coverage(self) -> tuple[int, int, dict[str, str]]:
        """(Conv2d layers replaced, Conv2d layers in the model, {path: why not} for the others)."""
        why_not = {r.path: r.reason for r in self if r.convs and not r.replaced}
        return sum(r.convs for r in self if r.replaced), sum(r.convs for r in self), why_not

    def summary(self) -> str:
        replaced, total, _ = self.conv_coverage()
        ran = [r.runs_fused for r in self.replaced]
        text = f"{len(self.replaced)} patterns replaced by fused modules ({replaced} of {total} Conv2d layers)"
        if any(v is not None for v in ran):
            text += f"; on the example input {sum(v is True for v in ran)} ran fused, {sum(v is False for v in ran)} eager"
        else:
            text += "; each decides how it runs on its first forward"
        untraced = [r for r in self if r.pattern == "torch.fx trace"]
        if untraced:
            text += f"; {len(untraced)} modules not traced as a whole (their children were rewritten instead)"
        return text

    def __str__(self) -> str:
        if not self:
            return "fuse(): no Conv2d / BatchNorm2d / ReLU patterns found"
        headers = ("layer", "pattern", "replaced", "module", "runs / reason")
        rows = [(r.path, r.pattern, "yes" if r.replaced else "no", r.module,
                 (r.implementation + (f" — {r.reason}" if r.reason else "")) if r.replaced else r.reason)
                for r in self]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers[:-1])]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + cells[-1]  # noqa: E731
        pools = []
        if self.pools:
            n = len(self.pools)
            pools = [f"{n} global average pool{'s run' if n > 1 else ' runs'} cudnn_fusion::global_avg_pool for a "
                     f"channels_last CUDA input, so that the gradient comes back channels_last: {', '.join(self.pools)}"]
        return "\n".join([line(headers)] + [line(row) for row in rows] + [self.summary()] + pools)


# ---- recognizing modules ----

def _is_timm_batch_norm_act(m: nn.Module) -> bool:
    """timm.layers.BatchNormAct2d (BatchNorm + drop + activation in one module), recognized without importing timm."""
    cls = type(m)
    return cls.__name__ == "BatchNormAct2d" and cls.__module__.startswith("timm.") and isinstance(m, nn.BatchNorm2d)


def _is_batch_norm(m: nn.Module) -> bool:
    """Any BatchNorm (SyncBatchNorm is no BatchNorm2d subclass) that is not already fused: a candidate to match, or to
    report why not (see _batch_norm_problem)."""
    return isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, _PLACEHOLDERS + (BatchNorm2dReLU,))


def _batch_norm_problem(bn: nn.Module) -> str:
    """Why `bn` cannot be fused ('' when it can)."""
    if isinstance(bn, nn.SyncBatchNorm) or "SyncBatchNorm" in type(bn).__name__:
        return f"{type(bn).__name__}: {WHY['sync_bn']}; kept as is"
    if _is_timm_batch_norm_act(bn):
        if not isinstance(getattr(bn, "drop", nn.Identity()), nn.Identity):
            return f"BatchNormAct2d with {type(bn.drop).__name__}: {WHY['bn_drop']}; kept as is"
        return ""
    if type(bn) is not nn.BatchNorm2d:
        return f"{type(bn).__name__}: {WHY['bn_type']}; kept as is"
    return ""


def _activation_of_module(m: nn.Module) -> Optional[str]:
    """The fusable activation `m` is ("relu", "relu6", "silu", "hardswish", "leaky_relu"), or None."""
    if type(m) is nn.ReLU:
        return "relu"
    if type(m) is nn.ReLU6 or (type(m) is nn.Hardtanh and m.min_val == 0.0 and m.max_val == 6.0):
        return "relu6"
    return {nn.SiLU: "silu", nn.Hardswish: "hardswish", nn.LeakyReLU: "leaky_relu"}.get(type(m))


def _negative_slope(source, modules: Optional[dict] = None) -> float:
    """LeakyReLU's negative slope where `source` (a module, or an fx node with the modules) is nn.LeakyReLU or
    F.leaky_relu; nn.LeakyReLU's default, 0.01, for any other (whose fused module ignores it)."""
    if isinstance(source, fx.Node):
        if source.op == "call_module":
            source = modules[source.target]
        elif source.op == "call_function" and source.target in _LEAKY_RELU_FUNCTIONS:
            return float(_slope_argument(source))
    return float(source.negative_slope) if type(source) is nn.LeakyReLU else 0.01


def _slope_argument(node: fx.Node):
    """The negative slope a call of F.leaky_relu (x, negative_slope=0.01, inplace=False) passes, as given."""
    return node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)


def _inner_activation(bn: nn.Module) -> tuple[Optional[str], Optional[nn.Module]]:
    """For timm's BatchNormAct2d: (the fusable activation, or None; the module to apply after the fused conv + BN
    when its activation is not fusable). (None, None) for a plain BatchNorm2d or an identity activation."""
    if not _is_timm_batch_norm_act(bn):
        return None, None
    act = getattr(bn, "act", None)
    if act is None or isinstance(act, nn.Identity):
        return None, None
    fusable = _activation_of_module(act)
    return (fusable, None) if fusable else (None, act)


def _batch_norm_name(bn: nn.Module) -> str:
    """The BatchNorm's part of a pattern's name: timm's BatchNormAct2d with its activation, e.g. BatchNormAct2d(ReLU)."""
    act = getattr(bn, "act", None) if _is_timm_batch_norm_act(bn) else None
    return type(bn).__name__ + (f"({type(act).__name__})" if act is not None and not isinstance(act, nn.Identity) else "")


def _pattern_name(parts: list[str]) -> str:
    return " -> ".join(parts)


def _fused_module(conv: nn.Conv2d, bn: Optional[nn.BatchNorm2d], residual: bool, act: Optional[str],
                  negative_slope: float = 0.01):
    """The fused module for a chain, or (None, why not); negative_slope: the LeakyReLU's, where act is one."""
    cls = PATTERNS.get((bn is not None, residual, act))
    if cls is None:
        return None, NOT_FUSED.get((bn is not None, residual, act), "no fused module for this pattern")
    if bn is not None:
        return cls.from_modules(conv, bn, activation=act, bn_registered_elsewhere=True,
                                negative_slope=negative_slope), ""
    return cls.from_conv(conv), ""


def _absorb_bn(bn: nn.BatchNorm2d, fused_into: str, applies_act: bool = False) -> None:
    """`bn` belongs to fuse()'s copy: it becomes a placeholder at its own path (same Parameters and buffers, same
    state_dict keys, timm's activation child kept), applied by the fused conv before it. applies_act: where the
    placeholder is still called (in an nn.Sequential), it applies timm's activation that was not fused."""
    bn.__class__ = BatchNorm2dFused
    bn.fused_into = fused_into
    bn.applies_act = applies_act


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# ---- the copy that shares Parameters and buffers ----

def _shared_copy(model: nn.Module) -> nn.Module:
    """A copy of `model`'s module tree whose Parameters and buffers are the original's own tensors."""
    memo = {id(t): t for _, t in itertools.chain(model.named_parameters(remove_duplicate=False),
                                                  model.named_buffers(remove_duplicate=False))}
    return copy.deepcopy(model, memo)


# ---- torch.fx ----

class _Tracer(fx.Tracer):
    """Keeps whole: fused modules and the global pool (our Python code, which branches on its input), every Conv2d
    and BatchNorm2d (timm's subclasses included, so that a Conv2dSame or BatchNormAct2d is one node to match or to
    report, not its inlined forward). A fused model's global_avg_pool2d calls stay calls."""

    def __init__(self) -> None:
        super().__init__(autowrap_functions=(global_avg_pool2d,))

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return (isinstance(m, _FUSED_TYPES + _PLACEHOLDERS + (GlobalAvgPool2d, nn.Conv2d,
                                                              nn.modules.batchnorm._BatchNorm))
                or super().is_leaf_module(m, qualname))


def _trace(module: nn.Module, name: str) -> tuple[Optional[fx.GraphModule], str]:
    """(module traced by torch.fx as a GraphModule class called `name`, '') when its training and eval traces agree;
    else (None, why not)."""
    training = module.training
    codes, graph = [], None
    try:
        for mode in (True, False):
            module.train(mode)
            tracer = _Tracer()
            traced = tracer.trace(module)
            codes.append(traced.python_code("self").src)
            if mode == training:
                graph = traced
    except Exception as error:  # noqa: BLE001 — any tracing failure means: rewrite the children instead
        text = str(error).strip()
        first_line = text.splitlines()[0] if text else type(error).__name__
        return None, f"not traceable by torch.fx ({type(error).__name__}: {first_line[:200]})"
    finally:
        module.train(training)
    if codes[0] != codes[1]:
        return None, ("its forward differs between training and eval (it reads self.training), which one torch.fx "
                      "trace would freeze")
    gm = fx.GraphModule(module, graph, name)
    _keep_every_module(gm, module)
    gm.train(training)
    return gm, ""


def _keep_every_module(gm: fx.GraphModule, root: nn.Module) -> None:
    """torch.fx keeps only what forward reaches; put every other submodule, Parameter and buffer back at its own path,
    so that state_dict keys, .to() and .train() reach them as in the original."""
    for path, module in root.named_modules():
        if path and _get(gm, path) is None:
            parent_path, _, name = path.rpartition(".")
            _get(gm, parent_path).add_module(name, module)
    for kind, items in (("parameter", root.named_parameters()), ("buffer", root.named_buffers())):
        for path, tensor in items:
            owner_path, _, name = path.rpartition(".")
            owner = _get(gm, owner_path)
            present = owner._parameters if kind == "parameter" else owner._buffers
            if name not in present:
                if kind == "parameter":
                    owner.register_parameter(name, tensor)
                else:
                    original_owner = root.get_submodule(owner_path) if owner_path else root
                    owner.register_buffer(name, tensor,
                                          persistent=name not in original_owner._non_persistent_buffers_set)


def _get(root: nn.Module, path: str) -> Optional[nn.Module]:
    try:
        return root.get_submodule(path) if path else root
    except AttributeError:
        return None


def _set_module(root: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = root.get_submodule(parent_path) if parent_path else root
    parent._modules[name] = module


def _sole_user(node: fx.Node) -> Optional[fx.Node]:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _node_activation(node: fx.Node, value: fx.Node, modules: dict) -> tuple[Optional[str], str]:
    """For `node` applied to `value`: (fusable activation or None, a name for the report; '' when `node` is not an
    activation of `value` at all)."""
    if not node.args or node.args[0] is not value:
        return None, ""
    if node.op == "call_module":
        m = modules[node.target]
        act = _activation_of_module(m)
        if act and len(node.args) == 1 and not node.kwargs:
            return act, type(m).__name__
        return None, type(m).__name__ if isinstance(m, _OTHER_ACTIVATIONS) else ""
    if node.op == "call_function":
        rest = node.args[1:] + tuple(v for k, v in node.kwargs.items() if k != "inplace")
        if node.target in _RELU_FUNCTIONS and all(isinstance(v, bool) for v in rest):
            return "relu", "relu"
        if node.target in _FUSED_ACTIVATION_FUNCTIONS and all(isinstance(v, bool) for v in rest):
            name = _FUSED_ACTIVATION_FUNCTIONS[node.target]
            return name, name
        if node.target in _LEAKY_RELU_FUNCTIONS:  # (x, negative_slope=0.01, inplace=False), the slope a number
            slope = _slope_argument(node)
            inplace = node.args[2:] + tuple(v for k, v in node.kwargs.items() if k == "inplace")
            others = [k for k in node.kwargs if k not in ("negative_slope", "inplace")]
            fusable = (isinstance(slope, (int, float)) and not isinstance(slope, bool) and not others
                       and len(node.args) <= 3 and all(isinstance(v, bool) for v in inplace))
            return ("leaky_relu" if fusable else None), "leaky_relu"
        if node.target in _OTHER_ACTIVATION_FUNCTIONS:
            return None, getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method" and node.target in ("relu", "relu_") and len(node.args) == 1 and not node.kwargs:
        return "relu", "relu"
    if node.op == "call_method" and node.target in _OTHER_ACTIVATION_METHODS:
        return None, node.target.rstrip("_")
    return None, ""


def _residual_of_add(node: fx.Node, value: fx.Node) -> Optional[fx.Node]:
    """The other operand when `node` is value + other (other a tensor node), else None."""
    is_add = ((node.op == "call_function" and node.target in _ADD_FUNCTIONS)
              or (node.op == "call_method" and node.target in ("add", "add_")))
    if not is_add or len(node.args) != 2 or (node.kwargs and node.kwargs != {"alpha": 1}):
        return None
    a, b = node.args
    if (a is value) == (b is value):  # value + value, or value is not an operand
        return None
    other = b if a is value else a
    return other if isinstance(other, fx.Node) else None


def _pooled_input(node: fx.Node, modules: dict) -> Optional[fx.Node]:
    """x when `node` is a global average pool of x that keeps its dims (nn.AdaptiveAvgPool2d(1),
    F.adaptive_avg_pool2d(x, 1), global_avg_pool2d(x), x.mean((2, 3), keepdim=True)), else None."""
    if not node.args or not isinstance(node.args[0], fx.Node):
        return None
    x, rest, kwargs = node.args[0], node.args[1:], node.kwargs
    if node.op == "call_module":
        m = modules.get(node.target)
        global_pool = type(m) in (nn.AdaptiveAvgPool2d, GlobalAvgPool2d) and is_global(m.output_size)
        return x if global_pool and not rest and not kwargs else None
    if node.op == "call_function" and node.target is global_avg_pool2d:
        return x if not rest and not kwargs else None
    if node.op == "call_function" and node.target is F.adaptive_avg_pool2d:
        size = rest[0] if len(rest) == 1 and not kwargs else kwargs.get("output_size") if not rest else None
        return x if size is not None and len(rest) + len(kwargs) == 1 and is_global(size) else None
    is_mean = ((node.op == "call_method" and node.target == "mean")
               or (node.op == "call_function" and node.target is torch.mean))
    if not is_mean:
        return None
    dims = rest[0] if rest else kwargs.get("dim")
    keepdim = rest[1] if len(rest) > 1 else kwargs.get("keepdim", False)
    known = set(kwargs) <= {"dim", "keepdim"} and len(rest) <= 2
    return x if known and isinstance(dims, (tuple, list)) and tuple(dims) in _SPATIAL_DIMS and keepdim is True else None


def _pool_name(node: fx.Node, modules: dict) -> str:
    return type(modules[node.target]).__name__ if node.op == "call_module" else "mean"


def _gate_of(node: fx.Node, value: fx.Node, modules: dict) -> tuple[Optional[str], str]:
    """("sigmoid" or "hardsigmoid", a name for the report) when `node` applies that gate to `value` alone, else
    (None, "")."""
    if not node.args or node.args[0] is not value:
        return None, ""
    rest = node.args[1:] + tuple(v for k, v in node.kwargs.items() if k != "inplace")
    if node.op == "call_module":
        m = modules[node.target]
        gate = _GATE_MODULES.get(type(m))
        return (gate, type(m).__name__) if gate and not rest else (None, "")
    if node.op == "call_function" and node.target in _GATE_FUNCTIONS and all(isinstance(v, bool) for v in rest):
        return _GATE_FUNCTIONS[node.target], node.target.__name__
    if node.op == "call_method" and node.target in _GATE_METHODS and not rest:
        return _GATE_METHODS[node.target], node.target
    return None, ""


def _is_product(node: fx.Node, value: fx.Node, x: fx.Node) -> bool:
    """Whether `node` is value * x or x * value."""
    is_mul = ((node.op == "call_function" and node.target in _MUL_FUNCTIONS)
              or (node.op == "call_method" and node.target == "mul"))
    return is_mul and not node.kwargs and len(node.args) == 2 and set(node.args) == {value, x} and value is not x


def _describe_users(node: fx.Node, modules: dict) -> str:
    """The operations that read `node`, in order, a repeated one once with its count ("cat × 6, the output")."""
    names = collections.Counter()  # keeps the order of first use
    for user in node.users:
        if user.op == "call_module":
            names[type(modules[user.target]).__name__] += 1
        elif user.op == "output":
            names["the output"] += 1
        else:
            names[getattr(user.target, "__name__", str(user.target))] += 1
    return ", ".join(name if count == 1 else f"{name} × {count}" for name, count in names.items()) or "nothing"


class _GraphRewrite:
    """Fuses the patterns of one traced module's graph."""

    def __init__(self, gm: fx.GraphModule, prefix: str, rows: list[FuseRow]) -> None:
        self.gm, self.prefix, self.rows = gm, prefix, rows
        self.modules = dict(gm.named_modules())
        self.calls = collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
        self.consumed: set[fx.Node] = set()

    def run(self) -> None:
        called = set()
        for node in list(self.gm.graph.nodes):
            if node in self.consumed:
                continue
            pooled = _pooled_input(node, self.modules)
            if pooled is not None:
                called.update(self.match_squeeze_excite(node, pooled))
                continue
            if node.op != "call_module":
                continue
            called.add(node.target)
            m = self.modules[node.target]
            path = _join(self.prefix, node.target)
            if isinstance(m, _FUSED_TYPES):
                self.rows.append(_already_fused(path, m))
                if isinstance(m, SqueezeExcite):  # its second conv is registered elsewhere, and runs in it
                    called.update(t for t, other in self.modules.items() if other is m.fc2)
            elif isinstance(m, nn.Conv2d):
                self.match_conv(node)
            elif _is_batch_norm(m):
                self.match_batch_norm_relu(node)
        for target, m in self.modules.items():  # convs forward never calls
            if isinstance(m, nn.Conv2d) and not isinstance(m, _FUSED_TYPES) and target not in called:
                self.refuse(_join(self.prefix, target), "Conv2d", "not called in forward", convs=1)
        self.gm.graph.lint()
        self.gm.recompile()

    def refuse(self, path: str, pattern: str, reason: str, *, convs: int) -> None:
        self.rows.append(FuseRow.refused(path, pattern, reason, convs=convs))

    def next_step(self, value: fx.Node) -> tuple[list[fx.Node], Optional[fx.Node], fx.Node]:
        """(the nn.Identity calls passed through, the sole user of `value` after them or None, the node that user
        reads). nn.Identity does nothing; timm puts one where a norm or activation is absent."""
        passed = []
        user = _sole_user(value)
        while (user is not None and user.op == "call_module" and type(self.modules[user.target]) is nn.Identity
               and len(user.args) == 1 and not user.kwargs):
            passed.append(user)
            value, user = user, _sole_user(user)
        return passed, user, value

    def match_conv(self, node: fx.Node) -> None:
        path = _join(self.prefix, node.target)
        conv = self.modules[node.target]
        if type(conv) is not nn.Conv2d:
            return self.refuse(path, f"({type(conv).__name__})", f"{type(conv).__name__}: {WHY['conv_type']}", convs=1)
        if len(node.args) != 1 or node.kwargs:
            return self.refuse(path, "Conv2d", "called with other than one positional input", convs=1)
        parts, chain, value = ["Conv2d"], [node], node
        bn = bn_node = inner_after = residual = None
        act, trailing, slope = None, "", 0.01
        passed, nxt, _ = self.next_step(value)
        if self.is_batch_norm(nxt):
            bn = self.modules[nxt.target]
            problem = _batch_norm_problem(bn)
            if problem:
                return self.refuse(path, _pattern_name(parts + [type(bn).__name__]), problem, convs=1)
            parts.append(_batch_norm_name(bn))
            chain += passed + [nxt]
            value = bn_node = nxt
            act, inner_after = _inner_activation(bn)
            slope = _negative_slope(bn.act) if act is not None else slope
        if inner_after is not None:
            trailing = type(inner_after).__name__
        elif act is None:
            passed, nxt, read = self.next_step(value)
            residual = self.added_before_relu(nxt, read)
            if residual is not None:
                parts.append("add")
                chain += passed + [nxt]
                value = nxt
            passed, nxt, read = self.next_step(value)
            if nxt is not None:
                act, name = _node_activation(nxt, read, self.modules)
                if act is not None:
                    parts.append(name)
                    chain += passed + [nxt]
                    value = nxt
                    slope = _negative_slope(nxt, self.modules)
                elif name:
                    trailing = name
        if len(chain) == 1:
            if trailing:
                return self.refuse(path, f"Conv2d -> {trailing}", f"{trailing}: {_NOT_EXPRESSED}", convs=1)
            return self.refuse(path, "Conv2d", self.why_alone(node), convs=1)
        pattern = _pattern_name(parts)
        for n in chain:
            # stateless modules may be shared (torchvision's ResNet blocks call one ReLU twice)
            m = self.modules[n.target] if n.op == "call_module" else None
            if m is not None and self.calls[n.target] > 1 and not (_activation_of_module(m) or type(m) is nn.Identity):
                return self.refuse(path, pattern, f"{_join(self.prefix, n.target)} is called {self.calls[n.target]} "
                                                  f"times in forward: {WHY['called_twice']}", convs=1)
        fused, reason = _fused_module(conv, bn, residual is not None, act, slope)
        if fused is None:
            return self.refuse(path, pattern, reason, convs=1)
        self.replace(node, chain, fused, residual, inner_after, bn_node)
        note = ""
        if trailing:
            note = f"{trailing} after it applied as before ({_NOT_EXPRESSED})"
        self.rows.append(FuseRow.fused(path, pattern, type(fused).__name__, note, convs=1))

    def why_alone(self, conv: fx.Node) -> str:
        """Why a conv with no pattern after it is left as it is: its output is shared, and one of its readers would
        have continued a pattern (see continues); else nothing fusable follows it (densenet's 3x3 convs feed only
        concatenations)."""
        users = list(conv.users)
        described = _describe_users(conv, self.modules)
        if len(users) > 1 and any(self.continues(conv, user) for user in users):
            return f"its output goes to {len(users)} operations ({described}): {WHY['shared_output']}"
        if len(users) > 1:
            described = f"{len(users)} operations ({described})"
        return f"{NOT_FUSED[(False, False, None)]}; its output goes to {described}"

    def continues(self, value: fx.Node, user: fx.Node) -> bool:
        """Whether match_conv would take `user` into a pattern after `value`, were it `value`'s only reader: a
        BatchNorm, a fusable activation, an add with a ReLU after it, or an nn.Identity (what follows it is not
        looked at)."""
        if self.is_batch_norm(user) or (user.op == "call_module" and type(self.modules[user.target]) is nn.Identity):
            return True
        if _node_activation(user, value, self.modules)[0] is not None:
            return True
        return self.added_before_relu(user, value) is not None

    def is_batch_norm(self, node: Optional[fx.Node]) -> bool:
        """Whether node calls a BatchNorm module (the step after a conv that match_conv takes first)."""
        return node is not None and node.op == "call_module" and _is_batch_norm(self.modules[node.target])

    def added_before_relu(self, node: Optional[fx.Node], value: fx.Node) -> Optional[fx.Node]:
        """The residual, where node adds `value` to it and a ReLU is the next step after the sum (the add match_conv
        takes into a pattern), else None."""
        residual = _residual_of_add(node, value) if node is not None else None
        if residual is None:
            return None
        _, after, reads = self.next_step(node)
        return residual if after is not None and _node_activation(after, reads, self.modules)[0] == "relu" else None

    def replace(self, node, chain, fused, residual, inner_after, bn_node) -> None:
        """The fused call goes right before the chain's last node: every input (x, the residual) exists there, so the
        graph stays in order however the residual was produced."""
        graph = self.gm.graph
        _set_module(self.gm, node.target, fused)
        last = chain[-1]
        with graph.inserting_before(last):
            args = (node.args[0],) if residual is None else (node.args[0], residual)
            out = graph.call_module(node.target, args)
            if inner_after is not None:  # timm's activation, applied after the fused conv + BatchNorm
                out = graph.call_module(f"{bn_node.target}.act", (out,))
        last.replace_all_uses_with(out)
        for n in reversed(chain):
            self.consumed.add(n)
            graph.erase_node(n)
        if bn_node is not None:
            _absorb_bn(self.modules[bn_node.target], _join(self.prefix, node.target))

    def match_squeeze_excite(self, pool: fx.Node, x: fx.Node) -> list[str]:
        """pool (of x) -> 1x1 Conv2d -> ReLU / SiLU -> 1x1 Conv2d -> sigmoid / hardsigmoid -> * x, replaced by a
        SqueezeExcite at the first conv's path; the targets of the convs it holds. Anything else is left to the conv
        patterns ([] is returned)."""
        chain, convs, names = [pool], [], [_pool_name(pool, self.modules)]
        value, activation, gate = pool, None, None
        for step in ("conv", "activation", "conv", "gate", "mul"):
            passed, nxt, read = self.next_step(value)
            if nxt is None:
                return []
            if step == "conv":
                m = self.modules.get(nxt.target) if nxt.op == "call_module" else None
                if (type(m) is not nn.Conv2d or nxt.args != (read,) or nxt.kwargs or self.calls[nxt.target] > 1
                        or (convs and convs[0][1].out_channels != m.in_channels)):
                    return []
                convs.append((nxt, m))
                names.append("Conv2d")
            elif step == "activation":
                activation, name = _node_activation(nxt, read, self.modules)
                if activation not in SQUEEZE_EXCITE_ACTIVATIONS:
                    return []
                names.append(name)
            elif step == "gate":
                gate, name = _gate_of(nxt, read, self.modules)
                if gate is None:
                    return []
                names.append(name)
            elif not _is_product(nxt, read, x):
                return []
            chain += passed + [nxt]
            value = nxt
        (fc1_node, fc1), (fc2_node, fc2) = convs
        if block_problem(fc1, fc2):
            return []
        fused = SqueezeExcite.from_modules(fc1, fc2, activation=activation, gate=gate, fc2_registered_elsewhere=True)
        graph = self.gm.graph
        _set_module(self.gm, fc1_node.target, fused)
        with graph.inserting_before(chain[-1]):
            out = graph.call_module(fc1_node.target, (x,))
        chain[-1].replace_all_uses_with(out)
        for n in reversed(chain):
            self.consumed.add(n)
            graph.erase_node(n)
        names.append("mul")
        self.rows.append(FuseRow.fused(_join(self.prefix, fc1_node.target), " -> ".join(names), "SqueezeExcite",
                                       f"with {_join(self.prefix, fc2_node.target)}", convs=2))
        return [fc1_node.target, fc2_node.target]

    def match_batch_norm_relu(self, node: fx.Node) -> None:
        path = _join(self.prefix, node.target)
        bn = self.modules[node.target]
        act, inner_after = _inner_activation(bn)
        nxt, passed = None, []
        if act is None:
            passed, nxt, read = self.next_step(node)
            if nxt is None or inner_after is not None:
                return
            act, name = _node_activation(nxt, read, self.modules)
            if act is None:
                return
        else:
            name = type(bn.act).__name__
        if act not in _BATCH_NORM_ALONE_ACTIVATIONS:
            return  # SiLU and Hardswish are fused after a conv + BatchNorm only
        pattern = f"{type(bn).__name__} -> {name}"
        problem = _batch_norm_problem(bn)
        if not problem and self.calls[node.target] > 1:
            problem = f"called {self.calls[node.target]} times in forward: {WHY['called_twice']}"
        if problem:
            return self.refuse(path, pattern, problem, convs=0)
        _set_module(self.gm, node.target, BatchNorm2dReLU.from_bn(bn, activation=act))
        if nxt is not None:
            nxt.replace_all_uses_with(node)
            for n in [nxt] + passed[::-1]:
                self.consumed.add(n)
                self.gm.graph.erase_node(n)
        self.rows.append(FuseRow.fused(path, pattern, "BatchNorm2dReLU", "", convs=0))


def _already_fused(path: str, m: nn.Module) -> FuseRow:
    """The row of a module fused before (fuse() of a fused model), with the Conv2d layers it holds."""
    convs = 2 if isinstance(m, SqueezeExcite) else 1 if isinstance(m, FusedConv2d) else 0
    return FuseRow.fused(path, type(m).__name__, type(m).__name__, "already fused", convs=convs)


# ---- nn.Sequential children, in order ----

def _fuse_sequential(seq: nn.Sequential, prefix: str, uses: collections.Counter, rows: list[FuseRow]) -> None:
    """The patterns among consecutive children of an nn.Sequential (no residual adds: they live in forward code)."""
    children = list(seq._modules.items())
    i = 0
    while i < len(children):
        name, m = children[i]
        path = _join(prefix, name)
        if isinstance(m, _FUSED_TYPES):
            rows.append(_already_fused(path, m))
        elif isinstance(m, nn.Conv2d):
            i += _sequential_conv(seq, prefix, children, i, uses, rows)
            continue
        elif _is_batch_norm(m) and not _batch_norm_problem(m) and uses[id(m)] == 1:
            act = _inner_activation(m)[0]
            follower = children[i + 1][1] if i + 1 < len(children) else None
            if act is None and follower is not None and _inner_activation(m)[1] is None:
                act = _activation_of_module(follower)
                if act in _BATCH_NORM_ALONE_ACTIVATIONS:
                    seq._modules[children[i + 1][0]] = ActivationFused(follower, path)
                    i += 1
            if act in _BATCH_NORM_ALONE_ACTIVATIONS:
                seq._modules[name] = BatchNorm2dReLU.from_bn(m, activation=act)
                rows.append(FuseRow.fused(path, f"{type(m).__name__} -> {act}", "BatchNorm2dReLU", "", convs=0))
        i += 1


def _sequential_conv(seq, prefix, children, i, uses, rows) -> int:
    name, conv = children[i]
    path = _join(prefix, name)
    if type(conv) is not nn.Conv2d:
        rows.append(FuseRow.refused(path, f"({type(conv).__name__})", f"{type(conv).__name__}: {WHY['conv_type']}",
                                    convs=1))
        return 1
    parts, absorbed, bn, act, inner_after, trailing, slope = ["Conv2d"], [], None, None, None, "", 0.01
    j = i + 1
    if j < len(children) and _is_batch_norm(children[j][1]):
        candidate = children[j][1]
        problem = _batch_norm_problem(candidate)
        if problem:
            rows.append(FuseRow.refused(path, f"Conv2d -> {type(candidate).__name__}", problem, convs=1))
            return 2
        bn = candidate
        parts.append(_batch_norm_name(bn))
        absorbed.append(children[j])
        act, inner_after = _inner_activation(bn)
        slope = _negative_slope(bn.act) if act is not None else 0.01
        j += 1
    if act is None and inner_after is None and j < len(children):
        act = _activation_of_module(children[j][1])
        slope = _negative_slope(children[j][1])
        if act:
            parts.append(type(children[j][1]).__name__)
            absorbed.append(children[j])
            j += 1
        elif isinstance(children[j][1], _OTHER_ACTIVATIONS):
            trailing = type(children[j][1]).__name__
    elif inner_after is not None:
        trailing = type(inner_after).__name__
    if not absorbed:
        rows.append(FuseRow.refused(path, "Conv2d",
                                    f"{trailing}: {_NOT_EXPRESSED}" if trailing else NOT_FUSED[(False, False, None)],
                                    convs=1))
        return 1
    pattern = _pattern_name(parts)
    if any(uses[id(m)] > 1 for m in [conv] + [m for _, m in absorbed]):
        rows.append(FuseRow.refused(path, pattern, f"a module of the pattern is used more than once in the model: "
                                                   f"{WHY['called_twice']}", convs=1))
        return j - i
    fused, reason = _fused_module(conv, bn, False, act, slope)
    if fused is None:
        rows.append(FuseRow.refused(path, pattern, reason, convs=1))
        return j - i
    seq._modules[name] = fused
    for child_name, child in absorbed:
        if child is bn:
            # the placeholder stays in the Sequential: it applies timm's activation when that was not fused
            _absorb_bn(child, path, applies_act=inner_after is not None)
        else:
            seq._modules[child_name] = ActivationFused(child, path)
    note = ""
    if trailing:
        note = f"{trailing} after it applied as before ({_NOT_EXPRESSED})"
    rows.append(FuseRow.fused(path, pattern, type(fused).__name__, note, convs=1))
    return j - i


# ---- the walk ----

def _rewrite(module: nn.Module, path: str, use_fx: bool, uses: collections.Counter, names: dict[str, str],
             rows: list[FuseRow]) -> nn.Module:
    """`module` (of fuse()'s copy) with its patterns fused: a GraphModule when it traces, else itself with its
    children rewritten. names: the class name of each path in the user's model (a traced module keeps it)."""
    if isinstance(module, _FUSED_TYPES + _PLACEHOLDERS) or not module._modules:
        return module
    sequential = isinstance(module, nn.Sequential)
    if use_fx:
        gm, why_not = _trace(module, names.get(path, type(module).__name__))
        if gm is not None:
            _GraphRewrite(gm, path, rows).run()
            return gm
        rows.append(FuseRow.refused(path or "(model)", "torch.fx trace",
                                    f"{why_not}: rewriting its children instead"
                                    + ("" if sequential else " (residual adds in its own forward are not fused)"),
                                    convs=0))
    if sequential:
        _fuse_sequential(module, path, uses, rows)
    for name, child in list(module._modules.items()):
        if child is None:
            continue
        if isinstance(child, nn.Conv2d) and not isinstance(child, _FUSED_TYPES) and not sequential:
            # called from this forward, which runs as written: the report still counts it
            rows.append(FuseRow.refused(_join(path, name), type(child).__name__,
                                        f"called from the forward of {path or '(model)'}, which was not traced: "
                                        "patterns are fused in traced graphs and among an nn.Sequential's children",
                                        convs=1))
            continue
        new = _rewrite(child, _join(path, name), use_fx, uses, names, rows)
        if new is not child:
            module._modules[name] = new
    return module


def _global_pools(model: nn.Module) -> tuple[nn.Module, list[str]]:
    """In fuse()'s copy, GlobalAvgPool2d in place of every nn.AdaptiveAvgPool2d(1) and global_avg_pool2d in place of
    every F.adaptive_avg_pool2d(x, 1) call of a traced graph (see torch_cudnn_fusion/nn/pool.py); where, for the
    report. The new module takes the old one's state (hooks and mode included): it differs only in its forward."""
    where = []
    for path, m in list(model.named_modules(remove_duplicate=False)):
        if type(m) is nn.AdaptiveAvgPool2d and is_global(m.output_size):
            pool = GlobalAvgPool2d(m.output_size)
            pool.__dict__.update(m.__dict__)
            if path:
                _set_module(model, path, pool)
            else:
                model = pool
            where.append(path or "(model)")
        if isinstance(m, fx.GraphModule):
            changed = False
            for node in m.graph.nodes:
                if node.op != "call_function" or node.target is not F.adaptive_avg_pool2d:
                    continue
                size = node.args[1] if len(node.args) > 1 else node.kwargs.get("output_size")
                if len(node.args) + len(node.kwargs) == 2 and node.args and is_global(size):
                    node.target, node.args, node.kwargs = global_avg_pool2d, (node.args[0],), {}
                    where.append(f"{path or '(model)'}: F.adaptive_avg_pool2d ({node.name})")
                    changed = True
            if changed:
                m.recompile()
    return model, where


def _with_implementations(model: nn.Module, rows: list[FuseRow]) -> list[FuseRow]:
    out = []
    for row in rows:
        if row.replaced:
            status = model.get_submodule(row.path).fusion_status
            text = "decided on its first forward" if status == NOT_RUN else str(status)
            row = dataclasses.replace(row, implementation=text)
        out.append(row)
    return out


def fuse(model: nn.Module, example_input=None, *, use_fx: bool = True) -> tuple[nn.Module, FuseReport]:
    """A new model in which `model`'s Conv2d / BatchNorm2d / ReLU patterns run fused; returns (fused model, report).

    `model` itself is never changed. The fused model shares its Parameters and buffers (an optimizer built on either
    updates both, and state_dict keys are the same in both, so checkpoints move either way); its modules are its
    own (fused.train()/eval() do not change `model`'s mode, and a module replaced in one is not replaced in the
    other). It is a torch.fx.GraphModule when `model` traces the same in training and eval (use_fx=False skips
    tracing), else a copy of `model` whose submodules were rewritten (see the module docstring); the report says which.
    Its global average pools become GlobalAvgPool2d (report.pools). Call it before wrapping the model in
    DistributedDataParallel or torch.compile. With `example_input` the fused model
    runs one forward (buffers restored afterwards) so that the report says how each fused layer runs.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    rows: list[FuseRow] = []
    work = _shared_copy(model)
    uses = collections.Counter(id(m) for _, m in work.named_modules(remove_duplicate=False))
    names = {path: type(m).__name__ for path, m in model.named_modules()}
    result = _rewrite(work, "", use_fx, uses, names, rows)
    result, pools = _global_pools(result)
    missing = set(model.state_dict()) ^ set(result.state_dict())
    if missing:  # a bug of ours, not the user's: say so rather than hand out a model that would not load checkpoints
        raise RuntimeError(f"fuse(): the fused model's state_dict keys differ from the model's: {sorted(missing)[:5]}")
    if example_input is not None:
        inputs = example_input if isinstance(example_input, tuple) else (example_input,)
        with restoring_buffers(result):
            result(*inputs)
    return result, FuseReport(_with_implementations(result, rows), pools)
