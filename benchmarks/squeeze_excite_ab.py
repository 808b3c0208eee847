"""What fusing squeeze-and-excitation blocks saves, in one process: eager, the fused model, and the fused model built
with the block's match switched off (its blocks then run as before SqueezeExcite: a Conv2dReLU or an eager conv,
the rest eager), timed in turn. Training steps and inference batches as zoo_speed.py times them (batch 128, bf16
autocast, channels_last, cudnn.benchmark; each sample 3 back-to-back steps); medians, their ratios, and the spread of
the per-round fused / eager ratio.

    ROUNDS=8 python benchmarks/squeeze_excite_ab.py torchvision:mobilenet_v3_small torchvision:efficientnet_b0
"""
import os
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import torch_cudnn_fusion as tcf  # noqa: E402
from torch_cudnn_fusion.fx import rewrite  # noqa: E402
from timing import interleaved_samples_ms  # noqa: E402
from zoo_speed import build, inference, train_step  # noqa: E402

torch.backends.cudnn.benchmark = True
rounds = int(os.environ.get("ROUNDS", "12"))
for model_id in sys.argv[1:]:
    t0 = time.time()
    torch.manual_seed(0)
    model = build(model_id).cuda().to(memory_format=torch.channels_last)
    fused, report = tcf.fuse(model)
    orig = rewrite._GraphRewrite.match_squeeze_excite
    rewrite._GraphRewrite.match_squeeze_excite = lambda self, node: []  # no block matches: the fused model as before
    try:
        before, _ = tcf.fuse(model)
    finally:
        rewrite._GraphRewrite.match_squeeze_excite = orig
    n_se = sum(r.module == "SqueezeExcite" for r in report)
    x = torch.randn(128, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last)
    t = torch.randint(0, 1000, (128,), device="cuda")
    variants = {"eager": model, "fused": fused, "fused_no_se": before}
    for mode in ("train", "inference"):
        for v in variants.values():
            v.train(mode == "train")
        fns = {k: (train_step(v, x, t, torch.bfloat16) if mode == "train" else inference(v, x, torch.bfloat16))
               for k, v in variants.items()}
        s = interleaved_samples_ms(fns, warmup=3, repeats=rounds, calls=3)
        med = {k: statistics.median(v) for k, v in s.items()}
        print(f"{model_id} {mode} SE blocks {n_se}: " + "  ".join(f"{k} {v:.2f}" for k, v in med.items())
              + f"  fused/eager {med['fused'] / med['eager']:.3f}  no_se/eager {med['fused_no_se'] / med['eager']:.3f}"
              + f"  fused/no_se {med['fused'] / med['fused_no_se']:.3f}", flush=True)
        r = [a / b for a, b in zip(s["fused"], s["eager"])]
        print(f"   per-round fused/eager min {min(r):.3f} median {statistics.median(r):.3f} max {max(r):.3f}",
              flush=True)
    st = [str(m.fusion_status)[:90] for m in fused.modules() if isinstance(m, tcf.SqueezeExcite)]
    print("   SE status:", sorted(set(st)), f"{time.time() - t0:.0f} s", flush=True)
    del model, fused, before
    torch.cuda.empty_cache()
    tcf.clear_plan_cache()
