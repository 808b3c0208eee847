"""Where a training conv + BatchNorm (+ activation) layer's host time goes: untraced host microseconds a call, for each
of a model's Conv2dBNReLU layers (--module Conv2dBN: its Conv2dBN layers, with SiLU, Hardswish or no activation),
called one layer at a time ("hot": 20 calls of the same layer) and in the model's order
("in turn": every layer once, 20 times over), eager's modules beside the fused layer and its pieces. Every row times
the layers that have a C++ record (a space-to-depth stem has one too since 30a). bf16 autocast, channels_last,
cudnn.benchmark on (profile_by_kind.setup), after three training steps of each variant.

Rows (each the mean over the layers, a median over 5 rounds; the rows take turns within a round):
- eager modules: nn.Conv2d + nn.BatchNorm2d + the activation module, with grad (torchvision's Conv2dNormActivation);
- fused module: the Conv2dBNReLU (Conv2dBN) fuse() made, with grad;
- fused, C++ record: the layer's recorded call (csrc/ops/conv_bn_call.h) run directly, without the module's Python;
- op via torch.ops, with grad / no grad: cudnn_fusion::conv_batch_norm_act called from Python (its argument parsing
  included); the two differ by the two autograd nodes;
- the op's parts, no grad: eager's conv alone, ATen's batch_norm, our batch_norm_act op (cuDNN graph, legacy API).
At a small batch the GPU finishes first, so the times are the host's; at the model's batch a layer whose kernels take
longer than its host time shows the GPU's.

    python benchmarks/layer_host_time.py [--model regnet_y_400mf] [--module Conv2dBNReLU|Conv2dBN] [--batches 8 128]
                                         [--rows "fused module" ...]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from torch_cudnn_fusion._cpp_enums import Activation

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_by_kind import setup  # noqa: E402

ROWS = ("eager modules", "fused module", "fused, C++ record", "op via torch.ops, with grad", "op via torch.ops, no grad",
        "eager conv alone, no grad", "ATen batch_norm, no grad", "batch_norm_act op (cuDNN graph), no grad",
        "batch_norm_act op (legacy API), no grad")


def warm_up(model, x, steps: int = 3) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(steps):
        with torch.autocast("cuda", torch.bfloat16):
            out = model(x)
        out.float().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


def layer_inputs(plain, names, x) -> dict:
    """Each named eager layer's input at this batch, from one forward."""
    seen = {}
    modules = dict(plain.named_modules())
    hooks = [modules[n].register_forward_hook(
        lambda module, inputs, output, n=n: seen.__setitem__(n, inputs[0].detach())) for n in names]
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        plain(x)
    for hook in hooks:
        hook.remove()
    return seen


def conv_output_and_statistics(conv, bn, x) -> tuple:
    """The eager conv's output for x (the BatchNorm rows' input) and copies of the BatchNorm's scale, shift and
    running statistics (the calls update copies, not the model's)."""
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        z = conv(x)
    return z, (bn.weight.detach(), bn.bias.detach(), bn.running_mean.clone(), bn.running_var.clone())


def calls(row: str, names, eager_modules, fused_modules, inputs) -> list:
    """One callable per layer for `row` (layers a row cannot run are left out)."""
    autocast = torch.autocast("cuda", torch.bfloat16)
    ops = torch.ops.cudnn_fusion
    fns = []
    for n in names:
        eager, fused, x = eager_modules[n], fused_modules[n + ".0"], inputs[n]
        xg = x.clone().requires_grad_()
        conv, bn = eager[0], eager[1]
        act = int(Activation.from_name(fused.activation))
        if row in ("eager modules", "fused module"):
            module = eager if row == "eager modules" else fused

            def fn(module=module, xg=xg):
                with autocast:
                    return module(xg)
        elif row == "fused, C++ record":
            fbn = fused.bn

            def fn(fused=fused, fbn=fbn, xg=xg):
                with autocast:
                    return fused._call.recorded.run(xg, fused.weight, fused.bias, fbn.weight, fbn.bias,
                                                    fbn.running_mean, fbn.running_var, fbn.num_batches_tracked, None,
                                                    0.1)
        elif row.startswith("op via torch.ops"):
            grad = row.endswith("with grad")
            fbn = fused.bn
            mean, var = fbn.running_mean.clone(), fbn.running_var.clone()

            def fn(fused=fused, fbn=fbn, xg=xg, grad=grad, mean=mean, var=var):
                with torch.set_grad_enabled(grad):
                    return ops.conv_batch_norm_act(xg, fused.weight, fused.bias, list(fused.stride),
                                                   list(fused.padding), list(fused.dilation), fused.groups,
                                                   fbn.weight, fbn.bias, mean, var, None, None, 0.1, fbn.eps, act,
                                                   0, torch.bfloat16, 0)
        elif row == "eager conv alone, no grad":
            def fn(conv=conv, x=x):
                with torch.no_grad(), autocast:
                    return conv(x)
        elif row == "ATen batch_norm, no grad":
            z, stats = conv_output_and_statistics(conv, bn, x)

            def fn(z=z, stats=stats):
                with torch.no_grad():
                    return F.batch_norm(z, stats[2], stats[3], stats[0], stats[1], True, 0.1, 1e-5)
        else:
            z, stats = conv_output_and_statistics(conv, bn, x)
            implementation = 0 if "graph" in row else 1

            def fn(z=z, stats=stats, implementation=implementation, act=act):
                with torch.no_grad():
                    return ops.batch_norm_act(z, stats[0], stats[1], stats[2], stats[3], None, 0.1, 1e-5, act,
                                              implementation, 0)
        fns.append(fn)
    return fns


def seconds(fns, repeats: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        for fn in fns:
            fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="regnet_y_400mf")
    parser.add_argument("--module", default="Conv2dBNReLU", choices=("Conv2dBNReLU", "Conv2dBN"),
                        help="the fused layers to time (Conv2dBN: those without ReLU)")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 128])
    parser.add_argument("--rows", nargs="+", default=ROWS, choices=ROWS, metavar="ROW", help="a subset of the rows")
    args = parser.parse_args()
    plain, x, _, variants = setup(args.model, max(args.batches))
    eager, fused = variants["eager"](), variants["fused"]()
    warm_up(eager, x)
    warm_up(fused, x)
    eager_modules, fused_modules = dict(eager.named_modules()), dict(fused.named_modules())
    names = [n[:-2] for n, m in fused_modules.items()
             if type(m).__name__ == args.module and n.endswith(".0") and n[:-2] in eager_modules]
    activations = sorted({str(fused_modules[n + ".0"].activation) for n in names})
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"{args.model}: {len(names)} {args.module} layers (activations {', '.join(activations)}); host us a call, "
          "mean over the layers, median of 5 rounds")
    for batch in args.batches:
        inputs = layer_inputs(eager, names, x[:batch])
        for fn in calls("fused module", names, eager_modules, fused_modules, inputs):
            fn()  # decided and recorded anew at this batch
        # every row times the same layers: those with a C++ record (a layer without one runs the module's Python
        # path on each call, which would weigh on the module row's mean alone; before 30a the stem's form had none)
        timed = [n for n in names if fused_modules[n + ".0"]._call.recorded is not None]
        print(f"\nbatch {batch}: the {len(timed)} of {len(names)} layers with a C++ record"
              f"\n{'what':<44}{'hot':>8}{'in turn':>9}")
        fns = {row: calls(row, timed, eager_modules, fused_modules, inputs) for row in args.rows}
        for row, row_fns in fns.items():
            for fn in row_fns:  # a changed batch is decided (and recorded) anew, and plans are built, here
                fn()
                assert fn() is not None, (row, "the record declined the call: nothing would be timed")
        # the rows take turns within each round, so that a drift of the host's speed moves them alike
        hot, in_turn = {row: [] for row in fns}, {row: [] for row in fns}
        for _ in range(5):
            for row, row_fns in fns.items():
                hot[row].append(sum(seconds([fn], 20) for fn in row_fns) / (20 * len(row_fns)) * 1e6)
                in_turn[row].append(seconds(row_fns, 20) / (20 * len(row_fns)) * 1e6)
        for row in fns:
            print(f"{row:<44}{statistics.median(hot[row]):>8.1f}{statistics.median(in_turn[row]):>9.1f}", flush=True)


if __name__ == "__main__":
    main()
