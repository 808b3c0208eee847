"""Register spills of our CUDA kernels against the allowance in .ci/spills.txt, from nvcc's `-Xptxas -v` logs.

A kernel that spills where the allowance lists none, or more bytes than it lists, fails the check: a spill in a hot
kernel can cost more than any change beside it saves, and no GPU runs in CI. (09e4f51 put SiLU's derivative into
every instantiation of the BatchNorm backward kernel; its ReLU bfloat16 instantiation went from no spill to 156 bytes
and from 3.50 to 6.10 ms of MobileNet v1's training step on an H200, unseen for a day.)

    python .ci/spill_check.py [--allowance .ci/spills.txt] [--write] LOG...

--write rewrites the allowance from the logs (after a change whose spills were measured and accepted). The allowance
was taken with one nvcc release; another release allocates registers differently, so under another one the check
reports and passes.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+)'")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
# An anonymous namespace's mangled name carries a hash of the source file's compilation: written as the plain one
ANONYMOUS = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}")


def parse_log(text: str) -> dict[str, tuple[int, int]]:
    """Kernel (mangled name @ architecture) -> (spill store bytes, spill load bytes), from one ptxas -v log."""
    spills: dict[str, tuple[int, int]] = {}
    entry = None
    for line in text.splitlines():
        found = ENTRY.search(line)
        if found:
            entry = f"{ANONYMOUS.sub('12_GLOBAL__N_1', found.group(1))}@{found.group(2)}"
            continue
        found = SPILLS.search(line)
        if found and entry is not None:
            spills[entry] = (int(found.group(1)), int(found.group(2)))
            entry = None
    return spills


def read_allowance(text: str) -> tuple[str | None, dict[str, tuple[int, int]]]:
    """The nvcc release the allowance was taken with, and kernel -> (store bytes, load bytes) allowed."""
    release = None
    allowed: dict[str, tuple[int, int]] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("# nvcc release "):
            release = line.split()[-1]
        if not line or line.startswith("#"):
            continue
        stores, loads, kernel = line.split(maxsplit=2)
        allowed[kernel] = (int(stores), int(loads))
    return release, allowed


def compare(spills: dict[str, tuple[int, int]], allowed: dict[str, tuple[int, int]]) -> tuple[list[str], list[str]]:
    """(failures, notes): a kernel spilling more than allowed (none where unlisted) fails; one spilling less than
    allowed, or listed and not compiled, is noted."""
    failures, notes = [], []
    for kernel, (stores, loads) in sorted(spills.items()):
        most = allowed.get(kernel, (0, 0))
        if stores > most[0] or loads > most[1]:
            failures.append(f"{kernel}: spills {stores} bytes of stores and {loads} of loads, allowed {most[0]} and "
                            f"{most[1]}")
        elif (stores, loads) != most:
            notes.append(f"{kernel}: spills {stores} and {loads} bytes, below its allowance {most[0]} and {most[1]}")
    for kernel in sorted(set(allowed) - set(spills)):
        notes.append(f"{kernel}: in the allowance, not in the logs")
    return failures, notes


def write_allowance(spills: dict[str, tuple[int, int]], release: str) -> str:
    lines = [
        "# Register spills our CUDA kernels are allowed (.ci/spill_check.py): spill store bytes, spill load bytes,",
        "# kernel (mangled name @ architecture). Every kernel not listed must not spill. Taken with:",
        f"# nvcc release {release}",
    ]
    demangler = shutil.which("c++filt")
    for kernel, (stores, loads) in sorted(spills.items()):
        if stores or loads:
            if demangler:
                name = subprocess.run([demangler], input=kernel.split("@")[0], capture_output=True, text=True).stdout
                name = name.strip().replace("tcf::(anonymous namespace)::", "").removeprefix("void ")
                lines.append(f"# {name.split('>(')[0]}>")
            lines.append(f"{stores} {loads} {kernel}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--allowance", type=Path, default=Path(__file__).with_name("spills.txt"))
    parser.add_argument("--release", default=None, help="the nvcc release the logs come from (nvcc --version)")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    spills: dict[str, tuple[int, int]] = {}
    for log in args.logs:
        spills.update(parse_log(log.read_text()))
    if not spills:
        print("spill_check: no ptxas -v output in the logs (nvcc -Xptxas -v)", file=sys.stderr)
        return 1
    if args.write:
        args.allowance.write_text(write_allowance(spills, args.release or "unknown"))
        print(f"spill_check: wrote {args.allowance} from {len(spills)} kernels")
        return 0
    release, allowed = read_allowance(args.allowance.read_text())
    failures, notes = compare(spills, allowed)
    if args.release is not None and release is not None and args.release != release:
        print(f"spill_check: nvcc {args.release} here, the allowance is from nvcc {release}: reported, not checked")
        for line in failures + notes:
            print(f"spill_check:   {line}")
        return 0
    for line in notes:
        print(f"spill_check: note: {line}")
    for line in failures:
        print(f"spill_check: FAILED {line}", file=sys.stderr)
    print(f"spill_check: {len(spills)} kernels, {sum(1 for s in spills.values() if any(s))} spill, "
          f"{len(failures)} beyond their allowance")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
