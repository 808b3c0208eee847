"""BatchNorm's training backward in each implementation, layer by layer over a model's fused conv + BatchNorm layers
(the shapes, activations and residuals batch_norm_forward.py finds): the backward of cudnn_fusion::batch_norm_act
as its autograd node runs it after our forward kernel (implementation 2) and after the cuDNN graph's (0), against
eager's (F.batch_norm, the add and the activation, through autograd); and our ReLU + bias-gradient kernel
(cudnn_fusion::relu_bias_backward, the conv + bias + ReLU layers' backward) on the same shapes.

GPU ms a call at the model's batch, bfloat16, channels_last, two ways: 10 calls of torch.autograd.grad (retain_graph)
captured in a CUDA graph, the median of the replays (timing.graph_replay_ms, "gpu_ms"); and 20 calls issued back to
back on the stream behind a sleep that outlasts the host's time to issue them, as an eager training step runs them
(timing.stream_ms, "stream_ms", printed in parentheses): a CUDA graph replays short kernels with shorter gaps than
a stream launches them, and the two orders of implementations can differ. A call that fails to capture or run is
reported in its row, and the others are still timed. With --bits, a hash of each layer's gradients from our kernels,
on inputs from a fixed seed, taken before the timing and without a capture: two builds of the kernels that should
give the same bits print the same lines ("bits,<layer>,<kernel>,<sha256>").

Without an activation the op's backward is not our kernel (which folds an activation's mask in): it is cuDNN's
batchnorm-backward graph, or ATen's kernel where cudnn.benchmark (on unless --no-cudnn-benchmark) timed that
faster or, without benchmark, where the policy leaves it to ATen. Such rows say so, and
--bits hashes no "ours" there: which of the two runs can change from one process to the next where they time alike
(on an H100, 2026-12-07c, two layers' hashes differed between two processes so).

--layers START:END: only those kinds of layer (batch_norm_forward.py's --layers; the bits lines keep the layer's
index in the whole list).

    python benchmarks/batch_norm_backward.py [--model mobilenet_v2] [--batch 256] [--bits] [--layers 14:]
                                             [--no-cudnn-benchmark] [--json out.json]
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
from timing import graph_replay_ms, stream_ms  # noqa: E402


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
    """name -> a call of the layer's BatchNorm backward (the forward run once, here, on the current stream),
    returning its gradients. Make and time the calls on a stream of their own (main: own_stream, one a layer):
    autograd runs each backward node on its forward's stream, so the forwards must run on the stream the calls are
    timed on, or every call waits across streams twice (events that the stream timing would count and an eager step
    does not run); and a forward on the legacy default stream cannot join the capture of graph_replay_ms
    (cudaErrorStreamCaptureImplicit)."""
    return forwards(layer, batch, seed, Activation.from_name(layer["activation"]))


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
    """{"gpu_ms": name -> GPU ms a call replayed (timing.graph_replay_ms), "stream_ms": name -> on the stream
    (timing.stream_ms), "errors": name -> why its timing failed}: a call that fails to capture or run is reported in
    the row, not fatal to the run."""
    gpu_ms, on_stream, errors = {}, {}, {}
    for name, fn in calls.items():
        try:
            on_stream[name] = stream_ms(fn)
            gpu_ms[name] = graph_replay_ms(fn)
        except Exception as error:  # noqa: BLE001 (any failure: reported, the other calls still timed)
            errors[name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
            on_stream.pop(name, None)
            torch.cuda.synchronize()
    return {"gpu_ms": gpu_ms, "stream_ms": on_stream, "errors": errors}


def bits(tensors) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def own_stream():
    """A context that makes a new stream current: see backward_calls."""
    return torch.cuda.stream(torch.cuda.Stream())


def timed_layer(args, index: int, layer: dict) -> dict:
    """One row: the layer's calls timed (and hashed with --bits), printed as they finish."""
    ours_is_our_kernel = layer["activation"] is not None
    if args.bits:  # before the timing, which captures: the bits do not hang on a capture that fails
        seeded = backward_calls(layer, args.batch, seed=1)
        for name in ("ours", "relu_bias_backward") if ours_is_our_kernel else ("relu_bias_backward",):
            if name in seeded:
                print(f"bits,{index},{name},{bits(seeded[name]())}", flush=True)
    row = {**layer, **timed(backward_calls(layer, args.batch)),
           "ours_backward": "our kernel" if ours_is_our_kernel else "cuDNN graph or ATen"}
    residual = "+res" if layer["residual"] else ""
    what = f"{layer['count']:3d} x {str(layer['shape']):<22}{str(layer['activation']):<8}{residual:<5}"
    print(what + "".join(f"{name} {ms:.4f} ({row['stream_ms'][name]:.4f})   "
                         for name, ms in row["gpu_ms"].items())
          + "".join(f"{name} failed: {error}   " for name, error in row["errors"].items())
          + ("" if ours_is_our_kernel else "(ours: cuDNN's graph or ATen, no activation)"), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="mobilenet_v2")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--bits", action="store_true", help="print a hash of our kernels' gradients for each layer")
    p.add_argument("--layers", type=layer_slice, default=slice(None), help="START:END, a slice of the kinds of layer")
    p.add_argument("--no-cudnn-benchmark", dest="cudnn_benchmark", action="store_false",
                   help="time with torch.backends.cudnn.benchmark off, torch's default: no plan is tuned, and the op "
                        "runs the heuristic's first plan or ATen's kernels (policy.ATEN_WITHOUT_BENCHMARK)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    every_layer = layers_of(args.model, args.batch)  # before benchmark: see batch_norm_forward.py's main
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    rows = []
    for index in range(len(every_layer))[args.layers]:
        with own_stream():  # backward_calls: the forwards on the timed stream
            rows.append(timed_layer(args, index, every_layer[index]))
    header = run_header(args)
    layers = sum(r["count"] for r in rows)
    print(f"\n{args.model}: {layers} conv + BatchNorm layers' BatchNorm backward (bf16, channels_last) on "
          f"{header['gpu']}, torch {header['torch']}, cuDNN {header['cudnn']}, cudnn.benchmark "
          f"{'on' if args.cudnn_benchmark else 'off'}")
    print(f"{'implementation':<20}{'GPU ms, sum at batch ' + str(args.batch):>30}{'layers faster than eager':>30}"
          "   (replayed; on the stream)")
    for name in ("ours", "cuDNN graph", "eager", "relu_bias_backward"):
        done = [r for r in rows if name in r["gpu_ms"]]
        against = [r for r in done if "eager" in r["gpu_ms"]]
        sums, faster = [], []
        for timing in ("gpu_ms", "stream_ms"):
            sums.append(sum(r[timing][name] * r["count"] for r in done))
            faster.append(sum(r["count"] for r in against if r[timing][name] < r[timing]["eager"]))
        failed = sum(r["count"] for r in rows if name in r["errors"])
        print(f"{name:<20}{sums[0]:>20.3f}; {sums[1]:.3f}{faster[0]:>16d}; {faster[1]} of "
              f"{sum(r['count'] for r in against)}" + (f"   ({failed} layers failed)" if failed else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "layers": [args.layers.start, args.layers.stop], "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
