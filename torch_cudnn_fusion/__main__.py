"""python -m torch_cudnn_fusion info | engines ...

info: torch, CUDA, cuDNN, cudnn-frontend, GPU and build details.
engines: the candidate plans for one fused conv layer's graph (see torch_cudnn_fusion.engines).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

import torch


def _ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _padding(text: str):
    return text if text in ("same", "valid") else _ints(text)


def _version(distribution: str) -> str:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def info() -> int:
    import torch_cudnn_fusion as tcf
    from torch_cudnn_fusion import _extension

    rows = [
        ("torch_cudnn_fusion", tcf.__version__),
        ("torch", torch.__version__),
        ("CUDA (torch built with)", torch.version.cuda or "none (CPU build)"),
        ("cuDNN (torch reports)", str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "none"),
        ("nvidia-cudnn-frontend (installed)", _version("nvidia-cudnn-frontend")),
    ]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(index)
            rows.append((f"GPU {index}", f"{p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
                                         f"{p.total_memory / 2**30:.0f} GiB"))
    else:
        rows.append(("GPU", "none visible to torch"))
    note = Path(_extension.__file__).with_name("_build_note.txt")
    if note.is_file() and note.read_text().strip():
        rows += [("install note", line) for line in note.read_text().strip().splitlines()]
    module = _extension.load()
    if module is None:
        rows.append(("extension", f"unavailable: {_extension.load_error()}"))
    else:
        rows += [
            ("extension", module.__file__),
            ("cuDNN (extension runs with)", str(module.cudnn_version())),
            ("cudnn-frontend (extension built with)", module.frontend_version()),
            ("plan cache", ", ".join(f"{k}={v}" for k, v in module.plan_cache_stats().items() if k != "last_runtime_fallback")),
        ]
    rows += [
        ("strict mode", str(tcf.is_strict())),
        ("torch.backends.cudnn.allow_tf32", str(torch.backends.cudnn.allow_tf32)),
        ("torch.backends.cudnn.benchmark (autotune plans)", str(torch.backends.cudnn.benchmark)),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def engines(args: argparse.Namespace) -> int:
    import torch_cudnn_fusion as tcf

    if not tcf.is_available():
        print(f"engines needs a CUDA GPU and the cuDNN extension: {tcf.unavailable_reason()}", file=sys.stderr)
        return 2
    dtype = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    table = tcf.engines(args.input, args.weight, stride=args.stride, padding=args.padding, dilation=args.dilation,
                        groups=args.groups, dtype=dtype, channels_last=not args.nchw, bias=not args.no_bias,
                        residual=args.residual, activation=args.activation, graph=args.graph, time=args.time,
                        repeats=args.repeats,
                        policy=tcf.EnginePolicy(deterministic=args.deterministic,
                                                workspace_limit=args.workspace_limit))
    print(table)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_cudnn_fusion", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="torch, CUDA, cuDNN, cudnn-frontend, GPU and build details")
    e = commands.add_parser("engines", help="candidate plans for one fused conv layer's graph")
    e.add_argument("--input", type=_ints, required=True, help="x shape N,C,H,W")
    e.add_argument("--weight", type=_ints, required=True, help="weight shape K,C/groups,kH,kW")
    e.add_argument("--stride", type=_ints, default=[1])
    e.add_argument("--padding", type=_padding, default=[0], help="int, pair, 'same' or 'valid'")
    e.add_argument("--dilation", type=_ints, default=[1])
    e.add_argument("--groups", type=int, default=1)
    e.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="bfloat16")
    e.add_argument("--nchw", action="store_true", help="NCHW tensors (default: channels_last)")
    e.add_argument("--no-bias", action="store_true")
    e.add_argument("--residual", action="store_true")
    e.add_argument("--activation", choices=["relu", "relu6", "identity"], default="relu")
    e.add_argument("--graph", choices=["forward", "relu_bias_backward", "dgrad", "wgrad"], default="forward")
    e.add_argument("--time", action="store_true", help="time each candidate (median of --repeats runs)")
    e.add_argument("--repeats", type=int, default=10)
    e.add_argument("--deterministic", action="store_true", help="exclude engines with the NONDETERMINISTIC note")
    e.add_argument("--workspace-limit", type=int, default=None, help="exclude engines needing more bytes")
    args = parser.parse_args(argv)
    return info() if args.command == "info" else engines(args)


if __name__ == "__main__":
    sys.exit(main())
