"""examples/train_mobilenet_v1.py and its data, run for a few steps at a small size (on the GPU where there is one).
The --data path needs torchvision; the examples need matplotlib and tqdm (`pip install ".[examples]"`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason='the examples need matplotlib: pip install ".[examples]"')
pytest.importorskip("tqdm", reason='the examples need tqdm: pip install ".[examples]"')
Image = pytest.importorskip("PIL.Image", reason="Pillow (torchvision's dependency) reads the images back")

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
TRAIN = os.path.join(EXAMPLES, "train_mobilenet_v1.py")
sys.path.insert(0, EXAMPLES)
from synthetic_shapes import PATTERNS, class_folder_name, write_image_folder  # noqa: E402

BLUE, ORANGE = (31, 119, 180), (255, 127, 14)  # matplotlib's tab:blue (fused) and tab:orange (eager)


def test_synthetic_image_folder_has_one_sorted_folder_per_class(tmp_path):
    assert write_image_folder(str(tmp_path), 4, image_size=24, num_classes=3, seed=1) == 12
    folders = sorted(os.listdir(tmp_path))
    assert folders == [class_folder_name(label) for label in range(3)]
    assert folders[2] == "02_" + PATTERNS[2]  # sorted by name is sorted by label: ImageFolder's labels are ours
    for folder in folders:
        files = sorted(os.listdir(tmp_path / folder))
        assert files == [f"{i:05d}.png" for i in range(4)]
        images = [np.asarray(Image.open(tmp_path / folder / name)) for name in files]
        assert all(image.shape == (24, 24, 3) and image.dtype == np.uint8 for image in images)
        assert len({image.tobytes() for image in images}) == 4  # fresh random images, not one repeated
    with pytest.raises(ValueError, match="images_per_class must be at least 1, got 0"):
        write_image_folder(str(tmp_path / "none"), 0)


def _env(**extra) -> dict:
    """This environment, with the directory this test imports torch_cudnn_fusion from first on PYTHONPATH: the example
    runs in a new process, which must find the same package (an in-place build found through PYTHONPATH=. or
    pytest's rootdir, as an installed one)."""
    import torch_cudnn_fusion

    package_root = os.path.dirname(os.path.dirname(os.path.abspath(torch_cudnn_fusion.__file__)))
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def _train(tmp_path, *args, env=None, launcher=(), timeout=600):
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, *launcher, TRAIN, "--batch-size", "4", "--image-size", "32", "--width",
                          "0.25", "--compare-eager", "--out", str(out), *args],
                         capture_output=True, text=True, timeout=timeout, env=env or _env())
    return run, out


def _pixels_near(image: np.ndarray, color) -> int:
    return int((np.abs(image[..., :3].astype(int) - np.array(color)).sum(-1) < 60).sum())


def _check_log(out, steps: int, classes: int) -> dict:
    with open(out / "train_log.json") as f:
        log = json.load(f)
    assert log["classes"] == classes
    for name in ("fused", "eager"):
        assert len(log["loss"][name]) == steps and all(np.isfinite(log["loss"][name]))
        assert 0.0 <= log["held_out_accuracy"][name] <= 1.0
    assert len(log["max_loss_difference_per_step"]) == steps
    plot = np.asarray(Image.open(out / "loss.png").convert("RGB"))
    assert plot.shape[0] >= 400 and plot.shape[1] >= 800
    # both curves drawn (the eager one dashed over the fused one, so it cannot hide it) and both in the legend
    assert _pixels_near(plot, BLUE) > 200 and _pixels_near(plot, ORANGE) > 50
    return log


def test_example_trains_fused_and_eager_on_synthetic_data(tmp_path):
    run, out = _train(tmp_path, "--steps", "3", "--classes", "4")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "fuse(): " in run.stdout and "largest |loss difference| fused vs eager over 3 steps" in run.stdout
    assert "training: 100%" in run.stderr  # tqdm's progress bar
    _check_log(out, steps=3, classes=4)


def test_example_help_shows_the_defaults():
    run = subprocess.run([sys.executable, TRAIN, "--help"], capture_output=True, text=True, timeout=120, env=_env())
    assert run.returncode == 0, run.stderr
    text = " ".join(run.stdout.split())
    assert "(default: 0.05)" in text and "(default: mobilenet_v1_run)" in text and "(default: 0)" in text


def test_example_runs_under_torchrun_on_the_cpu(tmp_path):
    """Two processes, DistributedDataParallel over gloo (NCCL needs a GPU per process): the GPUs are hidden."""
    # gloo over the loopback interface: a machine's hostname may resolve to an address it cannot reach itself on
    env = _env(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    run, out = _train(tmp_path, "--steps", "2", "--classes", "4", env=env, launcher=launcher, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    _check_log(out, steps=2, classes=4)


def test_example_trains_on_an_image_folder(tmp_path):
    pytest.importorskip("torchvision", reason="--data reads the folder with torchvision's ImageFolder")
    write_image_folder(str(tmp_path / "shapes"), 8, image_size=40, num_classes=3)
    run, out = _train(tmp_path, "--data", str(tmp_path / "shapes"), "--steps", "4", "--held-out", "0.25",
                      "--workers", "0")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "held-out accuracy" in run.stdout
    log = _check_log(out, steps=4, classes=3)
    assert log["held_out_images"] == 6  # a quarter of 24, never trained on

    run, _ = _train(tmp_path, "--data", str(tmp_path / "shapes"), "--batch-size", "32", "--workers", "0")
    assert run.returncode != 0
    assert "--data: 22 training images (of 24, 2 held out) are fewer than one batch of --batch-size 32" in run.stderr
