"""Device-to-device copy bandwidth by size (CUDA-graph replay, as bench_depthwise.py times its kernels), to check the
reference bandwidth the depthwise targets are measured against: sizes below and above L2, powers of two among them.

    python benchmarks/copy_bandwidth.py [--json out.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

from timing import graph_replay_ms

SIZES_MIB = (8, 16, 32, 64, 128, 192, 256, 320, 384, 448, 512, 640, 768, 1024)


def copy_ms(mib: int) -> float:
    src = torch.randn(mib * 1024 * 1024 // 2, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    return graph_replay_ms(lambda: dst.copy_(src), calls=5, replays=11)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    gpu = torch.cuda.get_device_name()
    print(f"bf16 device-to-device copy ({gpu}, torch {torch.__version__}); ms per copy (CUDA-graph replay of 5, "
          "median of 11) and TB/s (bytes read + written)")
    rows = []
    for mib in SIZES_MIB:
        ms = copy_ms(mib)
        rows.append({"mib": mib, "ms": ms, "tb_per_s": 2 * mib * 2**20 / ms / 1e9})
        print(f"{mib:6d} MiB  {ms:8.4f} ms  {rows[-1]['tb_per_s']:5.2f} TB/s")
        torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "gpu": gpu,
                                         "torch": torch.__version__, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
