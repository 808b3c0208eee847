"""Training and inference time of the model zoo, eager against fused (tcf.fuse), one model at a time: the issue's
"no model slower than eager", checked on the models users bring rather than on the three the profiles follow.

Each model is built with random weights and 1000 classes, channels_last, on the GPU; its fused copy shares its
Parameters and buffers. A training step is SGD with momentum under autocast (bf16 by default); inference is one
batch under no_grad. cudnn.benchmark is on for both variants. Eager and fused are timed in turn (one sample of each
per round, interleaved_samples_ms), each sample `--calls` steps back to back (the host runs ahead, as in a training
loop); the table gives the medians and fused's ratio to eager. "convs fused" counts the model's Conv2d layers whose
fused module ran fused in the last training step, of all its Conv2d layers (a squeeze-and-excitation block's two
convs count when the block ran as its op, whose GEMMs are ATen's). The default models are the GPU zoo
tests' families (tests/zoo.py: FAMILIES). A model takes minutes, most of it before the timing (building the
fused plans, cudnn.benchmark's searches; "seconds" in its row): on an H100 the first six families took 80 s a model
on average and the next three 200 s (2026-11-27). Pass --models in parts to fit a device call. The JSON keeps every
sample ("train_samples", "inference_samples"). A process's host speed moves both variants' steps (27n: eager's own
step by up to 31 % between processes), so --processes N times each model in N fresh processes, one after another,
and prints every process's ratio and their median (its JSON is written after each process, so a run stopped by a
time limit keeps the processes that finished). --gpu-time also replays each variant's step from a CUDA graph
(timing.graph_replay_ms, after all the sampled timings): the kernels' time with no host cost, which tells a fused step
the host holds back from one whose GPU work is slower than eager's. The model list comes from tests/zoo.py, which
imports pytest.

    python benchmarks/zoo_speed.py [--models torchvision:resnet18,timm:efficientnet_b0] [--batch 128]
                                   [--dtype bfloat16|float16] [--repeats 10] [--calls 3] [--json out.json]
                                   [--processes 4] [--gpu-time]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
import torch_cudnn_fusion as tcf  # noqa: E402
from timing import graph_replay_ms, interleaved_samples_ms  # noqa: E402
from zoo import FAMILIES, INPUT_SIZE, outputs  # noqa: E402


def build(model_id: str) -> torch.nn.Module:
    library, name = model_id.split(":")
    if library == "torchvision":
        import torchvision

        return torchvision.models.get_model(name)
    import timm

    return timm.create_model(name)


def train_step(model, x, target, dtype):
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype):
            loss = F.cross_entropy(outputs(model(x))[0], target)  # googlenet and inception: the logits first
        loss.backward()
        opt.step()

    return step


def inference(model, x, dtype):
    def run():
        with torch.no_grad(), torch.autocast("cuda", dtype):
            model(x)

    return run


def convs_fused(fused, report) -> tuple[int, int]:
    """(Conv2d layers whose fused module ran fused in its last call, Conv2d layers in the model)."""
    _, total, _ = report.conv_coverage()
    ran = sum(row.convs for row in report.replaced if fused.get_submodule(row.path).fusion_status.fused)
    return ran, total


def measure(model_id: str, args) -> dict:
    """One model's row: per mode, each variant's median ms a step (or its error), and the coverage."""
    row = {"model": model_id}
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    try:
        model = build(model_id).cuda().to(memory_format=torch.channels_last)
        size = max(INPUT_SIZE.get(model_id.split(":")[1], 0), args.size)  # inception_v3 needs 299
        x = torch.randn(args.batch, 3, size, size, device="cuda").to(memory_format=torch.channels_last)
        target = torch.randint(0, 1000, (args.batch,), device="cuda")
        fused, report = tcf.fuse(model)
    except Exception as error:  # noqa: BLE001 — a model that fails is reported, not fatal
        row["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        return row
    variants = {"eager": model, "fused": fused}

    def steps(mode: str) -> dict:
        for variant in variants.values():
            variant.train(mode == "train")
        make = train_step if mode == "train" else inference
        return {name: make(variant, x, target, dtype) if mode == "train" else make(variant, x, dtype)
                for name, variant in variants.items()}

    for mode in ("train", "inference"):
        fns = steps(mode)
        try:
            samples = interleaved_samples_ms(fns, warmup=args.warmup, repeats=args.repeats, calls=args.calls)
            row[mode] = {name: statistics.median(values) for name, values in samples.items()}
            row[f"{mode}_samples"] = samples  # ms a step, per sample, in the order they were taken
        except Exception as error:  # noqa: BLE001
            row[mode] = {"error": f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"}
        if mode == "train":
            row["convs_fused"], row["convs"] = convs_fused(fused, report)
    # after every sampled timing, so that a capture that fails cannot leave them a stream in a bad state
    for mode in ("train", "inference") if args.gpu_time else ():
        row[f"{mode}_gpu"] = {}
        for name, fn in steps(mode).items():
            try:
                row[f"{mode}_gpu"][name] = graph_replay_ms(fn, calls=args.calls, replays=args.repeats)
            except Exception as error:  # noqa: BLE001 — a step that cannot be captured is reported
                row[f"{mode}_gpu"][name] = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    row["runtime_fallbacks"] = tcf.plan_cache_stats()["runtime_fallbacks"]
    tcf.clear_plan_cache()  # each model builds its own plans: the cache holds none of another's
    return row


def ratio(row: dict, mode: str) -> float:
    """fused ÷ eager for `mode` ("train", "inference", or "train_gpu" / "inference_gpu"), nan where either is
    missing or failed."""
    times = row.get(mode, {})
    fused, eager = times.get("fused"), times.get("eager")
    timed = isinstance(fused, (int, float)) and isinstance(eager, (int, float))
    return fused / eager if timed else float("nan")


def _mode_cells(row: dict, mode: str, names: list, missing: str, ratio_width: int) -> list:
    """A mode's cells in a table row: each variant's ms (`missing` where it failed or is absent), then the ratio."""
    times = row[mode]
    cells = [f"{times[n]:>20.2f}" if isinstance(times.get(n), (int, float)) else f"{missing:>20}" for n in names]
    return cells + [f"{ratio(row, mode):>{ratio_width}.3f}x"]


def _slower(rows: list, modes: dict) -> str:
    """The models and modes (`modes`: key in the row -> the name printed) where fused's ratio is above 1, or none."""
    slower = [f"{row['model']} {label} {ratio(row, mode):.3f}x" for row in rows for mode, label in modes.items()
              if ratio(row, mode) > 1.0]
    return ", ".join(slower) if slower else "none"


def print_table(rows: list) -> None:
    """The rows as a table, then the models and modes where fused was slower than eager; with --gpu-time's rows, a
    second table of the CUDA-graph replays, the captures that failed and where fused's GPU time was above eager's."""
    names = ["eager", "fused"]
    print(f"\n{'model':<34}{'convs fused':>12}" + "".join(f"{'train ' + n:>20}" for n in names) + f"{'ratio':>8}"
          + "".join(f"{'infer ' + n:>20}" for n in names) + f"{'ratio':>8}")
    for row in rows:
        if "error" in row:
            print(f"{row['model']:<34}  {row['error']}")
            continue
        cells = [f"{row['convs_fused']:>5} / {row['convs']:<4}"]
        for mode in ("train", "inference"):
            cells += _mode_cells(row, mode, names, "-", 7)
        print(f"{row['model']:<34}" + "".join(cells))
    print("fused slower than eager: " + _slower(rows, {"train": "train", "inference": "inference"}))
    graphed = [row for row in rows if "train_gpu" in row]
    if not graphed:
        return
    gpu_modes = {"train_gpu": "train", "inference_gpu": "inference"}
    print(f"\nGPU time a step, CUDA-graph replay (no host cost)\n{'model':<34}" + "".join(
        f"{mode + ' ' + n:>20}" for mode in ("train", "infer") for n in (*names, "ratio")))
    for row in graphed:
        print(f"{row['model']:<34}" + "".join(cell for mode in gpu_modes for cell in
                                              _mode_cells(row, mode, names, "failed", 19)))
    for row in graphed:
        for mode, label in gpu_modes.items():
            for n in names:
                if isinstance(row[mode].get(n), str):
                    print(f"not captured: {row['model']} {label} {n}: {row[mode][n]}")
    print("fused's GPU time above eager's: " + _slower(graphed, gpu_modes))


def run_in_processes(model_ids: list, args, json_path: Optional[str] = None) -> list:
    """Each model timed in `args.processes` fresh processes, one after another (this script with --processes 1): a
    process's host speed moves both variants' steps, so a ratio from one process says little on its own. The rows
    carry "process" (0, 1, ...); a process that fails leaves a row with its error. With `json_path`, the file is
    written before the first process and after each one with the rows so far, so that a run cut short (a time limit)
    keeps what it measured."""
    rows = []
    if json_path:
        write_process_rows(json_path, rows, args.processes)
    passed = ["--batch", str(args.batch), "--size", str(args.size), "--dtype", args.dtype, "--warmup",
              str(args.warmup), "--repeats", str(args.repeats), "--calls", str(args.calls),
              *(["--gpu-time"] if args.gpu_time else [])]
    with tempfile.TemporaryDirectory() as folder:
        for model_id in model_ids:
            for process in range(args.processes):
                path = os.path.join(folder, "row.json")
                done = subprocess.run([sys.executable, os.path.abspath(__file__), "--models", model_id, "--json", path,
                                       *passed], capture_output=True, text=True)
                try:
                    with open(path) as f:
                        child = json.load(f)
                    os.remove(path)
                    row = child["rows"][0]
                    row["header"] = {k: v for k, v in child.items() if k != "rows"}  # GPU, versions, settings
                except (OSError, ValueError, IndexError, KeyError):
                    last = (done.stderr or done.stdout).strip().splitlines()
                    row = {"model": model_id, "error": f"process exited {done.returncode}: "
                                                       f"{last[-1][:200] if last else 'no output'}"}
                row["process"] = process
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if not k.endswith("_samples") and k != "header"}),
                      flush=True)
                if json_path:
                    write_process_rows(json_path, rows, args.processes)
    return rows


def write_process_rows(path: str, rows: list, processes: int) -> None:
    """--processes' JSON: the first header a child gave (GPU, versions, settings), the process count, every row."""
    head = next((row["header"] for row in rows if "header" in row), {})
    with open(path, "w") as f:
        json.dump({**head, "processes": processes, "rows": rows}, f, indent=1)


def print_processes(rows: list) -> None:
    """Per model: fused's training and inference ratio to eager in each process, and their medians (with --gpu-time,
    also the ratios of their CUDA-graph replays)."""
    modes = ("train", "inference", "train_gpu", "inference_gpu") if any("train_gpu" in r for r in rows) else (
        "train", "inference")
    print(f"\n{'model':<34}{'processes':>10}  train ratio per process (median)  |  inference"
          + ("  |  train, GPU time  |  inference, GPU time" if len(modes) > 2 else ""))
    for model_id in dict.fromkeys(row["model"] for row in rows):
        mine = [row for row in rows if row["model"] == model_id and "error" not in row]
        cells = []
        for mode in modes:
            ratios = [ratio(row, mode) for row in mine]
            ratios = [r for r in ratios if r == r]  # a mode that failed gives nan
            text = ", ".join(f"{r:.3f}" for r in ratios)
            cells.append(f"{text} ({statistics.median(ratios):.3f})" if ratios else "-")
        print(f"{model_id:<34}{len(mine):>10}  " + "  |  ".join(cells))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--models", default=",".join(FAMILIES), help="comma-separated library:name")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10, help="samples per variant and mode")
    p.add_argument("--calls", type=int, default=3, help="back-to-back steps a sample")
    p.add_argument("--json", default=None)
    p.add_argument("--processes", type=int, default=1,
                   help="time each model in this many fresh processes, one after another, and give every process's "
                        "ratio and their median")
    p.add_argument("--gpu-time", action="store_true",
                   help="also each variant's step replayed from a CUDA graph: its GPU time without the host's")
    args = p.parse_args()
    if args.processes < 1:
        p.error(f"--processes must be at least 1, got {args.processes}")
    model_ids = [m for m in args.models.split(",") if m]
    if args.processes > 1:  # this process only starts the others: it touches no GPU
        rows = run_in_processes(model_ids, args, args.json)
        print_processes(rows)
        return
    torch.backends.cudnn.benchmark = True
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(),
           "batch": args.batch, "size": args.size, "dtype": args.dtype, "repeats": args.repeats, "calls": args.calls,
           "gpu_time": args.gpu_time, "rows": []}
    print(f"{out['gpu']}, torch {out['torch']}, cuDNN {out['cudnn']}; batch {args.batch}, {args.size}x{args.size}, "
          f"{args.dtype} autocast, channels_last, cudnn.benchmark; ms a step, median of {args.repeats} samples of "
          f"{args.calls} back-to-back steps, eager and fused interleaved", flush=True)
    for model_id in model_ids:
        start = time.perf_counter()
        row = measure(model_id, args)
        row["seconds"] = round(time.perf_counter() - start, 1)  # building, plans, cudnn.benchmark's search, timing
        out["rows"].append(row)
        print(json.dumps({k: v for k, v in row.items() if not k.endswith("_samples")}), flush=True)
        gc.collect()
        torch.cuda.empty_cache()
        if args.json:  # after each model, so that a run cut short keeps the rows it measured
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
    print_table(out["rows"])

if __name__ == "__main__":
    main()
