"""BatchNorm's training backward in each implementation, layer by layer over a model's fused conv + BatchNorm layers
(the shapes, activations and residuals batch_norm_forward.py finds): the backward of cudnn_fusion::batch_norm_act
as its autograd node runs it after our forward kernel (implementation 2) and after the cuDNN graph's (0), against
eager's (F.batch_norm, the add and the activation, through autograd); and our ReLU + bias-gradient kernel
(cudnn_fusion::relu_bias_backward, the conv + bias + ReLU layers' backward) on the same shapes.

GPU ms a call at the model's batch, bfloat16, channels_last: 10 calls of torch.autograd.grad (retain_graph) captured
in a CUDA graph, the median of the replays (timing.graph_replay_ms); a call that fails to capture or run is reported
in its row, and the others are still timed. With --bits, a hash of each layer's gradients from our kernels, on inputs
from a fixed seed, taken before the timing and without a capture: two builds of the kernels that should give the
same bits print the same lines ("bits,<layer>,<kernel>,<sha256>").

Without an activation the op's backward is not our kernel (which folds an activation's mask in): it is cuDNN's
batchnorm-backward graph, or ATen's kernel where cudnn.benchmark (on here) timed that faster. Such rows say so, and
--bits hashes no "ours" there: which of the two runs can change from one process to the next where they time alike
(on an H100, 2026-12-07c, two layers' hashes differed between two processes so).

--layers START:END: only those kinds of layer (batch_norm_forward.py's --layers; the bits lines keep the layer's
index in the whole list).

    python benchmarks/batch_norm_backward.py [--model mobilenet_v2] [--batch 256] [--bits] [--layers 14:]
                                             [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import torch
import torch.nn.functional as F

from torch_cudnn_fusion._cpp_enums import Activation
from torch_cudnn_fusion.ops.conv import eager_activation

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from batch_norm_forward import IMPLEMENTATIONS, layer_slice, layers_of  # noqa: E402
from profile_by_kind import run_header  # noqa: E402
from timing import graph_replay_ms  # noqa: E402


def inputs(layer: dict, batch: int, seed: int) -> dict:
    """The layer's tensors at `batch` from `seed`: z (its BatchNorm's input), dy and the residual in bfloat16,
    channels_last; float32 weight and bias."""
    torch.manual_seed(seed)
    shape = (batch, *layer["shape"][1:])
    c = shape[1]

    def bf16():
        return torch.randn(shape, device="cuda").to(torch.bfloat16).to(memory_format=torch.channels_last)

    return {"z": bf16().requires_grad_(), "dy": bf16(), "residual": bf16() if layer["residual"] else None,
            "weight": (torch.rand(c, device="cuda") + 0.5).requires_grad_(),
            "bias": torch.randn(c, device="cuda").requires_grad_()}


def backward_calls(layer: dict, batch: int, seed: int = 0) -> dict:
    """name -> a call of the layer's BatchNorm backward (the forward run once, here), returning its gradients."""
    act = Activation.from_name(layer["activation"])
    calls = {}
    # The forwards run on a stream of their own: autograd runs each backward node on its forward's stream, and a
    # forward on the legacy default stream cannot join the capture of graph_replay_ms (cudaErrorStreamCaptureImplicit).
    forward_stream = torch.cuda.Stream()
    forward_stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(forward_stream):
        calls.update(forwards(layer, batch, seed, act))
    torch.cuda.current_stream().wait_stream(forward_stream)
    return calls


def forwards(layer: dict, batch: int, seed: int, act: Activation) -> dict:
    """backward_calls' forwards, each on inputs of its own; every call binds its own tensors (a late-bound closure
    once took the next call's inputs, and its grad found its inputs unused)."""
    calls = {}
    for name, implementation in IMPLEMENTATIONS.items():
        t = inputs(layer, batch, seed)
        y = torch.ops.cudnn_fusion.batch_norm_act(t["z"], t["weight"], t["bias"], None, None, t["residual"], 0.1,
                                                  1e-5, int(act), implementation)[0]
        calls[name] = (lambda y=y, t=t: torch.autograd.grad(y, (t["z"], t["weight"], t["bias"]), t["dy"],
                                                            retain_graph=True))
    t = inputs(layer, batch, seed)
    y = F.batch_norm(t["z"], None, None, t["weight"], t["bias"], True, 0.1, 1e-5)
    y = eager_activation(y + t["residual"] if t["residual"] is not None else y, act, 0.01)
    calls["eager"] = (lambda y=y, t=t: torch.autograd.grad(y, (t["z"], t["weight"], t["bias"]), t["dy"],
                                                         retain_graph=True))
    if act in (Activation.RELU, Activation.RELU6) and not layer["residual"]:
        t = inputs(layer, batch, seed)
        out = torch.relu(t["z"].detach()) if act == Activation.RELU else F.relu6(t["z"].detach())
        calls["relu_bias_backward"] = (lambda t=t, out=out: torch.ops.cudnn_fusion.relu_bias_backward(t["dy"], out,
                                                                                                     int(act)))
    return calls


def timed(calls: dict) -> dict:
    """{"gpu_ms": name -> GPU ms a call (timing.graph_replay_ms), "errors": name -> why its timing failed}: a call
    that fails to capture or run is reported in the row, not fatal to the run."""
    gpu_ms, errors = {}, {}
    for name, fn in calls.items():
        try:
            gpu_ms[name] = graph_replay_ms(fn)
        except Exception as error:  # noqa: BLE001 (any failure: reported, the other calls still timed)
            errors[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
            torch.cuda.synchronize()
    return {"gpu_ms": gpu_ms, "errors": errors}


def bits(tensors) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--bits", action="store_true", help="print a hash of our kernels' gradients for each layer")
    p.add_argument("--layers", type=layer_slice, default=slice(None), help="START:END, a slice of the kinds of layer")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    every_layer = layers_of(args.model, args.batch)  # before benchmark: see batch_norm_forward.py's main
    torch.backends.cudnn.benchmark = True
    rows = []
    for index in range(len(every_layer))[args.layers]:
        layer = every_layer[index]
        ours_is_our_kernel = layer["activation"] is not None
        if args.bits:  # before the timing, which captures: the bits do not hang on a capture that fails
            seeded = backward_calls(layer, args.batch, seed=1)
            for name in ("ours", "relu_bias_backward") if ours_is_our_kernel else ("relu_bias_backward",):
                if name in seeded:
                    print(f"bits,{index},{name},{bits(seeded[name]())}", flush=True)
        row = {**layer, **timed(backward_calls(layer, args.batch)),
               "ours_backward": "our kernel" if ours_is_our_kernel else "cuDNN graph or ATen"}
        rows.append(row)
        residual = "+res" if layer["residual"] else ""
        what = f"{layer['count']:3d} x {str(layer['shape']):<22}{str(layer['activation']):<8}{residual:<5}"
        print(what + "".join(f"{name} {ms:.4f}   " for name, ms in row["gpu_ms"].items())
              + "".join(f"{name} failed: {error}   " for name, error in row["errors"].items())
              + ("" if ours_is_our_kernel else "(ours: cuDNN's graph or ATen, no activation)"), flush=True)
    header = run_header(args)
    layers = sum(r["count"] for r in rows)
    print(f"\n{args.model}: {layers} conv + BatchNorm layers' BatchNorm backward (bf16, channels_last) on "
          f"{header['gpu']}, torch {header['torch']}, cuDNN {header['cudnn']}")
    print(f"{'implementation':<20}{'GPU ms, sum at batch ' + str(args.batch):>30}{'layers faster than eager':>30}")
    for name in ("ours", "cuDNN graph", "eager", "relu_bias_backward"):
        done = [r for r in rows if name in r["gpu_ms"]]
        gpu = sum(r["gpu_ms"][name] * r["count"] for r in done)
        against = [r for r in done if "eager" in r["gpu_ms"]]
        faster = sum(r["count"] for r in against if r["gpu_ms"][name] < r["gpu_ms"]["eager"])
        failed = sum(r["count"] for r in rows if name in r["errors"])
        print(f"{name:<20}{gpu:>30.3f}{faster:>24d} of {sum(r['count'] for r in against)}"
              + (f"   ({failed} layers failed)" if failed else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "layers": [args.layers.start, args.layers.stop], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
