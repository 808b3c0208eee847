"""Time to the first training step of MobileNet v1 (fused, batch 256, 224x224, bf16, channels_last), with a cold plan
cache (every plan built, and under autotune timed) and a warm one (the plan file a cold run saved, loaded first), for
the heuristic and autotune policies. Each run is a fresh process; the time runs from building the model to the end of
the first step (plan-file loading included), after `import torch_cudnn_fusion`.

    python benchmarks/bench_plan_cache.py [--json out.json] [--batch 256] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def child(args) -> None:
    import torch
    import torch.nn.functional as F

    import torch_cudnn_fusion as tcf
    from torch_cudnn_fusion.models import mobilenet_v1

    torch.cuda.init()
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (args.batch,), device="cuda")
    torch.cuda.synchronize()

    def step(model, opt):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16):
            loss = F.cross_entropy(model(x), target)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()

    start = time.perf_counter()
    loaded = tcf.load_plan_cache(args.plan_file) if os.path.exists(args.plan_file) else 0
    load_s = time.perf_counter() - start
    model, _ = tcf.fuse(mobilenet_v1().cuda().to(memory_format=torch.channels_last))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    with tcf.engine_policy(args.policy):
        step(model, opt)
        first_s = time.perf_counter() - start
        stats = tcf.plan_cache_stats()
        second = time.perf_counter()
        step(model, opt)
        second_s = time.perf_counter() - second
    saved = tcf.save_plan_cache(args.plan_file)
    print(json.dumps({"first_step_s": first_s, "load_s": load_s, "second_step_s": second_s, "loaded": loaded,
                      "saved": saved, "builds": stats["builds"], "tuned": stats["tuned"],
                      "build_seconds": stats["build_seconds"], "file_bytes": os.path.getsize(args.plan_file)}))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--dir", default="/tmp")
    p.add_argument("--json", default=None)
    p.add_argument("--child", action="store_true")
    p.add_argument("--policy", default="heuristic")
    p.add_argument("--plan-file", default="")
    args = p.parse_args()
    if args.child:
        child(args)
        return
    import torch

    rows = []
    for policy in ("heuristic", "autotune"):
        plan_file = os.path.join(args.dir, f"tcf_plans_{policy}.json")
        if os.path.exists(plan_file):
            os.remove(plan_file)
        for cache in ("cold", "warm"):
            out = subprocess.run([sys.executable, __file__, "--child", "--policy", policy, "--plan-file", plan_file,
                                  "--batch", str(args.batch)], capture_output=True, text=True, check=True)
            row = {"policy": policy, "cache": cache, **json.loads(out.stdout.strip().splitlines()[-1])}
            rows.append(row)
            print(row, flush=True)
    import torch_cudnn_fusion as tcf

    environment = tcf.plan_file.environment() if tcf.is_available() else {}
    print(f"\nMobileNet v1 fused, batch {args.batch}, bf16, channels_last: time to the first training step "
          f"({environment.get('gpu')}, torch {torch.__version__}, cuDNN {environment.get('cudnn')})")
    print(f"{'policy':<10}{'cache':<6}{'first step s':>13}{'plan file load s':>17}{'plans built':>12}"
          f"{'plans timed':>12}{'plans loaded':>13}{'2nd step ms':>12}")
    for r in rows:
        print(f"{r['policy']:<10}{r['cache']:<6}{r['first_step_s']:>13.2f}{r['load_s']:>17.3f}{r['builds']:>12}"
              f"{r['tuned']:>12}{r['loaded']:>13}{r['second_step_s'] * 1e3:>12.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": environment, "batch": args.batch, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
