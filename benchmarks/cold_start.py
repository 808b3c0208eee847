"""Cold time to the first training steps of a model, in a fresh process with an empty plan cache: fuse() itself, then
each of the first steps (forward, backward, SGD step, synchronized), where every layer decides and cuDNN builds its
plans (and, under --cudnn-benchmark, tunes them: `tuned` and `tune_seconds`). --eager runs the model unfused, for the
same steps' cost without us. Run it in alternating processes, repeated, to compare two checkouts: the first process
on a fresh machine measured far slower than the next (docs/benchmarks.md, 2026-12-07f).

    python benchmarks/cold_start.py [--model mobilenet_v1] [--batch 64] [--steps 3] [--cudnn-benchmark]
                                    [--candidates N] [--eager] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import torch_cudnn_fusion as tcf
from profile_by_kind import load_model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="mobilenet_v1",
                        help="mobilenet_v1 (ours), a torchvision.models name, or library:name (timm:cspdarknet53)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    parser.add_argument("--candidates", type=int, default=None,
                        help="torch_cudnn_fusion.policy.BENCHMARK_CANDIDATES, the candidates each plan times under "
                             "--cudnn-benchmark (set before the extension loads)")
    parser.add_argument("--eager", action="store_true", help="the model unfused")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.candidates is not None:
        if args.candidates < 1:
            parser.error(f"--candidates must be at least 1, got {args.candidates}")
        tcf.policy.BENCHMARK_CANDIDATES = args.candidates
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (args.batch,), device="cuda")
    plain = load_model(args.model).cuda().to(memory_format=torch.channels_last)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model = plain if args.eager else tcf.fuse(plain)[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fuse_s = time.perf_counter() - start
    steps_s = []
    for _ in range(args.steps):
        begin = time.perf_counter()
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        steps_s.append(time.perf_counter() - begin)
    result = {"model": args.model, "variant": "eager" if args.eager else "fused",
              "cudnn_benchmark": args.cudnn_benchmark, "candidates": tcf.policy.BENCHMARK_CANDIDATES,
              "fuse_s": fuse_s, "steps_s": steps_s, "to_first_step_done_s": fuse_s + steps_s[0]}
    if not args.eager:
        stats = tcf.plan_cache_stats()
        result.update({"plan_builds": stats["builds"], "build_seconds": stats["build_seconds"], "tuned": stats["tuned"],
                       "tune_seconds": stats["tune_seconds"]})
    result.update({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": args.batch})
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
