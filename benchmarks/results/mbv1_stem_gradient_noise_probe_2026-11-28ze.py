# Which parameters of mobilenet_v1 full size get a larger bf16 gradient error with our BatchNorm forward kernel
# than with the cuDNN graph; across seeds; and the stem layer alone at its shape.
import copy, sys, time
import torch, torch.nn.functional as F
from torch import nn
sys.path.insert(0, "tests")
import torch_cudnn_fusion as tcf
from torch_cudnn_fusion import _extension
from torch_cudnn_fusion.models import mobilenet_v1
from test_bn_gpu import train_steps
from conftest import rel_err

class KernelRefused:
    def __init__(self, m): self._m = m
    def __getattr__(self, n): return getattr(self._m, n)
    def check_batch_norm_layer(self, *a):
        r = dict(self._m.check_batch_norm_layer(*a)); r["kernel"] = "refused"; return r

def fused_graph(plain, batches):
    model = tcf.fuse(copy.deepcopy(plain))[0]
    load = _extension.load; m = load(); _extension.load = lambda: KernelRefused(m)
    try:
        with torch.autocast("cuda", torch.bfloat16):
            F.cross_entropy(model(batches[0][0]), batches[0][1]).backward()
    finally:
        _extension.load = load
    model.zero_grad(set_to_none=True)
    return model

t0 = time.time()
for seed in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    torch.manual_seed(seed)
    plain = mobilenet_v1().cuda().to(memory_format=torch.channels_last)
    ref = copy.deepcopy(plain).double()
    batches = [(torch.randn(16, 3, 224, 224, device="cuda").to(memory_format=torch.channels_last),
                torch.randint(0, 1000, (16,), device="cuda"))]
    fk = tcf.fuse(copy.deepcopy(plain))[0]
    fg = fused_graph(plain, batches)
    impl = {fg.get_submodule(p).fusion_status.implementation for p, _ in fg.named_modules() if hasattr(fg.get_submodule(p), "fusion_status") and p}
    _, gk, _ = train_steps(fk, batches, torch.bfloat16)
    _, gg, _ = train_steps(fg, batches, torch.bfloat16)
    _, ge, _ = train_steps(copy.deepcopy(plain), batches, torch.bfloat16)
    _, gr, _ = train_steps(ref, batches, torch.float64)
    rows = []
    for n, r in gr.items():
        ek, eg, ee = rel_err(gk[n], r), rel_err(gg[n], r), rel_err(ge[n], r)
        rows.append((ek / (2 * ee + 1e-3), n, ek, eg, ee))
    rows.sort(reverse=True)
    print(f"seed {seed} graph impls {impl} ({time.time()-t0:.0f} s)")
    print("  ratio_kernel ratio_graph  param  err_kernel err_graph err_eager")
    for q, n, ek, eg, ee in rows[:6]:
        print(f"  {q:6.3f} {eg/(2*ee+1e-3):6.3f}  {n:28s} {ek:.3e} {eg:.3e} {ee:.3e}")
    print("  features.0.*:", [(n, f"{ek:.2e}/{eg:.2e}/{ee:.2e}") for q, n, ek, eg, ee in rows if n.startswith("features.0.")])

# the stem layer alone: BN+ReLU on a bf16 x of the stem's shape, dy random; errors of dgamma, dbeta, dx vs float64
for seed in range(2):
    torch.manual_seed(100 + seed)
    x = (torch.randn(16, 32, 112, 112, device="cuda") * 0.7 + 0.2).to(torch.bfloat16).to(memory_format=torch.channels_last)
    dy = torch.randn_like(x)
    bn = nn.BatchNorm2d(32).cuda()
    res = {}
    for name in ("kernel", "graph", "eager", "ref"):
        m = copy.deepcopy(bn)
        xx = x.detach().clone().double() if name == "ref" else x.detach().clone()
        if name == "ref": m = m.double()
        xx.requires_grad_(True)
        if name in ("kernel", "graph"):
            mod = tcf.BatchNorm2dReLU.from_bn(m)
            if mod is None: break
            load = _extension.load; mm = load()
            if name == "graph": _extension.load = lambda: KernelRefused(mm)
            try:
                with torch.autocast("cuda", torch.bfloat16):
                    y = mod(xx)
            finally:
                _extension.load = load
            y.backward(dy)
            res[name] = (y.detach(), xx.grad, m.weight.grad, getattr(mod, "fusion_status", None))
        else:
            with torch.autocast("cuda", torch.bfloat16, enabled=name != "ref"):
                y = F.relu(m(xx))
            y.backward(dy.double() if name == "ref" else dy)
            res[name] = (y.detach(), xx.grad, m.weight.grad, None)
    if "kernel" not in res: print("no BatchNorm2dReLU"); break
    for name in ("kernel", "graph", "eager"):
        y, dx, dw, st = res[name]
        print(f"stem seed {seed} {name:6s} y {rel_err(y, res['ref'][0]):.3e} dx {rel_err(dx, res['ref'][1]):.3e} dw {rel_err(dw, res['ref'][2]):.3e} {st}")
print(f"done {time.time()-t0:.0f} s")
