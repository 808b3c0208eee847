"""BatchNorm's training forward in each implementation, layer by layer over a model's fused conv + BatchNorm layers:
our NHWC kernel (implementation 2: statistics, running-statistics update, step count, residual add and activation
in one launch) against the cuDNN batchnorm graph (implementation 0, with the launch that writes the running
statistics after it), the op's choice between them ("chosen": implementation 2 under cudnn.benchmark, which times
ours against the graph on a shape's first call and runs the faster; the row names the one chosen) and eager
(F.batch_norm, then the add and the activation module's function). "ours" is timed with cudnn.benchmark off, so that
it is our kernel on every layer; the rest with it on.

Each layer's BatchNorm input shape (its batch set to --batch), activation and residual come from a training-mode
forward of the fused model on a batch of 2 under bfloat16 autocast, channels_last. For every layer and implementation, the op that updates the running statistics in
place (cudnn_fusion::batch_norm_act_update) runs without grad on random bfloat16 input:
- GPU ms a call at the model's batch: 10 calls captured in a CUDA graph, the median of the replays (timing.
  graph_replay_ms), so the host's cost is not in it;
- host us a call at --host-batch (8 by default, where the GPU finishes first): timing.host_us.
Layers of the same shape, activation and residual are timed once (the count column says how many there are); the
sums over the model's layers, last, weigh each row by its count.

--layers START:END times only those kinds of layer (a Python slice of the list, in the order the rows print; the
sums then cover those).

    python benchmarks/batch_norm_forward.py [--model mobilenet_v2] [--batch 256] [--host-batch 8] [--layers 14:]
                                            [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion._cpp_enums import Activation
from torch_cudnn_fusion.nn.conv_bn import Conv2dBN
from torch_cudnn_fusion.ops.conv import eager_activation

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_by_kind import load_model, run_header  # noqa: E402
from timing import graph_replay_ms, host_us  # noqa: E402

IMPLEMENTATIONS = {"ours": 2, "cuDNN graph": 0}


def layers_of(model_name: str, batch: int) -> list[dict]:
    """(z's shape at `batch`, activation, residual) of the fused conv + BatchNorm layers, each kind once with its
    count, in the order a forward first runs it."""
    model = tcf.fuse(load_model(model_name).cuda().to(memory_format=torch.channels_last))[0]
    seen = []

    def hook(module, args, output):
        seen.append({"shape": (batch, *output.shape[1:]), "activation": module.activation,
                     "residual": len(args) > 1 and args[1] is not None})

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, Conv2dBN)]
    x = torch.randn(2, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    with torch.autocast("cuda", torch.bfloat16), torch.no_grad():
        model(x)  # training mode: the layers run their batch-statistics BatchNorm
    for handle in handles:
        handle.remove()
    kinds: dict[tuple, dict] = {}
    for layer in seen:
        key = (layer["shape"], layer["activation"], layer["residual"])
        kinds.setdefault(key, {**layer, "count": 0})["count"] += 1
    return list(kinds.values())


def layer_slice(spec: str | None) -> slice:
    """--layers' "START:END" (either may be left out) as a slice; None: all."""
    if spec is None:
        return slice(None)
    start, colon, end = spec.partition(":")
    try:
        if not colon:
            raise ValueError
        return slice(int(start) if start else None, int(end) if end else None)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--layers: expected START:END (e.g. 14: or 3:7), got {spec!r}") from None


def calls(layer: dict, batch: int) -> dict:
    """Each implementation's call of the layer's BatchNorm at `batch`, on inputs of its own."""
    shape = (batch, *layer["shape"][1:])
    c = shape[1]
    z = torch.randn(shape, device="cuda").to(torch.bfloat16).to(memory_format=torch.channels_last)
    residual = torch.randn_like(z) if layer["residual"] else None
    weight, bias = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    running_mean, running_var = torch.zeros(c, device="cuda"), torch.ones(c, device="cuda")
    count = torch.zeros((), dtype=torch.long, device="cuda")
    act = Activation.from_name(layer["activation"])
    op = torch.ops.cudnn_fusion.batch_norm_act_update.default

    def fused(implementation):
        return lambda: op(z, weight, bias, running_mean, running_var, count, residual, 0.1, 1e-5, int(act),
                          implementation)

    def eager():
        y = F.batch_norm(z, running_mean, running_var, weight, bias, True, 0.1, 1e-5)
        return eager_activation(y + residual if residual is not None else y, act, 0.01)

    return {**{name: fused(code) for name, code in IMPLEMENTATIONS.items()}, "chosen": fused(2), "eager": eager}


def chosen(shape: tuple) -> str:
    """Which implementation the op chose for the in-place forward of `shape` (tcf.batch_norm_forward_choices)."""
    made = [c for c in tcf.batch_norm_forward_choices() if tuple(c["x_size"]) == tuple(shape) and c["in_place"]]
    return made[0]["choice"] if made else "none timed"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--host-batch", type=int, default=8)
    p.add_argument("--layers", type=layer_slice, default=slice(None), help="START:END, a slice of the kinds of layer")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    torch.manual_seed(0)
    # the shapes first, without cudnn.benchmark: under it every BatchNorm layer of the batch-2 forward would time
    # its forward choice (ours or the graph) for shapes nothing here times
    layers = layers_of(args.model, args.batch)[args.layers]
    torch.backends.cudnn.benchmark = True
    rows = []
    with torch.no_grad():
        for layer in layers:
            row = {**layer, "gpu_ms": {}, "host_us": {}}
            for name, fn in calls(layer, args.batch).items():
                torch.backends.cudnn.benchmark = name != "ours"
                row["gpu_ms"][name] = graph_replay_ms(fn)
            for name, fn in calls(layer, args.host_batch).items():
                torch.backends.cudnn.benchmark = name != "ours"
                row["host_us"][name] = host_us(fn, calls=50)
            torch.backends.cudnn.benchmark = True
            row["chosen"] = chosen(layer["shape"])
            rows.append(row)
            residual = "+res" if layer["residual"] else ""
            what = f"{layer['count']:3d} x {str(layer['shape']):<22}{str(layer['activation']):<8}{residual:<5}"
            print(what + "".join(f"{name} {row['gpu_ms'][name]:.4f} ms / {row['host_us'][name]:.1f} us   "
                                 for name in row["gpu_ms"]) + f"chosen: {row['chosen']}", flush=True)
    names = list(rows[0]["gpu_ms"])
    header = run_header(args)
    layers = sum(r["count"] for r in rows)
    print(f"\n{args.model}: {layers} conv + BatchNorm layers' BatchNorm forward (batch_norm_act_update, no grad, "
          f"bf16, channels_last) on {header['gpu']}, torch {header['torch']}, cuDNN {header['cudnn']}")
    gpu_title, host_title = f"GPU ms, sum at batch {args.batch}", f"host us, sum at batch {args.host_batch}"
    print(f"{'implementation':<16}{gpu_title:>30}{host_title:>30}{'layers faster on GPU than eager':>34}")
    for name in names:
        gpu = sum(r["gpu_ms"][name] * r["count"] for r in rows)
        host = sum(r["host_us"][name] * r["count"] for r in rows)
        faster = sum(r["count"] for r in rows if r["gpu_ms"][name] < r["gpu_ms"]["eager"])
        print(f"{name:<16}{gpu:>30.3f}{host:>30.1f}{faster:>28d} of {layers}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "host_batch": args.host_batch, "layers": [args.layers.start, args.layers.stop],
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
