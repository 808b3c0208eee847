"""What cuDNN offers for two levers of issue 15, measured in one process: the numbers behind a lever taken or left.

  depthwise-engines: one depthwise conv layer's forward, dgrad and wgrad graphs, in bfloat16 and float16. For each
      heuristics mode (A, which our graphs use; B; FALLBACK): how many plans it offers, the fastest of them and its
      relative error against float64. Then each engine named by --engines (cuDNN's Hopper depthwise engines, which
      the heuristics offer in float16 only: 57 forward, 62 dgrad, 61 wgrad) asked for by id with default knobs:
      built (its time) or cuDNN's refusal.
  conv-genstats: MobileNet v1's pointwise convs as the training Conv2dBN layer runs them (ATen's conv, then our
      BatchNorm forward op: cuDNN's nhwc_batch_norm_fwd, statistics and apply in one kernel) against cuDNN's
      conv -> genstats graph (the per-channel sum and sum of squares in the conv's epilogue) plus a copy of z (what a
      BatchNorm apply kernel at copy bandwidth would still cost), and cuDNN's conv alone beside it.

GPU times are CUDA-event medians of single calls. Needs the `cudnn` Python module of nvidia-cudnn-frontend (the
package of the headers the extension builds with).

    python benchmarks/cudnn_graph_probes.py depthwise-engines [--channels 128] [--size 56] [--stride 1]
                                            [--batch 256] [--engines 57 61 62] [--json out.json]
    python benchmarks/cudnn_graph_probes.py conv-genstats [--batch 256] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cudnn_fusion as tcf  # noqa: E402
from timing import median_ms  # noqa: E402

DTYPES = {torch.bfloat16: "BFLOAT16", torch.float16: "HALF"}
# MobileNet v1's pointwise convs at 224x224: in channels, out channels, size, how many
V1_POINTWISE = ((32, 64, 112, 1), (64, 128, 56, 1), (128, 128, 56, 1), (128, 256, 28, 1), (256, 256, 28, 1),
                (256, 512, 14, 1), (512, 512, 14, 5), (512, 1024, 7, 1), (1024, 1024, 7, 1))


def relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    return ((value.double() - reference).norm() / reference.norm()).item()


def plan_ms(graph, pack: dict, index: int, handle) -> float:
    """One plan's median; a plan slower than 2 ms is timed by one call (the fallback engines take up to 100 ms)."""
    workspace = torch.empty(max(graph.get_workspace_size_plan_at_index(index), 1), device="cuda", dtype=torch.uint8)
    run = lambda: graph.execute_plan_at_index(pack, workspace, index, handle)  # noqa: E731
    first = median_ms(run, warmup=1, repeats=1)
    return first if first > 2.0 else median_ms(run, warmup=2, repeats=15)


class DepthwiseProblem:
    """A depthwise 3x3 layer's tensors (NHWC), its float64 results, and the cuDNN graph of one direction."""

    def __init__(self, batch: int, channels: int, size: int, stride: int, dtype: torch.dtype):
        self.n, self.c, self.stride, self.dtype = batch, channels, stride, dtype
        self.out = (size + 2 - 3) // stride + 1
        g = torch.Generator("cuda").manual_seed(0)
        cl = torch.channels_last
        self.x = torch.randn(batch, channels, size, size, device="cuda", generator=g).to(dtype, memory_format=cl)
        # KRSC, as PyTorch's channels_last filter: with a KCRS filter cuDNN offers none of its fast depthwise engines
        self.w = (torch.randn(channels, 1, 3, 3, device="cuda", generator=g) / 3).to(dtype, memory_format=cl)
        self.dy = torch.randn(batch, channels, self.out, self.out, device="cuda", generator=g).to(dtype,
                                                                                                 memory_format=cl)
        xd, wd, dyd = self.x.double(), self.w.double(), self.dy.double()
        conv = dict(stride=stride, padding=1, groups=channels)
        self.reference = {"forward": F.conv2d(xd, wd, **conv),
                          "dgrad": torch.nn.grad.conv2d_input(xd.shape, wd, dyd, **conv),
                          "wgrad": torch.nn.grad.conv2d_weight(xd, wd.shape, dyd, **conv)}

    def graph(self, direction: str, handle):
        """(graph with its operation graph built, {tensor: buffer}, output buffer)."""
        import cudnn
        dt = getattr(cudnn.data_type, DTYPES[self.dtype])
        g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)

        def tensor(name: str, t: torch.Tensor):
            return g.tensor(name=name, dim=list(t.shape), stride=list(t.stride()), data_type=dt)

        conv = dict(padding=[1, 1], stride=[self.stride] * 2, dilation=[1, 1])
        if direction == "forward":
            a, b, result = tensor("X", self.x), tensor("W", self.w), torch.empty_like(self.dy)
            out, inputs = g.conv_fprop(image=a, weight=b, **conv), (self.x, self.w)
        elif direction == "dgrad":
            a, b, result = tensor("DY", self.dy), tensor("W", self.w), torch.empty_like(self.x)
            out, inputs = g.conv_dgrad(loss=a, filter=b, **conv), (self.dy, self.w)
        else:
            a, b, result = tensor("X", self.x), tensor("DY", self.dy), torch.empty_like(self.w)
            out, inputs = g.conv_wgrad(image=a, loss=b, **conv), (self.x, self.dy)
        out.set_output(True).set_data_type(dt).set_dim(list(result.shape)).set_stride(list(result.stride()))
        g.validate()
        g.build_operation_graph()
        return g, {a: inputs[0], b: inputs[1], out: result}, result


def probe_plans(problem: DepthwiseProblem, direction: str, handle, choose) -> dict:
    """Builds what `choose(graph)` asks for; returns the plan count, the fastest plan, its time and error, or why
    cuDNN refused."""
    import cudnn
    try:
        g, pack, result = problem.graph(direction, handle)
        choose(g)
        g.check_support()
        g.build_plans(cudnn.build_plan_policy.ALL)
    except Exception as error:  # cuDNN's refusal, reported as the result
        return {"refused": f"{type(error).__name__}: {str(error).strip()[:200]}"}
    best = None
    for index in range(g.get_execution_plan_count()):
        try:
            ms = plan_ms(g, pack, index, handle)
        except Exception:  # a plan that does not run counts as not offered
            continue
        if best is None or ms < best[1]:
            result.fill_(float("nan"))
            g.execute_plan_at_index(pack, torch.empty(max(g.get_workspace_size_plan_at_index(index), 1),
                                                      device="cuda", dtype=torch.uint8), index, handle)
            best = (g.get_plan_name_at_index(index), ms, relative_error(result, problem.reference[direction]))
    row = {"plans": g.get_execution_plan_count()}
    if best is not None:
        row.update(fastest=best[0], ms=best[1], relative_error=best[2])
    return row


def depthwise_engines(args) -> dict:
    import cudnn
    handle = cudnn.create_handle()
    rows = []
    for dtype in DTYPES:
        problem = DepthwiseProblem(args.batch, args.channels, args.size, args.stride, dtype)
        for direction in ("forward", "dgrad", "wgrad"):
            for mode in ("A", "B", "FALLBACK"):
                row = probe_plans(problem, direction, handle,
                                  lambda g, m=mode: g.create_execution_plans([getattr(cudnn.heur_mode, m)]))
                rows.append({"dtype": str(dtype).split(".")[1], "direction": direction, "asked": f"mode {mode}",
                             **row})
            for engine in args.engines:
                row = probe_plans(problem, direction, handle, lambda g, e=engine: g.create_execution_plan(e, {}))
                rows.append({"dtype": str(dtype).split(".")[1], "direction": direction, "asked": f"engine {engine}",
                             **row})
        del problem
        torch.cuda.empty_cache()
    print(f"depthwise 3x3/{args.stride}, {args.channels} channels at {args.size}x{args.size}, batch {args.batch}, "
          "NHWC; the fastest plan each way of asking offers (ms, relative error against float64)")
    print(f"{'dtype':9s} {'direction':9s} {'asked':14s} {'plans':>5s} {'fastest':34s} {'ms':>8s} {'rel err':>8s}")
    for r in rows:
        if "refused" in r:
            status = re.search(r"CUDNN_STATUS_\w+", r["refused"])
            print(f"{r['dtype']:9s} {r['direction']:9s} {r['asked']:14s}   refused: "
                  f"{status.group(0) if status else r['refused'][:90]}")
        elif "ms" in r:
            print(f"{r['dtype']:9s} {r['direction']:9s} {r['asked']:14s} {r['plans']:5d} {r['fastest'][:34]:34s} "
                  f"{r['ms']:8.3f} {r['relative_error']:8.1e}")
        else:
            print(f"{r['dtype']:9s} {r['direction']:9s} {r['asked']:14s} {r['plans']:5d} (none ran)")
    return {"layer": vars(args), "rows": rows}


def conv_genstats(args) -> dict:
    import cudnn
    handle = cudnn.create_handle()
    dt = cudnn.data_type.BFLOAT16
    rows = []
    print(f"MobileNet v1's pointwise convs, batch {args.batch}, bfloat16, NHWC, ms per call (x how many in the model)")
    print(f"{'layer':18s} {'ATen conv':>9s} {'+ our BN fwd':>12s} {'= now':>7s} | {'cuDNN conv':>10s} "
          f"{'conv+genstats':>13s} {'+ copy z':>8s} {'= with stats':>12s}  genstats error (sum, sum of squares)")
    for cin, cout, size, count in V1_POINTWISE:
        g0 = torch.Generator("cuda").manual_seed(cin + cout)
        cl = torch.channels_last
        x = torch.randn(args.batch, cin, size, size, device="cuda", generator=g0).to(torch.bfloat16, memory_format=cl)
        w = (torch.randn(cout, cin, 1, 1, device="cuda", generator=g0) / cin ** 0.5).to(torch.bfloat16,
                                                                                          memory_format=cl)
        scale, shift = torch.rand(cout, device="cuda") + 0.5, torch.randn(cout, device="cuda")
        mean, var = torch.zeros(cout, device="cuda"), torch.ones(cout, device="cuda")
        z = F.conv2d(x, w)
        row = {"layer": f"{cin}->{cout}@{size}", "count": count,
               "aten_conv": median_ms(lambda: F.conv2d(x, w)),
               "bn_forward": median_ms(lambda: torch.ops.cudnn_fusion.batch_norm_act(
                   z, scale, shift, mean, var, None, 0.1, 1e-5, 1, 0)),
               "copy_z": median_ms(lambda: z.clone(memory_format=cl))}
        for stats in (False, True):
            g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=handle)
            X = g.tensor(name="X", dim=list(x.shape), stride=list(x.stride()), data_type=dt)
            W = g.tensor(name="W", dim=list(w.shape), stride=list(w.stride()), data_type=dt)
            Z = g.conv_fprop(image=X, weight=W, padding=[0, 0], stride=[1, 1], dilation=[1, 1])
            z_out = torch.empty_like(z)
            Z.set_output(True).set_data_type(dt).set_dim(list(z.shape)).set_stride(list(z.stride()))
            pack = {X: x, W: w, Z: z_out}
            if stats:
                sums = torch.empty(2, cout, device="cuda")
                for tensor, buffer in zip(g.genstats(input=Z), sums, strict=True):
                    tensor.set_output(True).set_data_type(cudnn.data_type.FLOAT).set_dim([1, cout, 1, 1])
                    tensor.set_stride([cout, 1, cout, cout])
                    pack[tensor] = buffer
            key = "conv_genstats" if stats else "cudnn_conv"
            try:
                g.validate()
                g.build_operation_graph()
                g.create_execution_plans([cudnn.heur_mode.A])
                g.check_support()
                g.build_plans(cudnn.build_plan_policy.ALL)
            except Exception as error:  # cuDNN's refusal, reported as the result
                row[key] = None
                row[key + "_refused"] = f"{type(error).__name__}: {str(error).strip()[:200]}"
                continue
            timed = [(plan_ms(g, pack, i, handle), i) for i in range(g.get_execution_plan_count())]
            ms, index = min(timed)
            row[key], row[key + "_plan"] = ms, g.get_plan_name_at_index(index)
            if stats:
                sums.fill_(float("nan"))
                g.execute_plan_at_index(pack, torch.empty(max(g.get_workspace_size_plan_at_index(index), 1),
                                                          device="cuda", dtype=torch.uint8), index, handle)
                zd = z.double()
                row["genstats_error"] = (relative_error(sums[0], zd.sum((0, 2, 3))),
                                         relative_error(sums[1], zd.square().sum((0, 2, 3))))
        rows.append(row)
        with_stats = (row["conv_genstats"] or float("nan")) + row["copy_z"]
        errors = ", ".join(f"{e:.1e}" for e in row.get("genstats_error", ()))
        print(f"{row['layer'] + f' x{count}':18s} {row['aten_conv']:9.3f} {row['bn_forward']:12.3f} "
              f"{row['aten_conv'] + row['bn_forward']:7.3f} | {row['cudnn_conv'] or float('nan'):10.3f} "
              f"{row['conv_genstats'] or float('nan'):13.3f} {row['copy_z']:8.3f} {with_stats:12.3f}  {errors} "
              f"{row.get('conv_genstats_plan', row.get('conv_genstats_refused', ''))[:40]}")
    total = {k: sum(r["count"] * (r[k] or float("nan")) for r in rows)
             for k in ("aten_conv", "bn_forward", "cudnn_conv", "conv_genstats", "copy_z")}
    print(f"\nall pointwise layers (x count): now {total['aten_conv'] + total['bn_forward']:.3f} ms (conv "
          f"{total['aten_conv']:.3f} + BN forward {total['bn_forward']:.3f}); with the statistics in cuDNN's epilogue "
          f"{total['conv_genstats'] + total['copy_z']:.3f} ms (conv + genstats {total['conv_genstats']:.3f} + a copy "
          f"of z {total['copy_z']:.3f}); cuDNN's conv alone {total['cudnn_conv']:.3f}")
    return {"batch": args.batch, "rows": rows, "total": total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("probe", choices=("depthwise-engines", "conv-genstats"))
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--channels", type=int, default=128, help="depthwise-engines: the layer's channels")
    p.add_argument("--size", type=int, default=56, help="depthwise-engines: the input's height and width")
    p.add_argument("--stride", type=int, default=1, choices=(1, 2), help="depthwise-engines: the layer's stride")
    p.add_argument("--engines", type=int, nargs="*", default=[57, 61, 62],
                   help="depthwise-engines: engine ids to ask for with default knobs")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if not tcf.is_available():
        raise SystemExit(f"needs a GPU and the extension: {tcf.unavailable_reason()}")
    import cudnn
    torch.backends.cudnn.benchmark = True
    header = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version(), "cudnn_frontend": cudnn.__version__}
    print(", ".join(f"{k} {v}" for k, v in header.items()))
    result = (depthwise_engines if args.probe == "depthwise-engines" else conv_genstats)(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**header, "probe": args.probe, **result}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
