"""Host memory (RSS) of a process that sends many distinct input shapes through one fused layer.

    python benchmarks/host_memory.py --shapes 600 --capacity 64 [--json out.json]

Each variant runs in its own process: a Conv2dReLU (bf16 autocast, channels_last, forward + backward per shape) with
the plan cache capped at --capacity; the same with the plan cache cleared every 100 shapes; eager F.conv2d + ReLU
for comparison. RSS is read after every 100 shapes, also after glibc's malloc_trim (memory freed but kept by the
allocator is not growth). Prints a table; growth is measured from the first 100 shapes on.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def run_variant(variant: str, shapes: int, capacity: int) -> list[tuple[int, float, float]]:
    import torch
    import torch.nn.functional as F

    import torch_cudnn_fusion as tcf

    tcf.set_plan_cache_capacity(capacity)
    libc = ctypes.CDLL("libc.so.6")
    layer = tcf.Conv2dReLU(64, 64, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    samples = []
    for i in range(shapes):
        size = 8 + i  # a new spatial size each time: new plans for every graph of the layer
        x = torch.randn(2, 64, size, 9, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            y = layer(x) if variant != "eager" else F.relu(F.conv2d(x, layer.weight, layer.bias, padding=1))
        y.float().sum().backward()
        if (i + 1) % 100 == 0:
            torch.cuda.synchronize()
            if variant == "fused, cache cleared every 100":
                tcf.clear_plan_cache()
            before_trim = rss_mb()
            libc.malloc_trim(0)
            samples.append((i + 1, before_trim, rss_mb()))
    stats = tcf.plan_cache_stats()
    print(json.dumps({"variant": variant, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                      "cudnn": torch.backends.cudnn.version(), "samples": samples, "plan_cache_entries": stats["entries"],
                      "evictions": stats["evictions"]}))
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--shapes", type=int, default=600)
    p.add_argument("--capacity", type=int, default=64, help="plan cache capacity")
    p.add_argument("--json", default=None, help="write the samples here")
    p.add_argument("--variant", default=None, help=argparse.SUPPRESS)  # one variant, in this process
    args = p.parse_args()
    if args.variant:
        run_variant(args.variant, args.shapes, args.capacity)
        return
    results = []
    for variant in ("fused", "fused, cache cleared every 100", "eager"):
        out = subprocess.run([sys.executable, __file__, "--variant", variant, "--shapes", str(args.shapes),
                              "--capacity", str(args.capacity)], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{variant}: failed\n{out.stderr[-2000:]}")
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"{'variant':<34}" + "".join(f"{n:>10}" for n, _, _ in results[0]["samples"]) + "   growth after 100 (trimmed)")
    for r in results:
        first = r["samples"][0][2]
        print(f"{r['variant']:<34}" + "".join(f"{t:>10.0f}" for _, _, t in r["samples"])
              + f"   {r['samples'][-1][2] - first:+.1f} MB (entries {r['plan_cache_entries']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
