"""Cold time to the first training steps of MobileNet v1 through fuse(), in a fresh process with an empty plan cache:
fuse() itself, then each of the first steps (forward, backward, SGD step, synchronized), where every layer decides
and cuDNN builds its plans. Run it in alternating processes to compare two checkouts.

    python benchmarks/cold_start.py [--batch 64] [--steps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.models import mobilenet_v1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.batch, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    target = torch.randint(0, 1000, (args.batch,), device="cuda")
    plain = mobilenet_v1().cuda().to(memory_format=torch.channels_last)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model, _ = tcf.fuse(plain)
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
    result = {"fuse_s": fuse_s, "steps_s": steps_s, "to_first_step_done_s": fuse_s + steps_s[0],
              "plan_builds": tcf.plan_cache_stats()["builds"], "build_seconds": tcf.plan_cache_stats()["build_seconds"],
              "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": args.batch}
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
