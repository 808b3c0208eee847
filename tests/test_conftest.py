"""The suite's own fixtures, run as pytest runs them: two tests in one process, in order, in a copy of tests/."""
import pathlib
import re
import subprocess
import sys

import pytest

CONFTEST = pathlib.Path(__file__).with_name("conftest.py")

FLAG_TESTS = """
import torch

BEFORE = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic


def test_a_benchmark_main_sets_the_flags():
    torch.backends.cudnn.benchmark = not BEFORE[0]
    torch.backends.cudnn.deterministic = not BEFORE[1]


def test_the_next_test_finds_them_as_they_were():
    assert (torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) == BEFORE
"""


def run_in_copy(tmp_path: pathlib.Path, conftest: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_flags.py").write_text(FLAG_TESTS)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-p", "no:randomly", "test_flags.py"], cwd=tmp_path, capture_output=True, text=True)


@pytest.mark.parametrize("fixture", ["kept", "removed"])
def test_cudnn_flags_set_by_one_test_do_not_reach_the_next(tmp_path, fixture):
    """A test that sets cudnn.benchmark and deterministic (as a benchmark's main() does) leaves them to the next test
    of its worker unless conftest's autouse _cudnn_flags_restored puts them back: with it the second test passes;
    with it removed from the copy, the second test fails (so the check can fail)."""
    conftest = CONFTEST.read_text()
    if fixture == "removed":
        conftest, count = re.subn(r"@pytest\.fixture\(autouse=True\)\ndef _cudnn_flags_restored", "def _unused",
                                  conftest)
        assert count == 1, "conftest's _cudnn_flags_restored was not found"
    result = run_in_copy(tmp_path, conftest)
    summary = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else result.stderr[-500:]
    if fixture == "kept":
        assert result.returncode == 0 and "2 passed" in summary, result.stdout[-2000:] + result.stderr[-2000:]
    else:
        assert result.returncode == 1 and "1 failed, 1 passed" in summary, result.stdout[-2000:] + result.stderr[-2000:]
