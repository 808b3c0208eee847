"""Numerics of the fused layer on the GPU: forward and every gradient against eager PyTorch and a float64
reference, with outputs poisoned (NaN) before each graph runs, and a check of which path ran and why."""

import copy

import pytest
import torch
import torch.nn.functional as F

import torch_cudnn_fusion as tcf
from torch_cudnn_fusion.ops import LayerCall, decide

from conftest import CountingCall, assert_as_accurate_as_eager, gpu, rel_err, reference_conv_bias_act, without_ambiguous_relu6_gradient

pytestmark = gpu

# name, in_channels, out_channels, kernel, stride, padding, dilation, (N, H, W)
CONFIGS = [
    ("1x1", 16, 32, 1, 1, 0, 1, (2, 14, 14)),
    ("3x3-odd-spatial", 32, 32, 3, 1, 1, 1, (2, 15, 17)),
    ("3x3-stride2-batch1", 32, 64, 3, 2, 1, 1, (1, 16, 16)),
    ("5x5", 16, 16, 5, 1, 2, 1, (2, 13, 13)),
    ("7x7-stride2", 8, 16, 7, 2, 3, 1, (2, 23, 23)),
    ("3x3-dilation2", 16, 16, 3, 1, 2, 2, (2, 12, 12)),
    ("4x4-same", 16, 16, 4, 1, "same", 1, (2, 10, 10)),
    ("3x3-padding(0,1)", 16, 24, 3, 1, (0, 1), 1, (2, 9, 11)),
    ("3x3-channels12to20", 12, 20, 3, 1, 1, 1, (2, 10, 10)),
]
VARIANTS = {  # name: (bias, residual, activation)
    "bias+relu": (True, False, "relu"),
    "relu": (False, False, "relu"),
    "bias+residual+relu": (True, True, "relu"),
    "bias+identity": (True, False, None),
    "bias+relu6": (True, False, "relu6"),  # inputs scaled by 4: outputs of std about 4, some clip at 6
}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _policy_allows(dtype, cin, cout):
    multiple = 4 if dtype == torch.float32 else 8
    return cin % multiple == 0 and cout % multiple == 0


def _check_path(status, dtype, channels_last, cin, cout, activation):
    """Which path must have run, and for a fallback, that its reason is the expected one."""
    if not _policy_allows(dtype, cin, cout):
        assert not status.fused and "multiple" in status.reason, status
        return
    refusals = ([] if status.fused else [status.reason]) + [why for _, why in status.backward if why]
    if channels_last and dtype != torch.float32:
        assert status.fused and not refusals, f"NHWC {dtype} must run fused end to end: {status}"
    if status.fused and activation == "relu6" and channels_last and dtype != torch.float32:
        assert "clamp" not in status.reason, status  # ReLU6 in the graph: ReLU, then the minimum with 6
    if activation == "relu6" and not channels_last and status.fused:  # ReLU6's backward: no cuDNN graph, eager's
        backward = dict(status.backward)["relu_bias_backward"]
        assert "ReLU6's backward runs in our kernel for channels_last" in backward, status
        refusals.remove(backward)
    for reason in refusals:
        # Anything cuDNN refused must be traced to a requirement this configuration does not meet.
        expected = "layout: tensors are NCHW" if not channels_last else "allow_tf32=False"
        assert reason.startswith("cuDNN refused") and expected in reason, reason


@pytest.mark.parametrize("layout", ["channels_last", "nchw"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("config", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_forward_and_gradients_match_eager_and_float64(extension, no_tf32, config, variant, dtype, layout):
    name, cin, cout, kernel, stride, padding, dilation, (n, h, w) = config
    has_bias, has_residual, activation = VARIANTS[variant]
    channels_last = layout == "channels_last"
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    torch.manual_seed(hash((name, variant, str(dtype), layout)) % 2**31)

    def make(*shape, scale=1.0):
        return (torch.randn(*shape, device="cuda") * scale).to(dtype)

    x = make(n, cin, h, w, scale=4.0 if activation == "relu6" else 1.0).contiguous(memory_format=memory_format)
    weight = make(cout, cin, kernel, kernel, scale=(cin * kernel * kernel) ** -0.5)
    weight = weight.contiguous(memory_format=memory_format)
    bias = make(cout) if has_bias else None
    out_shape = reference_conv_bias_act(x, weight, None, None, stride, padding, dilation, 1, False).shape
    residual = make(*out_shape).contiguous(memory_format=memory_format) if has_residual else None
    leaves = [t.requires_grad_() for t in (x, weight, bias, residual) if t is not None]

    fallbacks_before = extension.plan_cache_stats()["runtime_fallbacks"]
    call = LayerCall()  # keeps the decision of this functional call
    y = tcf.conv2d_bias_act(x, weight, bias, residual, stride, padding, dilation, 1, activation, call=call)
    status = call.status
    grad_y = torch.randn_like(y)
    if activation == "relu6":
        inputs64 = [t.detach().double() if t is not None else None for t in (x, weight, bias, residual)]
        z64 = reference_conv_bias_act(*inputs64, stride, padding, dilation, 1, False)
        grad_y = without_ambiguous_relu6_gradient(grad_y, z64, dtype)
    grads = torch.autograd.grad(y, leaves, grad_y)
    _check_path(status, dtype, channels_last, cin, cout, activation)
    if status.fused and not any(why for _, why in status.backward):
        # The fused graphs ran: no op fell back to ATen at run time.
        assert extension.plan_cache_stats()["runtime_fallbacks"] == fallbacks_before

    relu = activation if activation == "relu6" else activation == "relu"
    eager_y = reference_conv_bias_act(x, weight, bias, residual, stride, padding, dilation, 1, relu)
    eager_grads = torch.autograd.grad(eager_y, leaves, grad_y)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    it = iter(leaves64)
    x64, w64 = next(it), next(it)
    b64 = next(it) if has_bias else None
    r64 = next(it) if has_residual else None
    ref_y = reference_conv_bias_act(x64, w64, b64, r64, stride, padding, dilation, 1, relu)
    ref_grads = torch.autograd.grad(ref_y, leaves64, grad_y.double())

    assert y.shape == eager_y.shape and y.dtype == eager_y.dtype
    assert y.is_contiguous(memory_format=memory_format) == eager_y.is_contiguous(memory_format=memory_format)
    assert_as_accurate_as_eager("y", y, eager_y, ref_y, dtype)
    names = ["grad_x", "grad_weight", "grad_bias", "grad_residual"]
    present = [nm for nm, t in zip(names, (x, weight, bias, residual)) if t is not None]
    for nm, got, eager, ref in zip(present, grads, eager_grads, ref_grads):
        assert got.shape == ref.shape and got.dtype == dtype, nm
        assert_as_accurate_as_eager(nm, got, eager, ref, dtype)


def test_recorded_conv_call_runs_repeated_calls_and_steps_aside_when_the_call_changes(extension, no_tf32):
    """A fused conv layer's repeated calls run through the call recorded in C++ (csrc/ops/conv_call.h); a call that
    differs in a tensor's metadata (x's requires_grad, layout, batch, alignment; the residual's dtype), in the global
    state (autocast, TF32) or in the conv's settings (stride) goes back to Python's decision, which records it anew.
    Every call's output and gradients match eager's."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(16, 32, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    conv_e = copy.deepcopy(conv)
    fused = tcf.Conv2dAddReLU.from_conv(conv)
    # float32 runs fused with TF32 (cuDNN's conv + bias engines are tensor-core ones): on, but for one call
    base = {"grad": True, "channels_last": True, "batch": 4, "offset": 0, "autocast": False, "tf32": True,
            "stride": 1}
    # (the call's change from base, whether the recorded call runs it: None for the first call)
    calls = [({}, None), ({}, True), ({"grad": False}, False), ({"grad": False}, True), ({"channels_last": False}, False),
             ({"batch": 3}, False), ({"batch": 3}, True), ({"offset": 1}, False), ({"autocast": True}, False),
             ({"autocast": True}, True), ({"tf32": False}, False), ({"stride": 2}, False), ({"stride": 2}, True),
             ({}, False), ({}, True)]
    counting, side = None, 10
    for i, (change, expect_ran) in enumerate(calls):
        c = {**base, **change}
        fused.stride = conv_e.stride = (c["stride"], c["stride"])
        torch.backends.cudnn.allow_tf32 = c["tf32"]
        dtype = torch.bfloat16 if c["autocast"] else torch.float32
        # x channels_last, `offset` elements into its buffer (offset 1: 4-byte aligned, a different plan key)
        buffer = torch.randn(c["batch"] * 16 * side * side + c["offset"], device="cuda")
        x = buffer[c["offset"]:].view(c["batch"], side, side, 16).permute(0, 3, 1, 2)
        x = x if c["channels_last"] else x.contiguous()
        side_out = (side - 1) // c["stride"] + 1
        residual = torch.randn(c["batch"], 32, side_out, side_out, device="cuda", dtype=dtype)
        residual = residual.to(memory_format=torch.channels_last)
        x1, x2 = x.detach().requires_grad_(c["grad"]), x.detach().requires_grad_(c["grad"])
        r1, r2 = residual.clone().requires_grad_(), residual.clone().requires_grad_()
        recorded = fused._call.recorded
        if recorded is not None and not isinstance(recorded, CountingCall):
            counting = fused._call.recorded = CountingCall(recorded)
        ran_before = counting.ran if counting is not None else 0
        with torch.autocast("cuda", torch.bfloat16, enabled=c["autocast"]):
            y, z_e = fused(x1, r1), conv_e(x2) + r2
        y_e = F.relu(z_e)
        # cuDNN may refuse a 4-byte aligned x; without TF32 it refuses float32 (eager runs, and is checked)
        assert fused.fusion_status.fused or c["offset"] or not c["tf32"], (i, fused.fusion_status)
        if expect_ran is not None:
            assert counting.ran == ran_before + expect_ran, (i, change, counting.ran, counting.declined)
        assert y.dtype == y_e.dtype == dtype and y.is_contiguous(memory_format=torch.channels_last)
        tol = 2e-2 if c["autocast"] else 5e-3 if c["tf32"] else 1e-5
        assert rel_err(y, y_e) <= tol, (i, change, rel_err(y, y_e))
        # no gradient where the output is within the dtype's error of ReLU's kink: there the mask depends on how
        # an implementation rounded (TF32 and bfloat16 flip a few), not on its accuracy
        band = 2 * tol * z_e.detach().abs().max()
        grad = torch.randn_like(y).masked_fill(z_e.detach().abs() <= band, 0)
        y.backward(grad), y_e.backward(grad)
        pairs = [("weight", conv.weight, conv_e.weight), ("bias", conv.bias, conv_e.bias), ("residual", r1, r2)]
        pairs += [("x", x1, x2)] if c["grad"] else []
        for name, t, t_e in pairs:
            assert rel_err(t.grad, t_e.grad) <= tol, (i, change, name, rel_err(t.grad, t_e.grad))
        conv.weight.grad = conv.bias.grad = conv_e.weight.grad = conv_e.bias.grad = None


def test_a_layer_that_runs_eager_checks_its_repeats_in_cpp_and_computes_what_eager_does(extension):
    """A conv layer decided eager (bfloat16 with 26 output channels, not a multiple of 8: regnet_y's
    squeeze-and-excitation convs) records its call too: a repeat is compared in C++ (ConvBiasActCall.matches) and runs
    eager's composition on the tensors as passed, so autocast casts them as it casts nn.Conv2d's; a call that differs
    (the batch) goes back to Python's decision. The output equals nn.Conv2d + ReLU's; the gradients match theirs."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(104, 26, 1).cuda().to(memory_format=torch.channels_last)
    conv_e = copy.deepcopy(conv)
    fused = tcf.Conv2dReLU.from_conv(conv)
    counting = None
    # (batch, whether the record matched it: None for the first call)
    for i, (batch, expect_ran) in enumerate([(8, None), (8, True), (8, True), (4, False), (4, True)]):
        x = torch.randn(batch, 104, 3, 3, device="cuda").to(memory_format=torch.channels_last)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        recorded = fused._call.recorded
        if recorded is not None and not isinstance(recorded, CountingCall):
            counting = fused._call.recorded = CountingCall(recorded)
        ran_before = counting.ran if counting is not None else 0
        with torch.autocast("cuda", torch.bfloat16):
            y, y_e = fused(x1), F.relu(conv_e(x2))
        status = fused.fusion_status
        assert not status.fused and "multiples of 8" in status.reason, (i, status)
        assert fused._call.recorded is not None, i
        if expect_ran is not None:
            assert counting.ran == ran_before + expect_ran, (i, counting.ran, counting.declined)
        assert y.dtype == y_e.dtype == torch.bfloat16 and torch.equal(y, y_e), i
        grad = torch.randn_like(y)
        y.backward(grad), y_e.backward(grad)
        for name, t, t_e in (("x", x1, x2), ("weight", conv.weight, conv_e.weight), ("bias", conv.bias, conv_e.bias)):
            assert t.grad.dtype == t_e.grad.dtype and rel_err(t.grad, t_e.grad) <= 1e-3, (i, name)
        conv.weight.grad = conv.bias.grad = conv_e.weight.grad = conv_e.bias.grad = None


def test_an_eager_layers_record_tells_a_change_of_autocast_and_the_decision_follows(extension):
    """The record of a layer decided eager compares the global state too, not only the tensors: 104 -> 28 channels runs
    eager under bfloat16 autocast (28 is not a multiple of 8) and fused in float32 (a multiple of 4). Switching
    autocast off and on flips the status each time; a repeat in the same state runs from the record; every call
    computes what nn.Conv2d + ReLU do (bfloat16: the same bits; float32: within twice eager's error against float64)."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(104, 28, 1).cuda().to(memory_format=torch.channels_last)
    conv_e, conv64 = copy.deepcopy(conv), copy.deepcopy(conv).double()
    fused = tcf.Conv2dReLU.from_conv(conv)
    x = torch.randn(8, 104, 3, 3, device="cuda").to(memory_format=torch.channels_last)
    reference = F.relu(conv64(x.double()))
    counting, previous = None, None
    for i, autocast in enumerate([True, True, False, False, True, True]):
        recorded = fused._call.recorded
        if recorded is not None and not isinstance(recorded, CountingCall):
            counting = fused._call.recorded = CountingCall(recorded)
        ran_before = counting.ran if counting is not None else 0
        declined_before = counting.declined if counting is not None else 0
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            y, y_e = fused(x), F.relu(conv_e(x))
        status = fused.fusion_status
        assert status.fused == (not autocast), (i, autocast, status)
        if previous is not None:  # the record ran (or matched) a repeat, and declined a call in another state
            same = autocast == previous
            assert (counting.ran - ran_before, counting.declined - declined_before) == (same, not same), (i, autocast)
        if autocast:
            assert y.dtype == y_e.dtype == torch.bfloat16 and torch.equal(y, y_e), i
        else:
            assert y.dtype == torch.float32, i
            # both may round their inputs to TF32 (cudnn.allow_tf32's default): the floor is that rounding's error
            assert rel_err(y, reference) <= 2 * rel_err(y_e, reference) + 2e-3, (i, rel_err(y, reference))
        previous = autocast


def test_relu6_refused_in_the_graph_runs_as_a_clamp_after_it(extension, no_tf32):
    """Where cuDNN refuses the conv + bias graph with ReLU6 in it (forced here by a test aid), the op runs the graph
    without the activation and a clamp after it (conv_ops.cpp, forward_plan): the status says so and quotes the
    refusal, a clamp kernel runs, and the output and gradients are as accurate as eager's against float64."""
    torch.manual_seed(0)
    dtype = torch.bfloat16
    x = (torch.randn(4, 32, 12, 12, device="cuda") * 4).to(dtype).contiguous(memory_format=torch.channels_last)
    weight = (torch.randn(64, 32, 3, 3, device="cuda") / 17).to(dtype).contiguous(memory_format=torch.channels_last)
    bias = torch.randn(64, device="cuda").to(dtype)
    leaves = [t.requires_grad_() for t in (x, weight, bias)]
    extension.clear_plan_cache()
    extension.set_refused_activation_for_tests(2)  # Activation::kRelu6
    try:
        call = LayerCall()
        y = tcf.conv2d_bias_act(x, weight, bias, None, 1, 1, 1, 1, "relu6", call=call)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            tcf.conv2d_bias_act(x, weight, bias, None, 1, 1, 1, 1, "relu6")
            torch.cuda.synchronize()
        # The plan without ReLU6 ran: had the op fallen back to ATen, the reason and eager's own clamp would look alike.
        forward_fallbacks = extension.plan_cache_stats()["runtime_fallbacks"]
    finally:
        extension.set_refused_activation_for_tests(-1)
        extension.clear_plan_cache()
    assert forward_fallbacks == 0, extension.plan_cache_stats()["last_runtime_fallback"]
    status = call.status
    assert status.fused, status
    assert "ReLU6 runs as a clamp after the graph" in status.reason and "test aid" in status.reason, status
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert any("clamp" in n for n in names), names
    z64 = reference_conv_bias_act(*(t.detach().double() for t in (x, weight, bias)), None, 1, 1, 1, 1, False)
    grad_y = without_ambiguous_relu6_gradient(torch.randn_like(y), z64, dtype)
    grads = torch.autograd.grad(y, leaves, grad_y)
    assert extension.plan_cache_stats()["runtime_fallbacks"] == 0, extension.plan_cache_stats()["last_runtime_fallback"]
    eager_y = reference_conv_bias_act(x, weight, bias, None, 1, 1, 1, 1, "relu6")
    eager_grads = torch.autograd.grad(eager_y, leaves, grad_y)
    leaves64 = [t.detach().double().requires_grad_() for t in leaves]
    ref_y = reference_conv_bias_act(*leaves64, None, 1, 1, 1, 1, "relu6")
    ref_grads = torch.autograd.grad(ref_y, leaves64, grad_y.double())
    assert_as_accurate_as_eager("y", y, eager_y, ref_y, dtype)
    for name, got, eager, ref in zip(["grad_x", "grad_weight", "grad_bias"], grads, eager_grads, ref_grads):
        assert_as_accurate_as_eager(name, got, eager, ref, dtype)


@gpu
@pytest.mark.parametrize("needs_grad", ["x and weight", "x", "weight"])
def test_the_conv_op_keeps_only_what_its_backward_uses(extension, needs_grad):
    """conv_bias_act keeps x for backward only where the weight needs a gradient (its gradient reads x), the weight
    only where x does, and y for the ReLU's mask; the gradients asked for are eager's."""
    torch.manual_seed(0)
    cl = torch.channels_last
    x = torch.randn(4, 16, 12, 12, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    w = torch.randn(32, 16, 3, 3, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
    b = torch.randn(32, device="cuda", dtype=torch.bfloat16)
    x.requires_grad_("x" in needs_grad.split())
    w.requires_grad_("weight" in needs_grad.split())
    kept = []

    def pack(t):
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = torch.ops.cudnn_fusion.conv_bias_act(x, w, b, None, [1, 1], [1, 1], [1, 1], [1, 1], 1, 1)
    assert any(t is y or t.data_ptr() == y.data_ptr() for t in kept)
    assert any(t is x for t in kept) == w.requires_grad
    assert any(t is w for t in kept) == x.requires_grad
    grad = torch.randn_like(y)
    leaves = [t for t in (x, w) if t.requires_grad]
    got = torch.autograd.grad(y, leaves, grad)
    eager = torch.autograd.grad(F.relu(F.conv2d(x, w, b, 1, 1)), leaves, grad)
    leaves64 = [t.detach().double().requires_grad_(t.requires_grad) for t in (x, w)]
    y64 = F.relu(F.conv2d(leaves64[0], leaves64[1], b.double(), 1, 1))
    reference = torch.autograd.grad(y64, [t for t in leaves64 if t.requires_grad], grad.double())
    for name, g, e, r in zip(needs_grad.split(" and "), got, eager, reference, strict=True):
        assert g.shape == e.shape
        assert_as_accurate_as_eager(f"gradient of {name}", g, e, r, torch.bfloat16)


def _forward_backward(layer, x, residual, grad):
    """The layer's output and every gradient, after poisoned outputs (the extension fixture)."""
    for t in (x, residual, *layer.parameters()):
        if t is not None:
            t.grad = None
    y = layer(x) if residual is None else layer(x, residual)
    y.backward(grad)
    grads = [t.grad for t in (x, residual, *layer.parameters()) if t is not None]
    return [y.detach().clone()] + [g.clone() for g in grads]


@pytest.mark.parametrize("case", ["conv bias residual relu, bf16 NHWC", "conv relu, fp32 NHWC", "conv relu, bf16 NCHW",
                                  "batchnorm relu, bf16 NHWC"])
def test_a_plan_run_directly_computes_what_the_frontends_execute_does(extension, case):
    """The plans that run without cudnn-frontend's preparation at each execute (csrc/graphs/graph_builder.h,
    RunnableGraph) write what the frontend's own execute writes, bit for bit, for every graph of a layer's forward and
    backward (a deterministic policy, so that each plan's result repeats); the conv graphs do run directly."""
    torch.manual_seed(0)
    policy = tcf.EnginePolicy(deterministic=True)
    nhwc = "NHWC" in case
    dtype = torch.bfloat16 if "bf16" in case else torch.float32  # float32: TF32 allowed, as by default
    residual = None
    if case.startswith("batchnorm"):
        layer = tcf.BatchNorm2dReLU(32)
        x = torch.randn(4, 32, 10, 10, device="cuda", dtype=dtype)
    else:
        layer = (tcf.Conv2dAddReLU if "residual" in case else tcf.Conv2dReLU)(16, 32, 3, padding=1, policy=policy)
        x = torch.randn(4, 16, 10, 10, device="cuda", dtype=dtype)
        if "residual" in case:
            residual = torch.randn(4, 32, 10, 10, device="cuda", dtype=dtype, requires_grad=True)
    layout = torch.channels_last if nhwc else torch.contiguous_format
    layer = layer.cuda().to(dtype=dtype, memory_format=layout)
    x = x.contiguous(memory_format=layout).requires_grad_()
    if residual is not None:
        residual = residual.detach().contiguous(memory_format=layout).requires_grad_()
    grad = torch.randn(4, 32, 10, 10, device="cuda", dtype=dtype).contiguous(memory_format=layout)
    frontend_state = {name: t.clone() for name, t in layer.state_dict().items()}  # BatchNorm's running statistics
    extension.set_frontend_execute_for_tests(True)
    try:
        before = extension.direct_executions_for_tests()
        through_frontend = _forward_backward(layer, x, residual, grad)
        after_frontend = {name: t.clone() for name, t in layer.state_dict().items()}
        assert extension.direct_executions_for_tests() == before, "a plan ran directly under the frontend switch"
    finally:
        extension.set_frontend_execute_for_tests(False)
    layer.load_state_dict(frontend_state)
    before = extension.direct_executions_for_tests()
    direct = _forward_backward(layer, x, residual, grad)
    ran_directly = extension.direct_executions_for_tests() - before
    assert layer.fusion_status.fused, layer.fusion_status
    for got, expected in zip(direct, through_frontend, strict=True):
        assert torch.equal(got, expected)
    for name, t in layer.state_dict().items():
        assert torch.equal(t, after_frontend[name]), name
    if not case.startswith("batchnorm"):  # NCHW: cuDNN 9.19 refuses the ReLU-backward graph (docs/fallback_rules.md)
        for graph in ["forward", "dgrad", "wgrad"]:
            info = decide.plan_in_use(layer._call.config, graph)
            assert not info["refusal"] and info["direct_execute"], (graph, info)
        assert ran_directly >= 3, ran_directly  # the three graphs did take the direct path
