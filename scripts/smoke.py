import torch, time, torch.nn.functional as F
import torch_cudnn_fusion as tcf
print("avail", tcf.is_available(), tcf.unavailable_reason(), torch.__version__, torch.backends.cudnn.version(), torch.cuda.get_device_name())
from torch_cudnn_fusion import _extension
C = _extension.require()
print("frontend", C.frontend_version(), "cudnn", C.cudnn_version())
for dt in (torch.bfloat16, torch.float16, torch.float32):
  for cl in (True, False):
    for (cin, cout, k, s, p, res) in [(64,64,3,1,1,False),(64,64,3,1,1,True),(512,512,1,1,0,False),(64,128,3,2,1,False)]:
        x = torch.randn(8, cin, 28, 28, device="cuda", dtype=dt, requires_grad=True)
        if cl: x = x.detach().to(memory_format=torch.channels_last).requires_grad_()
        m = tcf.Conv2dReLU(cin, cout, k, s, p).cuda().to(dt) if not res else tcf.Conv2dAddReLU(cin, cout, k, s, p).cuda().to(dt)
        r = None
        if res:
            r = torch.randn(8, cout, 28, 28, device="cuda", dtype=dt, requires_grad=True)
            if cl: r = r.detach().to(memory_format=torch.channels_last).requires_grad_()
        y = m(x, r) if res else m(x)
        ref = F.relu(F.conv2d(x, m.weight, m.bias, s, p) + (r if res else 0))
        g = torch.randn_like(y)
        gx, gw, gb = torch.autograd.grad(y, (x, m.weight, m.bias), g)
        rx, rw, rb = torch.autograd.grad(ref, (x, m.weight, m.bias), g)
        def rel(a, b): return ((a.float()-b.float()).norm()/b.float().norm()).item()
        print(dt, "cl" if cl else "nchw", cin, cout, k, s, "res" if res else "", "|", str(m.fusion_status)[:200], "| fwd %.2e gx %.2e gw %.2e gb %.2e" % (rel(y, ref), rel(gx, rx), rel(gw, rw), rel(gb, rb)), y.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(memory_format=torch.channels_last))
print(tcf.plan_cache_stats())
