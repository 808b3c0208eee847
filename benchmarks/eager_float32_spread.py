"""How far eager float32 itself lands from float64 in a zoo model's training gradient, input draw by input draw and
layout by layout: the spread the GPU zoo test's rule (fused error <= 2 x eager's + a floor) has to live with.

One training step of the model (random weights, training mode, loss = sum(output * w) with w drawn in [0.5, 1.5)) in
float64, and in float32 in NCHW and in channels_last; for each float32 run, the global relative error of all the
Parameters' gradients against float64 (the GPU test's "gradient (global)"). Runs on the device given (the CPU by
default: no fused layer is involved, only eager's own rounding). The model and input size follow tests/zoo.py's
builder, the batch and the input's side the GPU whole-model test's (8, at least 128).

    python benchmarks/eager_float32_spread.py --model timm:hrnet_w18_small [--draws 3] [--device cpu]
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


def gradients(model: torch.nn.Module, x: torch.Tensor, weights: list[torch.Tensor]) -> list[torch.Tensor]:
    model.train()
    loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outputs(model(x)), weights))
    loss.backward()
    return [p.grad.double() for p in model.parameters() if p.grad is not None]


def global_rel(values: list[torch.Tensor], references: list[torch.Tensor]) -> float:
    difference = sum(((v - r) ** 2).sum() for v, r in zip(values, references)) ** 0.5
    return float(difference / sum((r ** 2).sum() for r in references) ** 0.5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="timm:hrnet_w18_small", help="library:name, as tests/zoo.py names models")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    if args.draws < 1:
        parser.error(f"--draws must be >= 1, got {args.draws}")
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
        errors = []
        for layout in LAYOUTS.values():
            run = copy.deepcopy(model).to(memory_format=layout)
            errors.append(global_rel(gradients(run, x.contiguous(memory_format=layout), weights), reference))
        print(f"{draw:>4}  " + "  ".join(f"{e:>13.3e}" for e in errors), flush=True)


if __name__ == "__main__":
    main()
