"""fuse(model): rewrite a model's Conv2d / BatchNorm2d / ReLU patterns into fused modules, with a report.

Patterns (each node's output used only by the next):
    Conv2d -> BatchNorm2d -> ReLU | ReLU6   => Conv2dBNReLU
    Conv2d -> BatchNorm2d                  => Conv2dBN
    Conv2d -> BatchNorm2d -> add -> ReLU    => Conv2dBNAddReLU   (needs torch.fx: the add is in forward's code)
    Conv2d -> add -> ReLU                   => Conv2dAddReLU     (torch.fx)
    Conv2d -> ReLU                          => Conv2dReLU
    BatchNorm2d -> ReLU | ReLU6 (no conv)  => BatchNorm2dReLU

The model is traced with torch.fx where it can be (the result is a torch.fx.GraphModule holding the same
submodules); where it cannot, the children of every nn.Sequential are rewritten in place. Either way Parameters and
buffers stay the same objects (an optimizer built before or after fuse() updates the fused model) and state_dict keys
do not change: a fused conv takes the conv's place, and the BatchNorm it absorbed stays at its own path as a
BatchNorm2dFused (parameters and statistics kept, input passed through). A checkpoint of the plain model loads into
the fused one, and the fused model's state_dict loads into the plain model: that is the way back.
"""

from __future__ import annotations

import collections
import operator
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import fx, nn

from . import fusion

from .nn import (ActivationFused, BatchNorm2dFused, BatchNorm2dReLU, Conv2dAddReLU, Conv2dBN, Conv2dBNAddReLU,
                 Conv2dBNReLU, Conv2dReLU, FusedConv2d)

_BATCH_NORMS = (nn.BatchNorm2d, nn.SyncBatchNorm)
_FUSED_TYPES = (FusedConv2d, BatchNorm2dReLU, BatchNorm2dFused, ActivationFused)
_OTHER_ACTIVATIONS = (nn.SiLU, nn.GELU, nn.Hardswish, nn.Hardsigmoid, nn.LeakyReLU, nn.ELU, nn.SELU, nn.Sigmoid,
                      nn.Tanh, nn.Mish, nn.PReLU, nn.Hardtanh)
_OTHER_ACTIVATION_FUNCTIONS = {F.silu, F.gelu, F.hardswish, F.leaky_relu, F.elu, torch.sigmoid, torch.tanh, F.mish,
                               torch.nn.functional.hardtanh}


@dataclass(frozen=True)
class FuseRow:
    path: str  # the module path of the pattern's first module
    pattern: str  # e.g. "Conv2d -> BatchNorm2d -> ReLU"
    fused: bool  # replaced by a fused module
    module: str  # the fused module's class, or "" when not replaced
    implementation: str  # how it runs: from its fusion_status once it ran (fuse(..., example_input) runs it)
    reason: str  # why not fused, or a note


class FuseReport(list):
    """A list of FuseRow that prints as a table."""

    @property
    def fused(self) -> list[FuseRow]:
        return [r for r in self if r.fused]

    @property
    def not_fused(self) -> list[FuseRow]:
        return [r for r in self if not r.fused]

    def __str__(self) -> str:
        if not self:
            return "fuse(): no Conv2d / BatchNorm2d / ReLU patterns found"
        headers = ("layer", "pattern", "fused", "module", "implementation / reason")
        rows = [(r.path, r.pattern, "yes" if r.fused else "no", r.module,
                 r.implementation + (f" — {r.reason}" if r.reason and r.fused else r.reason if not r.fused else ""))
                for r in self]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers[:-1])]
        line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  " + cells[-1]
        return "\n".join([line(headers)] + [line(row) for row in rows])


class _Tracer(fx.Tracer):
    """Keeps fused modules whole (they are Python code outside torch.nn, which fx would otherwise trace into)."""

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, _FUSED_TYPES) or super().is_leaf_module(m, qualname)


def _activation_of_module(m: nn.Module) -> Optional[str]:
    if type(m) is nn.ReLU:
        return "relu"
    if type(m) is nn.ReLU6:
        return "relu6"
    return None


def _activation_of_node(node: fx.Node, modules: dict) -> tuple[Optional[str], str]:
    """(fusable activation or None, the node's name for the report: '' when it is not an activation at all)."""
    if node.op == "call_module":
        m = modules[node.target]
        act = _activation_of_module(m)
        if act:
            return act, type(m).__name__
        return None, type(m).__name__ if isinstance(m, _OTHER_ACTIVATIONS) else ""
    if node.op == "call_function":
        if node.target in (F.relu, torch.relu, torch.relu_):
            return "relu", "relu"
        if node.target is F.relu6:
            return "relu6", "relu6"
        if node.target in _OTHER_ACTIVATION_FUNCTIONS:
            return None, getattr(node.target, "__name__", str(node.target))
    if node.op == "call_method" and node.target in ("relu", "relu_"):
        return "relu", "relu"
    return None, ""


def _is_add(node: fx.Node) -> bool:
    if node.op == "call_function" and node.target in (operator.add, operator.iadd, torch.add):
        return len(node.args) == 2 and not node.kwargs
    return node.op == "call_method" and node.target in ("add", "add_") and len(node.args) == 2 and not node.kwargs


def _sole_user(node: fx.Node) -> Optional[fx.Node]:
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _set_module(root: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent_path) if parent_path else root, name, module)


def _absorb_bn(bn: nn.BatchNorm2d, fused_into: str) -> None:
    bn.__class__ = BatchNorm2dFused  # same object: its Parameters, buffers and state_dict keys stay in place
    bn.fused_into = fused_into


def _bn_row_problem(bn: nn.Module) -> str:
    if isinstance(bn, nn.SyncBatchNorm):
        return ("SyncBatchNorm: its statistics are reduced across processes, which the fused BatchNorm does not do; "
                "kept as is")
    if type(bn) is not nn.BatchNorm2d:
        return f"{type(bn).__name__} is a BatchNorm2d subclass whose behaviour fuse() cannot know; kept as is"
    return ""


def _pattern_name(parts: list[str]) -> str:
    return " -> ".join(parts)


def _fused_module(conv: nn.Conv2d, bn: Optional[nn.BatchNorm2d], residual: bool, act: Optional[str]):
    """The fused module for a matched chain, or (None, reason)."""
    if bn is not None:
        if residual:
            if act != "relu":
                return None, "a residual add is fused only when a ReLU follows it"
            return Conv2dBNAddReLU.from_modules(conv, bn, bn_registered_elsewhere=True), ""
        if act is None:
            return Conv2dBN.from_modules(conv, bn, bn_registered_elsewhere=True), ""
        return Conv2dBNReLU.from_modules(conv, bn, activation=act, bn_registered_elsewhere=True), ""
    if act == "relu":
        return (Conv2dAddReLU if residual else Conv2dReLU).from_conv(conv), ""
    if act == "relu6":
        return None, "Conv2d -> ReLU6 without a BatchNorm: the fused conv graph applies ReLU only"
    return None, ""


def _note_for(conv: nn.Conv2d, bn) -> str:
    if conv.groups > 1 and bn is None:
        return "grouped/depthwise conv: runs eager (cuDNN's fused grouped conv measured 6-9x slower)"
    if conv.groups > 1:
        return ("grouped/depthwise conv: it runs PyTorch's own kernel (cuDNN's fused grouped conv measured 6-9x "
                "slower); BatchNorm and activation fused")
    return ""


def _fuse_graph(gm: fx.GraphModule, rows: list[FuseRow]) -> None:
    modules = dict(gm.named_modules())
    calls = collections.Counter(n.target for n in gm.graph.nodes if n.op == "call_module")
    consumed: set[fx.Node] = set()
    for node in list(gm.graph.nodes):
        if node in consumed or node.op != "call_module":
            continue
        m = modules[node.target]
        if isinstance(m, _FUSED_TYPES) and not isinstance(m, (BatchNorm2dFused, ActivationFused)):
            rows.append(FuseRow(node.target, type(m).__name__, True, type(m).__name__, "", "already fused"))
            continue
        if type(m) is nn.Conv2d:
            _match_conv(gm, node, modules, calls, consumed, rows)
        elif isinstance(m, nn.BatchNorm2d) and not isinstance(m, BatchNorm2dFused):
            _match_bn_relu(gm, node, modules, calls, consumed, rows)
    gm.graph.lint()
    gm.recompile()


def _match_conv(gm, node, modules, calls, consumed, rows) -> None:
    path = node.target
    conv = modules[path]
    parts, chain = ["Conv2d"], [node]
    bn = None
    cur = node
    nxt = _sole_user(cur)
    if nxt is not None and nxt.op == "call_module" and isinstance(modules[nxt.target], _BATCH_NORMS):
        problem = _bn_row_problem(modules[nxt.target])
        if problem:
            rows.append(FuseRow(path, _pattern_name(parts + [type(modules[nxt.target]).__name__]), False, "", "",
                                problem))
            return
        bn, cur = modules[nxt.target], nxt
        parts.append("BatchNorm2d")
        chain.append(nxt)
    residual_node = None
    nxt = _sole_user(cur)
    if nxt is not None and _is_add(nxt):
        after = _sole_user(nxt)
        if after is not None and _activation_of_node(after, modules)[0] == "relu":
            other = nxt.args[1] if nxt.args[0] is cur else nxt.args[0]
            if isinstance(other, fx.Node) and (nxt.args[0] is cur) != (nxt.args[1] is cur):
                residual_node, cur = other, nxt
                parts.append("add")
                chain.append(nxt)
    act = None
    nxt = _sole_user(cur)
    unfused_activation = ""
    if nxt is not None:
        act, name = _activation_of_node(nxt, modules)
        if act is not None:
            parts.append(name)
            chain.append(nxt)
        elif name:
            unfused_activation = name
    if len(chain) == 1:
        if unfused_activation:
            rows.append(FuseRow(path, f"Conv2d -> {unfused_activation}", False, "", "",
                                f"{unfused_activation}: the fused graphs express ReLU and ReLU6 (clipped ReLU) only"))
        return
    pattern = _pattern_name(parts)
    for n in chain:
        # a stateless activation module may be shared (torchvision's ResNet blocks call one ReLU twice)
        if n.op == "call_module" and calls[n.target] > 1 and not _activation_of_module(modules[n.target]):
            rows.append(FuseRow(path, pattern, False, "", "",
                                f"{n.target} is called {calls[n.target]} times in forward: fusing it would change "
                                "its other calls"))
            return
    fused, reason = _fused_module(conv, bn, residual_node is not None, act)
    if fused is None:
        rows.append(FuseRow(path, pattern, False, "", "", reason))
        return
    _set_module(gm, path, fused)
    if residual_node is not None:
        node.args = (node.args[0], residual_node)
    chain[-1].replace_all_uses_with(node)
    for n in reversed(chain[1:]):
        consumed.add(n)
        gm.graph.erase_node(n)
        if n.op == "call_module":
            target = modules[n.target]
            if isinstance(target, nn.BatchNorm2d):
                _absorb_bn(target, path)
            # activation modules stay: they hold no state, and a shared one may still be called elsewhere
    note = _note_for(conv, bn)
    if unfused_activation:
        note = f"{unfused_activation} after it not fused (the fused graphs express ReLU and ReLU6 only)"
    rows.append(FuseRow(path, pattern, True, type(fused).__name__, "", note))


def _match_bn_relu(gm, node, modules, calls, consumed, rows) -> None:
    path = node.target
    bn = modules[path]
    nxt = _sole_user(node)
    if nxt is None:
        return
    act, name = _activation_of_node(nxt, modules)
    if act is None:
        return
    pattern = f"BatchNorm2d -> {name}"
    problem = _bn_row_problem(bn)
    if problem or calls[path] > 1:
        rows.append(FuseRow(path, pattern, False, "", "", problem or "called more than once in forward"))
        return
    _set_module(gm, path, BatchNorm2dReLU.from_bn(bn, activation=act))
    nxt.replace_all_uses_with(node)
    consumed.add(nxt)
    gm.graph.erase_node(nxt)
    rows.append(FuseRow(path, pattern, True, "BatchNorm2dReLU", "", ""))


def _fuse_sequentials(model: nn.Module, rows: list[FuseRow]) -> None:
    """The same patterns among consecutive children of each nn.Sequential (no residual adds: they live in forward)."""
    uses = collections.Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    for seq_path, seq in list(model.named_modules()):
        if not isinstance(seq, nn.Sequential):
            continue
        children = list(seq._modules.items())
        i = 0
        while i < len(children):
            name, m = children[i]
            path = f"{seq_path}.{name}" if seq_path else name
            following = [c for _, c in children[i + 1:i + 3]]
            if isinstance(m, _FUSED_TYPES) and not isinstance(m, (BatchNorm2dFused, ActivationFused)):
                rows.append(FuseRow(path, type(m).__name__, True, type(m).__name__, "", "already fused"))
                i += 1
                continue
            if type(m) is nn.Conv2d:
                i += _sequential_conv(model, seq, seq_path, children, i, uses, rows)
                continue
            if type(m) is nn.BatchNorm2d and following and _activation_of_module(following[0]):
                act = _activation_of_module(following[0])
                _, act_name = children[i + 1]
                if uses[id(m)] > 1:
                    rows.append(FuseRow(path, f"BatchNorm2d -> {type(following[0]).__name__}", False, "", "",
                                        "the module is used more than once in the model"))
                else:
                    seq._modules[name] = BatchNorm2dReLU.from_bn(m, activation=act)
                    seq._modules[act_name] = ActivationFused(following[0], path)
                    rows.append(FuseRow(path, f"BatchNorm2d -> {type(following[0]).__name__}", True,
                                        "BatchNorm2dReLU", "", ""))
                i += 2
                continue
            i += 1


def _sequential_conv(model, seq, seq_path, children, i, uses, rows) -> int:
    name, conv = children[i]
    path = f"{seq_path}.{name}" if seq_path else name
    parts, absorbed = ["Conv2d"], []
    bn = None
    j = i + 1
    if j < len(children) and isinstance(children[j][1], _BATCH_NORMS):
        problem = _bn_row_problem(children[j][1])
        if problem:
            rows.append(FuseRow(path, f"Conv2d -> {type(children[j][1]).__name__}", False, "", "", problem))
            return 2
        bn = children[j][1]
        parts.append("BatchNorm2d")
        absorbed.append(children[j])
        j += 1
    act = None
    unfused_activation = ""
    if j < len(children):
        act = _activation_of_module(children[j][1])
        if act:
            parts.append(type(children[j][1]).__name__)
            absorbed.append(children[j])
            j += 1
        elif isinstance(children[j][1], _OTHER_ACTIVATIONS):
            unfused_activation = type(children[j][1]).__name__
    if not absorbed:
        if unfused_activation:
            rows.append(FuseRow(path, f"Conv2d -> {unfused_activation}", False, "", "",
                                f"{unfused_activation}: the fused graphs express ReLU and ReLU6 (clipped ReLU) only"))
        return 1
    pattern = _pattern_name(parts)
    if any(uses[id(m)] > 1 for m in [conv] + [m for _, m in absorbed]):
        rows.append(FuseRow(path, pattern, False, "", "", "a module of the pattern is used more than once in the "
                            "model: fusing it would change its other uses"))
        return j - i
    fused, reason = _fused_module(conv, bn, False, act)
    if fused is None:
        rows.append(FuseRow(path, pattern, False, "", "", reason))
        return j - i
    seq._modules[name] = fused
    for child_name, child in absorbed:
        if isinstance(child, nn.BatchNorm2d):
            _absorb_bn(child, path)
        else:
            seq._modules[child_name] = ActivationFused(child, path)
    note = _note_for(conv, bn)
    if unfused_activation:
        note = f"{unfused_activation} after it not fused (the fused graphs express ReLU and ReLU6 only)"
    rows.append(FuseRow(path, pattern, True, type(fused).__name__, "", note))
    return j - i


def _with_implementations(model: nn.Module, rows: list[FuseRow]) -> list[FuseRow]:
    out = []
    for row in rows:
        if row.fused:
            status = model.get_submodule(row.path).fusion_status
            text = "decided on its first forward" if status == fusion.NOT_RUN else str(status)
            row = FuseRow(row.path, row.pattern, row.fused, row.module, text, row.reason)
        out.append(row)
    return out


def _run_example(model: nn.Module, example_input) -> None:
    """One forward on example_input, so every fused layer decides how it runs; buffers (running statistics,
    num_batches_tracked) are restored afterwards."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    inputs = example_input if isinstance(example_input, tuple) else (example_input,)
    try:
        model(*inputs)
    finally:
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


def fuse(model: nn.Module, example_input=None, *, use_fx: bool = True) -> tuple[nn.Module, FuseReport]:
    """Rewrite `model`'s Conv2d / BatchNorm2d / ReLU patterns into fused modules; returns (model, report).

    The returned model is a torch.fx.GraphModule over the same submodules when `model` traces (use_fx=False skips
    tracing), else `model` itself with its nn.Sequential children rewritten in place. Call it before wrapping the
    model in DistributedDataParallel or torch.compile; an optimizer may be built before or after (the Parameters
    are the same objects). With `example_input` the model runs one forward (running statistics restored) so that
    the report says how each fused layer runs. Fusing twice changes nothing.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    rows: list[FuseRow] = []
    result = model
    traced = None
    if isinstance(model, fx.GraphModule):
        traced = model  # fused before (or traced by the user): rewrite its graph as it is
    elif use_fx:
        try:
            tracer = _Tracer()
            graph = tracer.trace(model)
            traced = fx.GraphModule(tracer.root, graph, type(model).__name__)
            traced.train(model.training)
            if set(traced.state_dict()) != set(model.state_dict()):
                rows.append(FuseRow("(model)", "torch.fx trace", False, "", "", "the traced model does not hold every "
                                    "module of the original (some are not called in forward); rewriting nn.Sequential "
                                    "children instead"))
                traced = None
        except Exception as error:  # noqa: BLE001 — any tracing failure means: use the Sequential walk
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            rows.append(FuseRow("(model)", "torch.fx trace", False, "", "",
                                f"not traceable by torch.fx ({type(error).__name__}: {first_line}); rewriting "
                                "nn.Sequential children only (residual adds in forward are not fused)"))
            traced = None
    if traced is not None:
        _fuse_graph(traced, rows)
        result = traced
    else:
        _fuse_sequentials(model, rows)
    if example_input is not None:
        _run_example(result, example_input)
    return result, FuseReport(_with_implementations(result, rows))
