"""How far eager float32 itself lands from float64 in a zoo model's training gradient, input draw by input draw and
layout by layout: the spread the GPU zoo test's rule (fused error <= 2 x eager's + a floor) has to live with.

One training step of the model (random weights, training mode, loss = sum(output * w) with w drawn in [0.5, 1.5)) in
float64, and in float32 in NCHW and in channels_last; for each float32 run, the global relative error of all the
Parameters' gradients against float64 (the GPU test's "gradient (global)"). Runs on the device given (the CPU by
default: no fused layer is involved, only eager's own rounding). The model and input size follow tests/zoo.py's
builder, the batch and the input's side the GPU whole-model test's (8, at least 128).

--largest K lists, for each draw's NCHW run, the K parameters whose gradient differs most from float64 in absolute
terms (the ones that make up the global error), with their relative error and the norm of their float64 gradient.

    python benchmarks/eager_float32_spread.py --model timm:hrnet_w18_small [--draws 3] [--device cpu] [--largest 5]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from zoo import builder, outputs  # noqa: E402

LAYOUTS = {"NCHW": torch.contiguous_format, "channels_last": torch.channels_last}


def gradients(model: torch.nn.Module, x: torch.Tensor, weights: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    model.train()
    loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outputs(model(x)), weights))
    loss.backward()
    return {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}


def global_rel(values: list[torch.Tensor], references: list[torch.Tensor]) -> float:
    difference = sum(((v - r) ** 2).sum() for v, r in zip(values, references)) ** 0.5
    return float(difference / sum((r ** 2).sum() for r in references) ** 0.5)


def largest_differences(values: dict[str, torch.Tensor], references: dict[str, torch.Tensor], count: int) -> list[str]:
    """The `count` parameters whose gradient is furthest from float64's (absolute norm), described."""
    rows = sorted(((float((values[n] - r).norm()), n) for n, r in references.items()), reverse=True)[:count]
    return [f"{n}: |difference| {d:.3e}, relative {d / max(float(references[n].norm()), 1e-30):.2e}, "
            f"|float64 gradient| {float(references[n].norm()):.3e}" for d, n in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="timm:hrnet_w18_small", help="library:name, as tests/zoo.py names models")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--largest", type=int, default=0, help="list the K parameters furthest from float64")
    args = parser.parse_args()
    if args.draws < 1:
        parser.error(f"--draws must be >= 1, got {args.draws}")
    if args.largest < 0:
        parser.error(f"--largest must be >= 0, got {args.largest}")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    build, size = builder(args.model)
    torch.manual_seed(0)
    model = build().to(args.device)
    side = max(size, 128)
    print(f"{args.model}: float32 eager's global gradient error against float64, batch 8, {side} x {side}, "
          f"{args.device}, torch {torch.__version__}")
    print(f"{'draw':>4}  " + "  ".join(f"{label:>13}" for label in LAYOUTS))
    for draw in range(args.draws):
        torch.manual_seed(1 + draw)
        x = torch.randn(8, 3, side, side, device=args.device)
        with torch.no_grad():
            shapes = [o.shape for o in outputs(copy.deepcopy(model).eval()(x))]
        weights = [torch.rand(s, dtype=torch.float64, device=args.device) + 0.5 for s in shapes]
        reference = gradients(copy.deepcopy(model).double(), x.double(), weights)
        errors, runs = [], []
        for layout in LAYOUTS.values():
            run = gradients(copy.deepcopy(model).to(memory_format=layout), x.contiguous(memory_format=layout), weights)
            errors.append(global_rel([run[n] for n in reference], list(reference.values())))
            runs.append(run)
        print(f"{draw:>4}  " + "  ".join(f"{e:>13.3e}" for e in errors), flush=True)
        for line in largest_differences(runs[0], reference, args.largest):
            print(f"      {line}")


if __name__ == "__main__":
    main()
