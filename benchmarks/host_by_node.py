"""Host time per leaf module type (forward) and per autograd node type (backward) of a training step, eager and
fused (tcf.fuse), untraced: timestamps from forward hooks and from autograd node pre-hooks and hooks. Two conditions:
the GPU held asleep (a long sleep kernel queued first, so no call waits on the GPU; a step that issues more work than
the launch queue holds still waits, and the node it waits in then takes about the sleep) and idle. Batch 128,
224x224 (profile_by_kind.setup: cudnn.benchmark on, seed 0, channels_last), bf16 autocast, SGD with momentum; a
warm-up step, then the mean of 3.
The hooks add their own host time per module and node, so compare the variants by type, not with untraced step times.

    python benchmarks/host_by_node.py regnet_y_400mf [mobilenet_v3_small efficientnet_b0 ...] [--inference]

--inference times the models in eval under torch.no_grad instead (the forward's modules only; no nodes, no step).

Models: torchvision names, library:name (timm:cspdarknet53) or mobilenet_v1 (profile_by_kind.load_model).

Writes $OUT/nodes.json (or ./nodes.json).
"""
import argparse
import collections
import json
import os
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from profile_by_kind import setup  # noqa: E402

pc = time.perf_counter


def short(name: str) -> str:
    """A node's name without the C++ wrapper: 'CppNode<ConvFunction>' for our autograd functions."""
    return name.replace("torch::autograd::CppNode<tcf::(anonymous namespace)::", "CppNode<").replace(
        "torch::autograd::", "")


def measure(model, x, t, asleep, steps=3, inference=False):
    opt = None if inference else torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    fwd = collections.defaultdict(float); fwd_n = collections.Counter()
    bwd = collections.defaultdict(float); bwd_n = collections.Counter()
    phases = collections.defaultdict(float)
    stack = []
    leaves = [m for m in model.modules() if not list(m.children())]

    def pre(m, a):
        stack.append(pc())

    def post(m, a, o):
        fwd[type(m).__name__] += pc() - stack.pop(); fwd_n[type(m).__name__] += 1

    hs = [m.register_forward_pre_hook(pre) for m in leaves] + [m.register_forward_hook(post) for m in leaves]
    longest = (0, "")
    for s in range(steps + 1):
        if s == 1:  # the first is a warm-up with the hooks on
            for d in (fwd, bwd, phases):
                d.clear()
            fwd_n.clear(); bwd_n.clear()
            longest = (0, "")
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if asleep:
            torch.cuda._sleep(2_000_000_000)
        t0 = pc()
        with torch.autocast("cuda", torch.bfloat16), torch.set_grad_enabled(not inference):
            y = model(x)
            loss = None if inference else F.cross_entropy(y, t)
        t1 = pc()
        if inference:
            torch.cuda.synchronize()
            phases["forward"] += t1 - t0
            continue
        seen, todo, nodes = set(), [loss.grad_fn], []
        while todo:
            n = todo.pop()
            if n is None or n in seen:
                continue
            seen.add(n); nodes.append(n)
            todo.extend(f for f, _ in n.next_functions)
        starts = {}
        for n in nodes:
            try:
                n.register_prehook(lambda go, n=n: starts.__setitem__(n, pc()))
                n.register_hook(lambda gi, go, n=n: ends.append((n, pc())))
            except Exception:
                pass
        ends = []
        t2 = pc()
        loss.backward()
        t3 = pc()
        opt.step()
        t4 = pc()
        torch.cuda.synchronize()
        for n, e in ends:
            if n in starts:
                d, name = e - starts[n], short(n.name())
                bwd[name] += d; bwd_n[name] += 1
                if d > longest[0]:
                    longest = (d, name)
        phases["forward"] += t1 - t0; phases["backward"] += t3 - t2; phases["step"] += t4 - t3
    for h in hs:
        h.remove()
    k = 1e3 / steps
    return ({n: (v * k, fwd_n[n] // steps) for n, v in fwd.items()},
            {n: (v * k, bwd_n[n] // steps) for n, v in bwd.items()}, {p: v * k for p, v in phases.items()}, longest)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="+")
    parser.add_argument("--inference", action="store_true", help="eval under torch.no_grad: the forward only")
    args = parser.parse_args()
    out = {}
    for name in args.models:
        _, x, t, variants = setup(name, 128)
        models = {v: make().train(not args.inference) for v, make in variants.items()}
        res = {}
        for cond in ("asleep", "idle"):
            for v, m in models.items():
                res[(v, cond)] = measure(m, x, t, cond == "asleep", inference=args.inference)
        out[name] = {f"{v} {c}": r for (v, c), r in res.items()}
        for cond in ("asleep", "idle"):
            e, f = res[("eager", cond)], res[("fused", cond)]
            title = f"{name} inference" if args.inference else name
            print(f"\n=== {title} {cond}: phases ms eager {({p: round(v, 2) for p, v in e[2].items()})} fused "
                  f"{({p: round(v, 2) for p, v in f[2].items()})}; longest node eager {e[3][0]*1e3:.1f} ms "
                  f"{e[3][1]}, fused {f[3][0]*1e3:.1f} ms {f[3][1]}")
            for part, idx in (("forward module", 0),) + ((("backward node", 1),) if not args.inference else ()):
                print(f"  {part:<44}{'eager ms':>9}{'n':>5}{'fused ms':>10}{'n':>5}")
                keys = sorted(set(e[idx]) | set(f[idx]), key=lambda n: -max(e[idx].get(n, (0, 0))[0],
                                                                             f[idx].get(n, (0, 0))[0]))
                for n in keys[:16]:
                    ev, fv = e[idx].get(n, (0, 0)), f[idx].get(n, (0, 0))
                    print(f"  {n[:44]:<44}{ev[0]:>9.2f}{ev[1]:>5}{fv[0]:>10.2f}{fv[1]:>5}")
                print(f"  {'sum':<44}{sum(v[0] for v in e[idx].values()):>9.2f}{'':>5}"
                      f"{sum(v[0] for v in f[idx].values()):>10.2f}")
        del models
    json.dump(out, open(os.environ.get("OUT", ".") + "/nodes.json", "w"), indent=0, default=str)


if __name__ == "__main__":
    main()
