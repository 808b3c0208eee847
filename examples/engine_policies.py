"""Engine policies and plan files on a GPU: what autotune decides for a depthwise 7x7 layer (one our depthwise kernels
do not take: cuDNN's fused graph or PyTorch's kernel) and a dense layer, the pinned
engine error, the deterministic listing, and a plan file round trip. Prints what it measured.

    python examples/engine_policies.py
"""

import os
import tempfile

import torch
from torch import nn

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion import EnginePolicy

CL = torch.channels_last


def main() -> None:
    autotune = EnginePolicy("autotune")
    model = nn.Sequential(
        tcf.Conv2dReLU(512, 512, 7, padding=3, groups=512, policy=autotune),  # depthwise 7x7
        tcf.Conv2dReLU(512, 512, 1, policy=autotune),
    ).cuda().to(dtype=torch.bfloat16, memory_format=CL)
    x = torch.randn(64, 512, 14, 14, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=CL)
    print(tcf.explain(model, x, repeats=5))
    for index, layer in enumerate(model):
        print(f"layer {index}: {layer.fusion_status}")

    pinned = tcf.Conv2dReLU(64, 64, 3, padding=1, policy=EnginePolicy("pinned", engines={"forward": 999}))
    try:
        pinned.cuda().to(memory_format=CL)(torch.randn(8, 64, 28, 28, device="cuda").contiguous(memory_format=CL))
    except ValueError as error:
        print(f"pinned #999: ValueError: {str(error)[:220]}...")

    table = tcf.engines([32, 64, 56, 56], [64, 64, 3, 3], padding=1, dtype=torch.float32, graph="wgrad")
    marked = [c.name for c in table if "nondeterministic" in c.behaviour_notes]
    kept = tcf.engines([32, 64, 56, 56], [64, 64, 3, 3], padding=1, dtype=torch.float32, graph="wgrad",
                       policy=EnginePolicy(deterministic=True))
    usable = [c for c in kept if c.index is not None and not c.error]
    print(f"float32 wgrad 3x3 64->64 @56: {len(marked)} nondeterministic candidate(s) {marked}; "
          f"the deterministic policy leaves {len(usable)}, none of them marked")

    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "plans.json")
        saved = tcf.save_plan_cache(path)
        tcf.clear_plan_cache()
        loaded = tcf.load_plan_cache(path)
        with torch.no_grad():
            model(x)
        stats = tcf.plan_cache_stats()
        print(f"plan file: {saved} plans saved, {loaded} loaded; after it the model ran with {stats['builds']} builds "
              f"and {stats['tuned']} timings")


if __name__ == "__main__":
    main()
