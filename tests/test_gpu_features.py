"""GPU behaviour beyond numerics: opcheck, torch.compile, CUDA graphs, the plan cache, autocast, DDP, threads,
saved-activation memory, fallbacks and errors."""

import ctypes
import os
import socket
import threading
import time
import tracemalloc

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.ops.stem import plan

from conftest import capture, capture_training_step, gpu, rel_err

pytestmark = gpu
CL = torch.channels_last


def _layer(cls, *args, dtype=torch.bfloat16, **kwargs):
    torch.manual_seed(0)
    return cls(*args, **kwargs).cuda().to(dtype=dtype, memory_format=CL)


def _input(*shape, dtype=torch.bfloat16, requires_grad=False):
    return torch.randn(*shape, device="cuda", dtype=dtype).contiguous(memory_format=CL).requires_grad_(requires_grad)


def _conv_args():
    return [[1, 1], [1, 1], [1, 1], [1, 1], 1]


def test_opcheck_every_op(extension):
    ops = torch.ops.cudnn_fusion
    x = _input(2, 16, 9, 9, requires_grad=True)
    w = torch.randn(32, 16, 3, 3, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=CL).requires_grad_()
    b = torch.randn(32, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    r = _input(2, 32, 9, 9, requires_grad=True)
    torch.library.opcheck(ops.conv_bias_act.default, (x, w, b, r, [1, 1], [1, 1], [1, 1], [1, 1], 1, True))
    torch.library.opcheck(ops.conv_bias_act.default, (x, w, None, None, [2, 2], [1, 1], [0, 0], [1, 1], 1, False))
    y = torch.relu(_input(2, 32, 9, 9))
    torch.library.opcheck(ops.relu_bias_backward.default, (_input(2, 32, 9, 9), y))
    torch.library.opcheck(ops.conv_dgrad.default, (_input(2, 32, 9, 9), w.detach(), [2, 16, 9, 9], *_conv_args()))
    torch.library.opcheck(ops.conv_wgrad.default, (_input(2, 32, 9, 9), x.detach(), [32, 16, 3, 3], *_conv_args()))
    torch.library.opcheck(ops.conv_wgrad.default, (_input(2, 32, 9, 9), x.detach(), [32, 16, 3, 3], *_conv_args()),
                          {"out_dtype": torch.float32})
    dz = _input(2, 32, 9, 9)
    depthwise = (dz, _input(2, 32, 9, 9), [32, 1, 3, 3], [1, 1], [1, 1], [1, 1], [1, 1], 32)
    torch.library.opcheck(ops.conv_wgrad.default, depthwise, {"out_dtype": torch.float32})  # our kernel, in float32
    with pytest.raises(RuntimeError, match="out_dtype must be grad_z's dtype"):
        ops.conv_wgrad(*depthwise, out_dtype=torch.float16)
    # the BatchNorm ops: the cuDNN graph implementation (0); its reserve is empty (the legacy API's is sized by cuDNN)
    c = 32
    scale = torch.rand(c, device="cuda") + 0.5
    shift = torch.randn(c, device="cuda")
    stats = lambda: (torch.randn(c, device="cuda"), torch.rand(c, device="cuda") + 0.5)  # noqa: E731
    z = _input(2, c, 9, 9, requires_grad=True)
    for activation, residual in ((1, None), (2, None), (0, None), (1, _input(2, c, 9, 9))):
        torch.library.opcheck(ops.batch_norm_act.default,
                              (z, scale.requires_grad_(), shift.requires_grad_(), *stats(), residual, 0.1, 1e-5,
                               activation, 0))
    # and our forward kernel (implementation 2), functional too: it writes the next statistics to tensors of their own
    for activation, residual in ((1, None), (3, None), (0, _input(2, c, 9, 9)), (2, _input(2, c, 9, 9))):
        torch.library.opcheck(ops.batch_norm_act.default,
                              (z, scale, shift, *stats(), residual, 0.1, 1e-5, activation, 2))
    y, save_mean, save_invstd, _, _, reserve = ops.batch_norm_act(z.detach(), scale.detach(), shift.detach(), None,
                                                                  None, None, 0.1, 1e-5, 1, 0)
    torch.library.opcheck(ops.batch_norm_act_backward.default,
                          (_input(2, c, 9, 9), z.detach(), y, scale.detach(), shift.detach(), save_mean, save_invstd,
                           reserve, 1e-5, 1, False, 0))
    # the two steps the autograd node runs after a residual add, with y (its mask) and without
    for mask in (y, None):
        grad_z, grad_scale, grad_shift = ops.batch_norm_act_backward_reduce(_input(2, c, 9, 9), z.detach(), mask,
                                                                            scale.detach(), shift.detach(), save_mean,
                                                                            save_invstd, 1)
        torch.library.opcheck(ops.batch_norm_act_backward_reduce.default,
                              (_input(2, c, 9, 9), z.detach(), mask, scale.detach(), shift.detach(), save_mean,
                               save_invstd, 1))
    torch.library.opcheck(ops.batch_norm_backward_dx.default,
                          (grad_z, z.detach(), scale.detach(), shift.detach(), save_mean, save_invstd, grad_scale,
                           grad_shift))
    # the in-place variants the node runs on a gradient only it holds: the result is written over grad_y
    for mask in (y, None):
        torch.library.opcheck(ops.batch_norm_act_backward_reduce_.default,
                              (_input(2, c, 9, 9), z.detach(), mask, scale.detach(), shift.detach(), save_mean,
                               save_invstd, 1))
    torch.library.opcheck(ops.batch_norm_act_backward_.default,
                          (_input(2, c, 9, 9), z.detach(), scale.detach(), shift.detach(), save_mean, save_invstd, 1))
    # a stem's input in its space-to-depth form (ops/stem.py), from float32 NCHW and bfloat16 channels_last
    for image in (torch.randn(2, 3, 9, 10, device="cuda", requires_grad=True),
                  _input(2, 3, 9, 10, requires_grad=True)):
        torch.library.opcheck(ops.space_to_depth.default, (image, [1, 1], [5, 6], torch.bfloat16))
    # the form's filter (our gather kernel) and its gradient (the gather back), and the conv ops in the form, of a
    # 3x3/2 stem of 3 channels: x the float32 image, the filter float32 (cast inside) or already bfloat16
    stem = plan((2, 3, 10, 10), (c, 3, 3, 3), (1, 1), torch.bfloat16, torch.device("cuda"))
    w_stem = torch.randn(c, 3, 3, 3, device="cuda", requires_grad=True)
    torch.library.opcheck(ops.stem_filter.default,
                          (w_stem, stem.index, stem.inverse, list(stem.kernel), stem.channels, torch.bfloat16))
    grad_form = torch.randn(c, stem.channels, *stem.kernel, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(ops.stem_filter_backward.default, (grad_form, stem.inverse, [c, 3, 3, 3], torch.float32))
    image = torch.randn(2, 3, 10, 10, device="cuda").contiguous(memory_format=CL)
    w_form = w_stem.detach().bfloat16().requires_grad_()
    b_form = torch.randn(c, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.library.opcheck(ops.stem_conv_bias_act.default,
                          (image, w_form, b_form, None, stem.index, stem.inverse, stem.form, 1))
    # the float32 parameter with the conv's dtype, as under autocast: the gathers cast it, and its gradient is float32
    torch.library.opcheck(ops.stem_conv_bias_act.default,
                          (image, w_stem, b_form, None, stem.index, stem.inverse, stem.form, 1, 0, torch.bfloat16))
    torch.library.opcheck(ops.stem_conv_batch_norm_act.default,
                          (image, w_stem, None, stem.index, stem.inverse, stem.form, scale, shift, *stats(),
                           torch.zeros((), dtype=torch.long, device="cuda"), None, 0.1, 1e-5, 1, 0, torch.bfloat16))
    # the training ops that update the running statistics and the step count in place
    count = torch.zeros((), dtype=torch.long, device="cuda")
    for implementation in (0, 2):  # the cuDNN graph, then a commit launch; our kernel, writing them as it computes
        for activation, residual in ((1, None), (0, _input(2, c, 9, 9))):
            torch.library.opcheck(ops.batch_norm_act_update.default,
                                  (z, scale, shift, *stats(), count, residual, 0.1, 1e-5, activation, implementation))
        for conv_dtype in (None, torch.bfloat16):
            x32 = x.detach().float().requires_grad_() if conv_dtype else x
            w32 = w.detach().float().requires_grad_() if conv_dtype else w
            torch.library.opcheck(ops.conv_batch_norm_act.default,
                                  (x32, w32, None, [1, 1], [1, 1], [1, 1], 1, scale, shift, *stats(), count, None,
                                   0.1, 1e-5, 1, implementation, conv_dtype))
    # a squeeze-and-excitation block: bfloat16 x with float32 weights (as autocast leaves them), and float32 without
    # the biases; ReLU and SiLU (codes 1 and 3), sigmoid and hardsigmoid
    se = _input(2, c, 5, 5, requires_grad=True)
    w1, w2 = (torch.randn(*size, device="cuda", requires_grad=True) for size in ((8, c, 1, 1), (c, 8, 1, 1)))
    b1, b2 = torch.randn(8, device="cuda", requires_grad=True), torch.randn(c, device="cuda", requires_grad=True)
    torch.library.opcheck(ops.squeeze_excite.default, (se, w1, b1, w2, b2, 1, False))
    torch.library.opcheck(ops.squeeze_excite.default,
                          (se.detach().float().requires_grad_(), w1, None, w2, None, 3, True))


@pytest.mark.parametrize("activation", [1, 2], ids=["relu", "relu6"])
def test_the_in_place_batch_norm_backward_ops_match_the_functional_ones(extension, activation):
    """What the autograd node runs on a gradient only it holds gives the functional ops' results bit for bit (one
    kernel, one launch shape), written over grad_y; so do the two steps it runs after a residual add; a grad_y that
    cannot take them is refused by name."""
    ops = torch.ops.cudnn_fusion
    c = 64
    scale, shift = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    z, residual, grad = _input(4, c, 9, 9), _input(4, c, 9, 9), _input(4, c, 9, 9)
    y, mean, invstd, _, _, reserve = ops.batch_norm_act(z, scale, shift, None, None, None, 0.1, 1e-5, activation, 0)
    dx, _, dw, db = ops.batch_norm_act_backward(grad, z, y, scale, shift, mean, invstd, reserve, 1e-5, activation,
                                                False, 0)
    overwritten = grad.clone()
    dw_, db_ = ops.batch_norm_act_backward_(overwritten, z, scale, shift, mean, invstd, activation)
    assert torch.equal(overwritten, dx) and torch.equal(dw_, dw) and torch.equal(db_, db)
    y, mean, invstd, _, _, _ = ops.batch_norm_act(z, scale, shift, None, None, residual, 0.1, 1e-5, activation, 0)
    dx, dresidual, dw, db = ops.batch_norm_act_backward(grad, z, y, scale, shift, mean, invstd, reserve, 1e-5,
                                                        activation, True, 0)
    grad_z, dw_, db_ = ops.batch_norm_act_backward_reduce(grad, z, y, scale, shift, mean, invstd, activation)
    assert torch.equal(grad_z, dresidual) and torch.equal(dw_, dw) and torch.equal(db_, db)
    assert torch.equal(ops.batch_norm_backward_dx(grad_z, z, scale, shift, mean, invstd, dw_, db_), dx)
    overwritten = grad.clone()
    dw_, db_ = ops.batch_norm_act_backward_reduce_(overwritten, z, y, scale, shift, mean, invstd, activation)
    assert torch.equal(overwritten, grad_z) and torch.equal(dw_, dw) and torch.equal(db_, db)
    nchw = grad.contiguous()
    with pytest.raises(RuntimeError, match="writes its result over grad_y: grad_y must be channels_last-contiguous"):
        ops.batch_norm_act_backward_(nchw, z, scale, shift, mean, invstd, activation)


def _run_and_list_kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, {e.name for e in prof.events()}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(4, 30, 9, 9), (32, 200, 28, 28)], ids=["30ch", "200ch-28x28"])
def test_batch_norm_backward_in_one_launch_gives_the_three_launches_bits(extension, dtype, shape):
    """BatchNorm's backward runs its three passes (partial sums, their total, dx) in one cooperative launch, or the
    first two in one before a separate dx; where dx reads back the g the first pass wrote (the functional op after a
    residual add) it runs them as three launches. All give the same bits: the same partial sums, added in the same
    order. The shapes give more partial rows than the total's 32 lanes, blocks of fewer than 256 threads (30 and
    200 channels) and a channel count that is not a multiple of the total's 8-channel tiles."""
    ops = torch.ops.cudnn_fusion
    c = shape[1]
    torch.manual_seed(0)
    scale, shift = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    z, residual, grad = (_input(*shape, dtype=dtype) for _ in range(3))
    y, mean, invstd, _, _, reserve = ops.batch_norm_act(z, scale, shift, None, None, residual, 0.1, 1e-5, 1, 0)
    (dx, dresidual, dw, db), three = _run_and_list_kernels(
        lambda: ops.batch_norm_act_backward(grad, z, y, scale, shift, mean, invstd, reserve, 1e-5, 1, True, 0))
    assert any("batch_norm_act_backward_finalize" in n for n in three), three
    assert not any("one_launch" in n for n in three), three
    (grad_z, dw_, db_), one = _run_and_list_kernels(
        lambda: ops.batch_norm_act_backward_reduce(grad, z, y, scale, shift, mean, invstd, 1))
    assert any("batch_norm_act_backward_one_launch" in n for n in one), one
    assert not any("finalize" in n for n in one), one
    assert torch.equal(dw_, dw) and torch.equal(db_, db) and torch.equal(grad_z, dresidual)
    assert torch.equal(ops.batch_norm_backward_dx(grad_z, z, scale, shift, mean, invstd, dw_, db_), dx)
    # without a residual: all three passes in the one launch, against its first two and the separate dx
    y, mean, invstd, _, _, reserve = ops.batch_norm_act(z, scale, shift, None, None, None, 0.1, 1e-5, 1, 0)
    (dx, _, dw, db), one = _run_and_list_kernels(
        lambda: ops.batch_norm_act_backward(grad, z, None, scale, shift, mean, invstd, reserve, 1e-5, 1, False, 0))
    assert any("batch_norm_act_backward_one_launch" in n for n in one), one
    assert not any("finalize" in n or "batch_norm_act_backward_dx" in n for n in one), one
    grad_z, dw_, db_ = ops.batch_norm_act_backward_reduce(grad, z, None, scale, shift, mean, invstd, 1)
    assert torch.equal(dw_, dw) and torch.equal(db_, db)
    assert torch.equal(ops.batch_norm_backward_dx(grad_z, z, scale, shift, mean, invstd, dw_, db_), dx)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(5, 40, 7, 9), (3, 72, 33, 31), (256, 1024, 7, 7)],
                         ids=["40ch-7x9", "72ch-33x31", "v1-classifier"])
def test_an_nchw_output_gradient_is_transposed_by_our_kernel_bit_for_bit(extension, dtype, shape):
    """An NCHW-contiguous gradient (a global mean pool's backward gives one) reaches the BatchNorm backward kernel
    through our transposing copy, in the op and in the autograd node: the results are the bits of the same gradient
    given channels_last, at shapes that are not multiples of the copy's 32 x 32 tiles."""
    ops = torch.ops.cudnn_fusion
    c = shape[1]
    torch.manual_seed(0)
    scale, shift = torch.rand(c, device="cuda") + 0.5, torch.randn(c, device="cuda")
    z = _input(*shape, dtype=dtype)
    grad = torch.randn(*shape, device="cuda", dtype=dtype)  # NCHW-contiguous
    y, mean, invstd, _, _, reserve = ops.batch_norm_act(z, scale, shift, None, None, None, 0.1, 1e-5, 1, 0)

    def backward(g):
        return ops.batch_norm_act_backward(g, z, None, scale, shift, mean, invstd, reserve, 1e-5, 1, False, 0)

    got, names = _run_and_list_kernels(lambda: backward(grad))
    assert any("nchw_to_nhwc" in n for n in names), names
    for g, expected in zip(got, backward(grad.contiguous(memory_format=CL))):
        assert torch.equal(g, expected)
    layer = tcf.BatchNorm2dReLU(c).cuda()
    results = []
    for incoming in (grad, grad.contiguous(memory_format=CL)):
        x = z.detach().clone().requires_grad_()
        (x_grad, names) = _run_and_list_kernels(lambda: torch.autograd.grad(layer(x), [x], incoming)[0])
        results.append((x_grad, names))
    assert any("nchw_to_nhwc" in n for n in results[0][1]), results[0][1]
    assert torch.equal(results[0][0], results[1][0])


def test_compile_fullgraph_model_of_fused_modules(extension):
    model = nn.Sequential(
        tcf.Conv2dReLU(16, 32, 3, padding=1), tcf.Conv2dReLU(32, 32, 1), tcf.Conv2dReLU(32, 16, 3, stride=2, padding=1)
    ).cuda().to(dtype=torch.bfloat16, memory_format=CL)
    x = _input(4, 16, 16, 16, requires_grad=True)
    eager_out = model(x)
    eager_grads = torch.autograd.grad(eager_out.float().sum(), [x, *model.parameters()])
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    compiled(x)  # compiles (and runs once)
    hits = tcf.plan_cache_stats()["hits"]
    out = compiled(x)
    assert tcf.plan_cache_stats()["hits"] >= hits + 3, "the compiled model did not run the three fused ops"
    grads = torch.autograd.grad(out.float().sum(), [x, *model.parameters()])
    torch.testing.assert_close(out, eager_out)
    for got, expected in zip(grads, eager_grads):
        torch.testing.assert_close(got, expected)
    assert all(layer.fusion_status.fused for layer in model), tcf.fusion_report(model)


def test_cuda_graph_capture_and_replay_forward_backward(extension):
    model = nn.Sequential(tcf.Conv2dReLU(16, 32, 3, padding=1), tcf.Conv2dReLU(32, 32, 1))
    model = model.cuda().to(dtype=torch.bfloat16, memory_format=CL)
    static_x = _input(4, 16, 12, 12)
    graph, static_y = capture_training_step(model, model, static_x)
    for _ in range(2):
        fresh = _input(4, 16, 12, 12)
        static_x.copy_(fresh)
        graph.replay()
        torch.cuda.synchronize()
        replay_y = static_y.clone()
        replay_grads = [p.grad.clone() for p in model.parameters()]
        expected = model(fresh)
        expected_grads = torch.autograd.grad(expected.float().sum(), list(model.parameters()))
        torch.testing.assert_close(replay_y, expected)
        for got, want in zip(replay_grads, expected_grads):
            torch.testing.assert_close(got, want)


class _BlockNet(nn.Module):
    """conv -> BatchNorm -> ReLU, a depthwise one, and a 1x1 conv -> BatchNorm whose output adds the block's input
    before a ReLU: the three patterns fuse() turns into Conv2dBNReLU (dense and depthwise) and Conv2dBNAddReLU."""

    def __init__(self, c=32):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(16, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.dw = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.pw = nn.Conv2d(c, c, 1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        x = self.stem(x)
        y = torch.relu(self.bn(self.pw(self.dw(x))) + x)
        return self.head(y.mean((2, 3)))


def test_cuda_graph_capture_of_a_fused_models_training_step(extension):
    # A fuse()d model's whole training step (BatchNorm on batch statistics: running statistics and the step count
    # written on the GPU) captured once and replayed on a new batch gives what the same model gives run uncaptured
    # from the same state: output, every gradient and every buffer.
    torch.manual_seed(0)
    fused, report = tcf.fuse(_BlockNet().cuda().to(memory_format=CL))
    assert report.conv_coverage()[:2] == (3, 3), report
    fused.train()

    def forward(x):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return fused(x)

    static_x = torch.randn(8, 16, 14, 14, device="cuda").contiguous(memory_format=CL)
    graph, static_y = capture_training_step(forward, fused, static_x)

    def ran_fused() -> int:  # the Conv2d layers whose module ran fused in its last forward
        return sum(row.convs for row in report.replaced if fused.get_submodule(row.path).fusion_status.fused)

    assert ran_fused() == 3  # the captured forward ran every layer fused, not an eager fallback
    buffers = list(fused.buffers())
    before = [b.clone() for b in buffers]
    fresh = torch.randn(8, 16, 14, 14, device="cuda").contiguous(memory_format=CL)
    static_x.copy_(fresh)
    graph.replay()
    torch.cuda.synchronize()
    replayed = [static_y.clone(), *(p.grad.clone() for p in fused.parameters()), *(b.clone() for b in buffers)]
    for buffer, value in zip(buffers, before):  # back to the state the replay started from
        buffer.copy_(value)
    expected = forward(fresh)
    grads = torch.autograd.grad(expected.float().sum(), list(fused.parameters()))
    for index, (got, want) in enumerate(zip(replayed, [expected, *grads, *buffers])):
        if want.is_floating_point():
            assert torch.isfinite(got).all() and rel_err(got, want) < 1e-3, (index, rel_err(got, want))
        else:  # num_batches_tracked
            assert torch.equal(got, want), (index, got, want)
    assert ran_fused() == 3


def test_cuda_graph_capture_of_a_fused_models_step_with_its_optimizer(extension):
    # The step a training loop captures whole (zero_grad, forward, backward, SGD with momentum), as zoo_speed.py
    # --gpu-time replays it: one replay on a new batch moves the parameters, the momentum buffers and the BatchNorm
    # buffers as far as the same step run uncaptured from the same state moves them.
    torch.manual_seed(0)
    fused, report = tcf.fuse(_BlockNet().cuda().to(memory_format=CL))
    fused.train()
    opt = torch.optim.SGD(fused.parameters(), lr=0.1, momentum=0.9)
    static_x = torch.randn(8, 16, 14, 14, device="cuda").contiguous(memory_format=CL)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fused(static_x).float().sum()
        loss.backward()
        opt.step()

    graph, _ = capture(step)  # the warm-up calls create the momentum buffers before the capture
    layers = [fused.get_submodule(row.path) for row in report.replaced if row.convs]
    assert len(layers) == 3 and all(layer.fusion_status.fused for layer in layers)  # captured fused, not eager
    state = [*fused.parameters(), *fused.buffers(), *(opt.state[p]["momentum_buffer"] for p in fused.parameters())]
    before = [t.detach().clone() for t in state]
    static_x.copy_(torch.randn_like(static_x))
    graph.replay()
    torch.cuda.synchronize()
    replayed = [t.detach().clone() for t in state]
    with torch.no_grad():
        for t, value in zip(state, before):
            t.copy_(value)
    step()
    for index, (got, t, start) in enumerate(zip(replayed, state, before)):
        if not start.is_floating_point():  # num_batches_tracked
            assert torch.equal(got, t) and not torch.equal(got, start), (index, got, t, start)
            continue
        moved, expected = got.double() - start.double(), t.detach().double() - start.double()
        assert expected.norm() > 0 and rel_err(moved, expected) < 1e-3, (index, rel_err(moved, expected))


def test_plan_cache_hits_on_second_call_and_clears(extension):
    tcf.clear_plan_cache()
    layer = _layer(tcf.Conv2dReLU, 16, 16, 3, padding=1)
    x = _input(2, 16, 10, 10)
    with torch.no_grad():
        layer(x)
        first = tcf.plan_cache_stats()
        layer(x)
        second = tcf.plan_cache_stats()
    assert first["builds"] == 1 and first["misses"] == 1 and first["entries"] == 1, first
    assert second["builds"] == 1 and second["hits"] > first["hits"], second
    assert first["build_seconds"] > 0
    assert first["tuned"] == 0 and first["tune_seconds"] == 0, first  # nothing is tuned without benchmark
    tcf.clear_plan_cache()
    assert tcf.plan_cache_stats()["entries"] == 0


def test_plan_cache_capacity_evicts_least_recently_used(extension):
    tcf.clear_plan_cache()
    tcf.set_plan_cache_capacity(2)
    try:
        with torch.no_grad():
            for size in (8, 9, 10):
                tcf.Conv2dReLU(16, 16, 1).cuda().to(torch.bfloat16)(_input(1, 16, size, size))
        stats = tcf.plan_cache_stats()
        assert stats["entries"] == 2 and stats["evictions"] == 1, stats
    finally:
        tcf.set_plan_cache_capacity(1024)
        tcf.clear_plan_cache()


def test_autocast_runs_fused_in_bfloat16(extension):
    torch.manual_seed(0)
    conv = nn.Conv2d(16, 32, 3, padding=1).cuda().to(memory_format=CL)
    fused = tcf.Conv2dReLU.from_conv(conv)
    x = torch.randn(4, 16, 10, 10, device="cuda").contiguous(memory_format=CL)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out, expected = fused(x), F.relu(conv(x))
    assert out.dtype == expected.dtype == torch.bfloat16
    assert fused.fusion_status.fused
    torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
    out.float().sum().backward()
    assert fused.weight.grad.dtype == torch.float32


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_data_parallel(extension):
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = nn.Sequential(tcf.Conv2dReLU(16, 16, 3, padding=1), tcf.Conv2dReLU(16, 16, 1)).cuda()
        plain = plain.to(memory_format=CL)
        ddp_model = nn.parallel.DistributedDataParallel(
            nn.Sequential(*(tcf.Conv2dReLU.from_conv(m) for m in plain)), device_ids=[0]
        )
        x = torch.randn(4, 16, 8, 8, device="cuda").contiguous(memory_format=CL)
        expected = torch.autograd.grad(plain(x).sum(), list(plain.parameters()))
        for p in ddp_model.parameters():
            p.grad = None
        ddp_model(x).sum().backward()
        for p, want in zip(ddp_model.parameters(), expected):
            torch.testing.assert_close(p.grad, want)
        assert all(m.fusion_status.fused for m in ddp_model.module)
    finally:
        dist.destroy_process_group()


def test_the_python_enums_are_the_extensions(extension):
    from torch_cudnn_fusion import _cpp_enums

    for name in ("Activation", "BatchNormImplementation", "PolicyMode", "Graph"):
        ours, theirs = getattr(_cpp_enums, name), getattr(extension, name)
        assert {m.name: int(m) for m in ours} == {k: int(v) for k, v in theirs.__members__.items()}, name


def test_a_cold_build_blocks_no_thread_that_hits_another_key(extension):
    """Builds run outside the plan cache's lock: while one thread builds a plan (held open for 2 s by the test aid),
    another thread's calls on a cached key go on; a third thread asking for the key being built waits for that one
    build rather than building it again."""
    cached = _layer(tcf.Conv2dReLU, 16, 16, 3, padding=1)
    x_cached = _input(2, 16, 10, 10)
    with torch.no_grad():
        cached(x_cached)  # its plans are built and cached
    cold = _layer(tcf.Conv2dReLU, 16, 16, 3, padding=1)
    x_cold = _input(2, 16, 23, 29)  # a size no other test uses: its plans are built in this test
    builds_before = tcf.plan_cache_stats()["builds"]
    errors, finished = [], {}

    def build_cold(name):
        try:
            with torch.no_grad():
                cold(x_cold)
            torch.cuda.synchronize()
            finished[name] = time.perf_counter()
        except Exception as exc:  # re-raised below
            errors.append(exc)

    extension.set_build_delay_for_tests(2000)
    try:
        start = time.perf_counter()
        builders = [threading.Thread(target=build_cold, args=(name,)) for name in ("first", "second")]
        for thread in builders:
            thread.start()
        time.sleep(0.3)  # the first build is under way
        hits_start = time.perf_counter()
        with torch.no_grad():
            for _ in range(10):
                cached(x_cached)
        torch.cuda.synchronize()
        hits_seconds = time.perf_counter() - hits_start
        for thread in builders:
            thread.join()
    finally:
        extension.set_build_delay_for_tests(0)
    assert not errors, errors
    assert hits_seconds < 1.0, f"calls on a cached key waited {hits_seconds:.2f} s for another key's build"
    assert min(finished.values()) - start >= 2.0  # the builds did take the delay
    assert cold.fusion_status.fused, cold.fusion_status
    # one build per graph of the cold layer (forward, and here no backward): the second thread built nothing
    assert tcf.plan_cache_stats()["builds"] - builds_before == 1


def test_threads_share_the_plan_cache_safely(extension):
    errors = []
    shapes = [(16, 8), (32, 10), (16, 12), (32, 14)]

    def worker(cin, size):
        try:
            layer = _layer(tcf.Conv2dReLU, cin, 16, 3, padding=1)
            for _ in range(20):
                x = _input(2, cin, size, size)
                with torch.no_grad():
                    out = layer(x)
                    expected = F.relu(F.conv2d(x, layer.weight, layer.bias, padding=1))
                assert rel_err(out, expected.double()) < 1e-2
        except Exception as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=s) for s in shapes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def _saved_bytes(fn):
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(storages.values())


def test_saved_activations_are_no_larger_than_eager(extension):
    layer = _layer(tcf.Conv2dAddReLU, 64, 64, 3, padding=1)
    x = _input(8, 64, 28, 28, requires_grad=True)
    residual = _input(8, 64, 28, 28, requires_grad=True)
    fused = _saved_bytes(lambda: layer(x, residual))
    eager = _saved_bytes(lambda: F.relu(F.conv2d(x, layer.weight, layer.bias, padding=1) + residual))
    assert layer.fusion_status.fused
    expected = (x.numel() + layer.weight.numel() + residual.numel()) * 2  # x, w and y (y has residual's size)
    assert fused == expected, (fused, expected)
    assert fused <= eager, (fused, eager)


def test_zero_size_batch(extension):
    layer = _layer(tcf.Conv2dReLU, 16, 32, 3, padding=1)
    x = _input(0, 16, 8, 8, requires_grad=True)
    out = layer(x)
    assert out.shape == (0, 32, 8, 8) and layer.fusion_status.fused
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert torch.count_nonzero(layer.weight.grad) == 0 and torch.count_nonzero(layer.bias.grad) == 0


def _rss_mb() -> float:
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # memory freed but kept by malloc is not growth
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith("VmRSS:"))


def test_many_input_shapes_keep_host_memory_bounded(extension):
    """600 shapes through one layer grew the process by 38 MB. Here: 150 shapes (each builds new plans), the plan
    cache capped at 16; from shape 50 on, Python's allocations may grow by little (the layer keeps only its last
    decision) and the process by little (benchmarks/host_memory.py measures it)."""
    capacity = tcf.plan_cache_stats()["capacity"]
    tcf.set_plan_cache_capacity(16)
    try:
        layer = _layer(tcf.Conv2dReLU, 16, 16, 3, padding=1, dtype=torch.float32)
        for i in range(150):
            if i == 50:
                torch.cuda.synchronize()
                rss = _rss_mb()
                tracemalloc.start()
                snapshot = tracemalloc.take_snapshot()
            x = torch.randn(2, 16, 8 + i, 9, device="cuda").to(memory_format=torch.channels_last).requires_grad_()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                y = layer(x)
            y.float().sum().backward()
            assert layer.fusion_status.fused, layer.fusion_status
        torch.cuda.synchronize()
        python_growth = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(snapshot, "filename"))
        tracemalloc.stop()
        rss_growth = _rss_mb() - rss
        stats = tcf.plan_cache_stats()
    finally:
        tcf.set_plan_cache_capacity(capacity)
    assert stats["entries"] <= 16 and stats["evictions"] > 0, stats
    assert python_growth < 200 * 1024, f"Python allocations grew by {python_growth / 1024:.0f} KB over 100 shapes"
    assert rss_growth < 12, f"the process grew by {rss_growth:.1f} MB over 100 shapes"


def test_misaligned_input_is_correct_whatever_cuDNN_decides(extension):
    """A view 2 bytes off a 16-byte boundary: cuDNN may refuse it; the result is right either way."""
    base = torch.randn(2 * 16 * 8 * 8 + 1, device="cuda", dtype=torch.bfloat16)
    x = base[1:].view(2, 8, 8, 16).permute(0, 3, 1, 2)  # channels_last, data pointer 2-byte aligned
    layer = _layer(tcf.Conv2dReLU, 16, 16, 3, padding=1)
    with torch.no_grad():
        out = layer(x)
        expected = F.relu(F.conv2d(x, layer.weight, layer.bias, padding=1))
    status = layer.fusion_status
    # The plan cache refuses a key with a misaligned operand before cuDNN would fail at execution.
    assert not status.fused and "pointer alignment" in status.reason, status
    assert rel_err(out, expected.double()) < 1e-2


def test_fallbacks_on_the_gpu_say_why_and_match_eager(extension):
    odd = _layer(tcf.Conv2dReLU, 36, 36, 3, padding=1)
    depthwise = _layer(tcf.Conv2dReLU, 32, 32, 7, padding=3, groups=32)  # 7x7: not one our kernels are built for
    x36, x32 = _input(2, 36, 10, 10), _input(2, 32, 10, 10)
    with torch.no_grad():
        torch.testing.assert_close(odd(x36), F.relu(F.conv2d(x36, odd.weight, odd.bias, padding=1)), rtol=0, atol=0)
        expected = F.relu(F.conv2d(x32, depthwise.weight, depthwise.bias, padding=3, groups=32))
        torch.testing.assert_close(depthwise(x32), expected, rtol=0, atol=0)
    assert "not both multiples of 8" in odd.fusion_status.reason
    reason = depthwise.fusion_status.reason
    assert reason.startswith("groups=32") and "kernel_size=(7, 7): our depthwise kernels are built for 3x3" in reason
    with tcf.strict(), pytest.raises(tcf.FusionError, match="groups=32"):
        depthwise(x32)


@pytest.mark.parametrize(
    "make_args, message",
    [
        (lambda: (_input(1, 16, 8, 8), torch.randn(16, 16, 3, 3, dtype=torch.bfloat16)),
         r"weight must be on the same device as x \(cuda:0\), got cpu"),
        (lambda: (_input(1, 16, 8, 8), torch.randn(16, 16, 3, 3, device="cuda")),
         r"weight dtype must match x dtype \(torch.bfloat16\), got torch.float32"),
    ],
)
def test_bad_inputs_on_the_gpu(extension, make_args, message):
    x, w = make_args()
    with pytest.raises(ValueError, match=message):
        tcf.conv2d_bias_act(x, w, padding=1)


def test_raw_op_errors_name_the_argument(extension):
    ops = torch.ops.cudnn_fusion
    x = _input(1, 16, 8, 8)
    w = torch.randn(16, 16, 3, 3, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"residual must have the output's shape \[1, 16, 8, 8\], got \[1, 16, 4, 4\]"):
        ops.conv_bias_act(x, w, None, _input(1, 16, 4, 4), [1, 1], [1, 1], [1, 1], [1, 1], 1, 1)
    with pytest.raises(RuntimeError, match=r"bias dtype must match x dtype \(BFloat16\), got Float"):
        ops.conv_bias_act(x, w, torch.randn(16, device="cuda"), None, [1, 1], [1, 1], [1, 1], [1, 1], 1, 1)
    with pytest.raises(ValueError, match=r"x has 16 channels but weight of shape \[16, 8, 3, 3\] with groups=1 expects 8"):
        ops.conv_bias_act(x, w[:, :8], None, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, 1)
    with pytest.raises(RuntimeError, match=r"x must be a 4-D tensor \[N, C, H, W\], got 3-D"):
        ops.conv_bias_act(x[0], w, None, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, 1)


def test_raw_op_on_a_misaligned_pointer_falls_back_and_counts_it(extension):
    base = torch.randn(2 * 16 * 8 * 8 + 1, device="cuda", dtype=torch.bfloat16)
    x = base[1:].view(2, 8, 8, 16).permute(0, 3, 1, 2)
    w = torch.randn(16, 16, 3, 3, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=CL)
    before = tcf.plan_cache_stats()["runtime_fallbacks"]
    out = torch.ops.cudnn_fusion.conv_bias_act(x, w, None, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, 1)
    stats = tcf.plan_cache_stats()
    assert stats["runtime_fallbacks"] == before + 1
    assert "not 16-byte aligned" in stats["last_runtime_fallback"], stats["last_runtime_fallback"]
    assert rel_err(out, F.relu(F.conv2d(x.double(), w.double(), padding=1))) < 1e-2


def test_cudnn_benchmark_tunes_each_plan_once_and_stays_correct(extension):
    tcf.clear_plan_cache()
    previous = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = True
    try:
        layer = _layer(tcf.Conv2dReLU, 64, 128, 1)
        x = _input(8, 64, 28, 28, requires_grad=True)
        for _ in range(3):
            out = layer(x)
            out.float().sum().backward()
        stats = tcf.plan_cache_stats()
        # forward, dgrad, wgrad: once each (ReLU + bias backward is our own kernel in NHWC, nothing to tune)
        assert stats["tuned"] == 3, stats
        assert stats["tune_seconds"] > 0, stats
        expected = F.relu(F.conv2d(x.double(), layer.weight.double(), layer.bias.double()))
        assert rel_err(out, expected) < 1e-2
    finally:
        torch.backends.cudnn.benchmark = previous
        tcf.clear_plan_cache()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(3, 8, 5, 7), (2, 24, 9, 9), (1, 1024, 7, 7), (4, 64, 33, 1)])
def test_relu_bias_backward_kernel_matches_aten(extension, dtype, shape):
    """Our NHWC kernel: dz = grad where y > 0, grad_bias = sum over N, H, W (float32 accumulation)."""
    grad = torch.randn(*shape, device="cuda", dtype=dtype).contiguous(memory_format=CL)
    y = torch.relu(torch.randn(*shape, device="cuda", dtype=dtype)).contiguous(memory_format=CL)
    y.masked_fill_(torch.rand_like(y) < 0.1, 0)  # exact zeros must mask too
    dz, dbias = torch.ops.cudnn_fusion.relu_bias_backward(grad, y)
    expected = torch.ops.aten.threshold_backward(grad, y, 0)
    torch.testing.assert_close(dz, expected, rtol=0, atol=0)
    assert dz.is_contiguous(memory_format=CL)
    reference = expected.double().sum((0, 2, 3))
    assert dbias.dtype == dtype
    tolerance = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(dbias.double(), reference, rtol=tolerance, atol=tolerance * reference.abs().max().item())


def test_explain_names_the_plan_that_ran(extension):
    tcf.clear_plan_cache()
    model = nn.Sequential(tcf.Conv2dReLU(64, 64, 3, padding=1), tcf.Conv2dReLU(64, 64, 3, padding=1, groups=2))
    model = model.cuda().to(dtype=torch.bfloat16, memory_format=CL)
    report = tcf.explain(model, _input(8, 64, 28, 28), repeats=3)
    fused, fallback = report
    assert fused.fused and fused.operations == ("conv_fprop", "add bias", "relu")
    heuristic = [c for c in tcf.engines([8, 64, 28, 28], [64, 64, 3, 3], padding=1) if c.heuristic_choice]
    assert fused.engine == heuristic[0].name and fused.workspace_bytes == heuristic[0].workspace_bytes
    assert not fused.autotuned and fused.median_ms > 0
    assert not fallback.fused and fallback.reason.startswith("groups=2") and fallback.median_ms > 0
    assert fused.engine in str(report)


def test_debug_dir_dumps_graphs_and_logs(extension, tmp_path):
    import json
    import subprocess
    import sys

    code = (
        "import torch, torch_cudnn_fusion as t\n"
        "layer = t.Conv2dReLU(16, 16, 3, padding=1).cuda().to(memory_format=torch.channels_last)\n"
        "layer(torch.randn(2, 16, 8, 8, device='cuda').to(memory_format=torch.channels_last))\n"
        "torch.cuda.synchronize()\n"
    )
    env = dict(os.environ, TORCH_CUDNN_FUSION_DEBUG_DIR=str(tmp_path))
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
    graphs = sorted(tmp_path.glob("graph_*.json"))
    assert graphs, list(tmp_path.iterdir())
    dumped = json.loads(graphs[0].read_text())
    assert dumped["graph_kind"] == "conv_bias_act forward" and dumped["refusal"] == "" and dumped["graph"]
    assert (tmp_path / "cudnn_frontend.log").stat().st_size > 0
    assert (tmp_path / "cudnn.log").stat().st_size > 0
