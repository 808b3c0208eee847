"""The README's Python blocks run as pasted (on the GPU where there is one, else on the CPU)."""

import os
import re
import subprocess
import sys

import pytest

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
BLOCKS = re.findall(r"```python\n(.*?)```", open(README).read(), flags=re.S)


def test_the_readme_has_python_blocks():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs_as_pasted(tmp_path, index):
    code = BLOCKS[index]
    if "torchvision" in code:
        pytest.importorskip("torchvision")
    import torch_cudnn_fusion  # the one under test, installed or from the checkout

    root = os.path.dirname(os.path.dirname(os.path.abspath(torch_cudnn_fusion.__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=tmp_path,
                         env=env)
    assert run.returncode == 0, f"README block {index}:\n{code}\n{run.stderr[-3000:]}"
    if "fusion_status" in code:
        assert run.stdout.startswith("fused" if _cuda() else "eager"), run.stdout
    if "report.summary()" in code:
        assert "53 patterns replaced by fused modules (53 of 53 Conv2d layers)" in run.stdout, run.stdout


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
