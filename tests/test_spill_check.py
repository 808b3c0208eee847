""".ci/spill_check.py, which holds our CUDA kernels' register spills to .ci/spills.txt in CI: what it reads from ptxas's
report, and what fails it."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / ".ci" / "spill_check.py"
_spec = importlib.util.spec_from_file_location("spill_check", SCRIPT)
spill_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(spill_check)


def _log(entries, path_hash="2191de59"):
    """A ptxas -v report of the kernels (name, stores, loads), compiled from a file whose path hashes to path_hash."""
    lines = []
    for name, stores, loads in entries:
        mangled = f"_ZN3tcf56_GLOBAL__N__{path_hash}_23_running_stats_kernel_cu_eab4924320{name}EPfl"
        lines += [f"ptxas info    : Compiling entry function '{mangled}' for 'sm_90'",
                  f"ptxas info    : Function properties for {mangled}",
                  f"    0 bytes stack frame, {stores} bytes spill stores, {loads} bytes spill loads",
                  "ptxas info    : Used 40 registers, used 0 barriers"]
    return "\n".join(lines) + "\n"


def _run(tmp_path, log_text, allowance_text, release="13.0"):
    log = tmp_path / "k.log"
    log.write_text(log_text)
    allowance = tmp_path / "spills.txt"
    allowance.write_text(allowance_text)
    return subprocess.run([sys.executable, str(SCRIPT), "--allowance", str(allowance), "--release", release,
                           str(log)], capture_output=True, text=True)


def test_a_kernel_compiled_from_another_path_has_the_same_name():
    """The anonymous namespace's hash of the compiled file's path is kept out: CI's clone and a developer's checkout
    name a kernel alike."""
    here = spill_check.parse_log(_log([("commit_running_stats", 4, 8)], path_hash="2191de59"))
    there = spill_check.parse_log(_log([("commit_running_stats", 4, 8)], path_hash="6bfcb99c"))
    assert here == there == {"_ZN3tcf12_GLOBAL__N_120commit_running_statsEPfl@sm_90": (4, 8)}


def test_a_new_spill_or_a_larger_one_fails_and_one_within_its_allowance_passes(tmp_path):
    allowance = spill_check.write_allowance(spill_check.parse_log(_log([("spilling", 16, 40), ("clean", 0, 0)])),
                                            "13.0")
    within = _run(tmp_path, _log([("spilling", 12, 40), ("clean", 0, 0)]), allowance)
    assert within.returncode == 0, within.stderr
    assert "below its allowance" in within.stdout
    larger = _run(tmp_path, _log([("spilling", 16, 48), ("clean", 0, 0)]), allowance)
    assert larger.returncode == 1 and "FAILED" in larger.stderr and "spilling" in larger.stderr
    new = _run(tmp_path, _log([("spilling", 16, 40), ("clean", 4, 4)]), allowance)
    assert new.returncode == 1 and "clean" in new.stderr and "allowed 0 and 0" in new.stderr


def test_another_nvcc_release_reports_and_passes(tmp_path):
    allowance = spill_check.write_allowance({}, "13.0")
    other = _run(tmp_path, _log([("spilling", 16, 40)]), allowance, release="13.2")
    assert other.returncode == 0 and "reported, not checked" in other.stdout and "spilling" in other.stdout


def test_the_committed_allowance_names_kernels_of_our_sources():
    """Every kernel .ci/spills.txt allows to spill is a __global__ function of csrc's, named whole (the mangled name's
    length prefix gives the identifier: depthwise_conv_forward_walk, not any name it begins with), taken with one nvcc
    release."""
    release, allowed = spill_check.read_allowance((ROOT / ".ci" / "spills.txt").read_text())
    assert release is not None and allowed
    sources = "".join(path.read_text() for path in (ROOT / "csrc").rglob("*.cu"))
    kernels = set(re.findall(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s+)?(\w+)\s*\(", sources))
    assert "depthwise_conv_forward_walk" in kernels and "depthwise_conv_forward" in kernels, kernels
    for kernel in allowed:
        length, rest = re.match(r"(\d+)(\w+)", kernel.split("12_GLOBAL__N_1")[1]).groups()
        assert rest[:int(length)] in kernels, kernel
