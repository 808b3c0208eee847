"""How far eager float32 itself lands from float64 in a zoo model's training gradient, input draw by input draw and
layout by layout: the spread the GPU zoo test's rule (fused error <= 2 x eager's + a floor) has to live with.

One training step of the model (random weights, training mode, loss = sum(output * w) with w drawn in [0.5, 1.5)) in
float64, and in float32 in NCHW and in channels_last; for each float32 run, the global relative error of all the
Parameters' gradients against float64 (the GPU test's "gradient (global)"). Runs on the device given (the CPU by
default: no fused layer is involved, only eager's own rounding). The model and input size follow tests/zoo.py's
builder, the batch and the input's side the GPU whole-model test's (8, at least 128).

--largest K lists, for each draw's NCHW run, the K parameters whose gradient differs most from float64 in absolute
terms (the ones that make up the global error), with their relative error and the norm of their float64 gradient.

More columns, to place a fused model's error within that spread:
* --cudnn-off (CUDA): eager again with cuDNN disabled, so that ATen's own convolution and BatchNorm kernels round in
  their own way (NCHW and channels_last).
* --fused: the model through fuse(), channels_last (on the CPU its layers run eager, the same function as eager's).
* --rounding-moves K: no float32 arithmetic at all: the float64 gradient's own move when every input element is
  multiplied by 1 + u, u uniform in [-2^-24, 2^-24) (float32's rounding), K times; the largest of the K moves. Where a
  ReLU input sits within rounding of zero, the exact gradient jumps by this much, and no float32 computation of the
  step can be expected to land closer to float64 than such a jump.

    python benchmarks/eager_float32_spread.py --model timm:hrnet_w18_small [--draws 3] [--device cpu] [--largest 5]
        [--cudnn-off] [--fused] [--rounding-moves 2]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys

import torch

import torch_cudnn_fusion as tcf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from zoo import builder, global_rel, outputs  # noqa: E402

LAYOUTS = {"NCHW": torch.contiguous_format, "channels_last": torch.channels_last}
ROUNDING = 2.0 ** -24  # float32's unit roundoff


@dataclasses.dataclass(frozen=True)
class Run:
    """One float32 run of the training step: the layout, whether cuDNN is enabled, whether the model goes through
    fuse()."""
    layout: torch.memory_format
    cudnn: bool = True
    fused: bool = False


def runs(cudnn_off: bool, fused: bool) -> dict[str, Run]:
    chosen = {label: Run(layout) for label, layout in LAYOUTS.items()}
    if cudnn_off:
        chosen.update({f"{label}, cuDNN off": Run(layout, cudnn=False) for label, layout in LAYOUTS.items()})
    if fused:
        chosen["fused"] = Run(torch.channels_last, fused=True)
    return chosen


def gradients(model: torch.nn.Module, x: torch.Tensor, weights: list[torch.Tensor],
              called: torch.nn.Module | None = None) -> dict[str, torch.Tensor]:
    """`model`'s Parameter gradients (float64) after one step of `called` (`model` itself, or its fuse() result,
    which shares its Parameters)."""
    called = model if called is None else called
    called.train()
    loss = sum((o * w.to(o.dtype)).sum() for o, w in zip(outputs(called(x)), weights))
    loss.backward()
    return {name: p.grad.double() for name, p in model.named_parameters() if p.grad is not None}


def run_gradients(model: torch.nn.Module, x: torch.Tensor, weights: list[torch.Tensor],
                  run: Run) -> dict[str, torch.Tensor]:
    copied = copy.deepcopy(model).to(memory_format=run.layout)
    called = tcf.fuse(copied)[0] if run.fused else copied
    enabled = torch.backends.cudnn.enabled
    torch.backends.cudnn.enabled = run.cudnn
    try:
        return gradients(copied, x.contiguous(memory_format=run.layout), weights, called)
    finally:
        torch.backends.cudnn.enabled = enabled


def rounding_move(model: torch.nn.Module, x: torch.Tensor, weights: list[torch.Tensor],
                  reference: dict[str, torch.Tensor], generator: torch.Generator) -> float:
    """The float64 gradient's global move when each element of `x` is moved by up to float32's rounding."""
    x64 = x.double()
    u = torch.rand(x64.shape, dtype=torch.float64, generator=generator).to(x64.device) * 2 - 1
    moved = gradients(copy.deepcopy(model).double(), x64 * (1 + u * ROUNDING), weights)
    return global_rel([moved[n] for n in reference], list(reference.values()))


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
    parser.add_argument("--cudnn-off", action="store_true", help="eager runs with cuDNN disabled too (CUDA)")
    parser.add_argument("--fused", action="store_true", help="a run of the model through fuse(), channels_last")
    parser.add_argument("--rounding-moves", type=int, default=0, metavar="K",
                        help="the float64 gradient's largest move over K inputs moved by float32's rounding")
    args = parser.parse_args()
    if args.draws < 1:
        parser.error(f"--draws must be >= 1, got {args.draws}")
    if args.largest < 0:
        parser.error(f"--largest must be >= 0, got {args.largest}")
    if args.rounding_moves < 0:
        parser.error(f"--rounding-moves must be >= 0, got {args.rounding_moves}")
    if args.cudnn_off and not args.device.startswith("cuda"):
        parser.error(f"--cudnn-off needs a CUDA --device, got {args.device!r}")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    build, size = builder(args.model)
    torch.manual_seed(0)
    model = build().to(args.device)
    side = max(size, 128)
    print(f"{args.model}: float32's global gradient error against float64, batch 8, {side} x {side}, "
          f"{args.device}, torch {torch.__version__}")
    chosen = runs(args.cudnn_off, args.fused)
    labels = list(chosen) + (["float64, input rounded"] if args.rounding_moves else [])
    print("columns: " + "; ".join(f"{i + 1}: {label}" for i, label in enumerate(labels)))
    print(f"{'draw':>4}  " + "  ".join(f"{i + 1:>9}" for i in range(len(labels))))
    generator = torch.Generator().manual_seed(0)
    for draw in range(args.draws):
        torch.manual_seed(1 + draw)
        x = torch.randn(8, 3, side, side, device=args.device)
        with torch.no_grad():
            shapes = [o.shape for o in outputs(copy.deepcopy(model).eval()(x))]
        weights = [torch.rand(s, dtype=torch.float64, device=args.device) + 0.5 for s in shapes]
        reference = gradients(copy.deepcopy(model).double(), x.double(), weights)
        errors, first = [], None
        for run in chosen.values():
            result = run_gradients(model, x, weights, run)
            errors.append(global_rel([result[n] for n in reference], list(reference.values())))
            first = result if first is None else first
        if args.rounding_moves:
            errors.append(max(rounding_move(model, x, weights, reference, generator)
                              for _ in range(args.rounding_moves)))
        print(f"{draw:>4}  " + "  ".join(f"{e:>9.2e}" for e in errors), flush=True)
        for line in largest_differences(first, reference, args.largest):
            print(f"      {line}")


if __name__ == "__main__":
    main()
