"""examples/train_mobilenet_v1.py and its data, run for a few steps at a small size (on the GPU where there is one).
The --data path needs torchvision and is skipped without it."""

import json
import os
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest
import torch

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)
from png_plot import write_png  # noqa: E402
from synthetic_shapes import PATTERNS, class_folder_name, write_image_folder  # noqa: E402


def _read_png(path: str) -> np.ndarray:
    """Decodes the PNGs write_png writes (8-bit RGB, filter type 0 on every row)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, {}
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body) & 0xFFFFFFFF, f"bad CRC in {kind}"
        chunks[kind] = chunks.get(kind, b"") + body
        pos += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", chunks[b"IHDR"][:10])
    assert (depth, color) == (8, 2)
    rows = np.frombuffer(zlib.decompress(chunks[b"IDAT"]), dtype=np.uint8).reshape(height, 1 + 3 * width)
    assert (rows[:, 0] == 0).all()
    return rows[:, 1:].reshape(height, width, 3)


def test_write_png_round_trips_and_names_a_wrong_array(tmp_path):
    img = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
    write_png(str(tmp_path / "a.png"), img)
    np.testing.assert_array_equal(_read_png(str(tmp_path / "a.png")), img)
    with pytest.raises(ValueError, match=r"img must be uint8 of shape \(height, width, 3\), got float32"):
        write_png(str(tmp_path / "b.png"), img.astype(np.float32))


def test_synthetic_image_folder_has_one_sorted_folder_per_class(tmp_path):
    assert write_image_folder(str(tmp_path), 4, image_size=24, num_classes=3, seed=1) == 12
    folders = sorted(os.listdir(tmp_path))
    assert folders == [class_folder_name(label) for label in range(3)]
    assert folders[2] == "02_" + PATTERNS[2]  # sorted by name is sorted by label: ImageFolder's labels are ours
    for folder in folders:
        files = sorted(os.listdir(tmp_path / folder))
        assert files == [f"{i:05d}.png" for i in range(4)]
        images = [_read_png(str(tmp_path / folder / name)) for name in files]
        assert all(image.shape == (24, 24, 3) for image in images)
        assert len({image.tobytes() for image in images}) == 4  # fresh random images, not one repeated
    with pytest.raises(ValueError, match="images_per_class must be at least 1, got 0"):
        write_image_folder(str(tmp_path / "none"), 0)


def _train(tmp_path, *args):
    out = tmp_path / "run"
    run = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train_mobilenet_v1.py"), "--batch-size", "4",
                          "--image-size", "32", "--width", "0.25", "--compare-eager", "--out", str(out), *args],
                         capture_output=True, text=True, timeout=600)
    return run, out


def _check_log(out, steps: int, classes: int) -> dict:
    with open(out / "train_log.json") as f:
        log = json.load(f)
    assert log["classes"] == classes
    for name in ("fused", "eager"):
        assert len(log["loss"][name]) == steps and all(np.isfinite(log["loss"][name]))
        assert 0.0 <= log["held_out_accuracy"][name] <= 1.0
    assert len(log["max_loss_difference_per_step"]) == steps
    assert (out / "loss_fused_vs_eager.png").stat().st_size > 0
    return log


def test_example_trains_fused_and_eager_on_synthetic_data(tmp_path):
    run, out = _train(tmp_path, "--steps", "3", "--classes", "4")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert "fuse(): " in run.stdout and "largest |loss difference| fused vs eager over 3 steps" in run.stdout
    _check_log(out, steps=3, classes=4)


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
