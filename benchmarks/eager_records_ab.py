"""A/B in one process: a torchvision model's training step (batch 128, bf16 autocast, channels_last, cudnn.benchmark),
eager against fused against fused with the records of its layers decided eager dropped after warm-up, so those
layers check their repeats through Python's signature, as before 9fb426a. Two rounds of interleaved samples
(timing.interleaved_samples_ms: 10 samples of 3 back-to-back steps each), medians in ms.

    python benchmarks/eager_records_ab.py [regnet_y_400mf]
"""
import statistics
import sys
sys.path.insert(0, "benchmarks")
import torch  # noqa: E402
from profile_by_kind import setup  # noqa: E402
from timing import interleaved_samples_ms  # noqa: E402
from zoo_speed import train_step  # noqa: E402
name = sys.argv[1] if len(sys.argv) > 1 else "regnet_y_400mf"
_, x, t, variants = setup(name, 128)  # cudnn.benchmark on, seed 0, channels_last
m, new, old = variants["eager"](), variants["fused"](), variants["fused"]()
fns = {"eager": train_step(m, x, t, torch.bfloat16), "fused": train_step(new, x, t, torch.bfloat16),
       "fused, no eager records": train_step(old, x, t, torch.bfloat16)}
for _ in range(3):
    fns["fused, no eager records"]()
eager_layers = [mod for mod in old.modules() if getattr(mod, "_call", None) is not None
                and mod._call.decision is not None and not mod._call.decision.fused and mod._call.recorded is not None]
for mod in eager_layers:
    mod._call.recorded = None
print(len(eager_layers), "eager-decided layers with records dropped in the third variant")
for rnd in range(2):
    s = interleaved_samples_ms(fns, warmup=3, repeats=10, calls=3)
    print({k: round(statistics.median(v), 2) for k, v in s.items()})
print(sum(mod._call.recorded is None for mod in eager_layers), "still without records")
