"""A learnable image-classification dataset that needs no download: shapes and textures drawn on the fly.

Each class is one pattern (disk, square, ring, horizontal stripes, vertical stripes, checkerboard, cross, diagonal
stripes, ...) with a random position, size, frequency, foreground and background colour, plus Gaussian noise. A
convnet learns them well above chance within a few hundred steps.

    python examples/synthetic_shapes.py DIR [--per-class 100] [--image-size 256] [--classes 10]

writes them as an image folder (DIR/<class>/<n>.png, the layout torchvision's ImageFolder reads), to try
train_mobilenet_v1.py's --data path without a download.
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch


PATTERNS = ("disk", "square", "ring", "horizontal stripes", "vertical stripes", "checkerboard", "cross",
            "diagonal stripes", "dots", "triangle")


def _masks(labels: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    n, device = labels.shape[0], labels.device
    coords = torch.linspace(-1, 1, size, device=device)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    yy, xx = yy.expand(n, size, size), xx.expand(n, size, size)

    def rand(low, high):
        return (torch.rand(n, 1, 1, generator=generator, device=device) * (high - low) + low)

    cy, cx, r = rand(-0.4, 0.4), rand(-0.4, 0.4), rand(0.25, 0.55)
    freq = rand(3.0, 7.0)
    dy, dx = yy - cy, xx - cx
    dist = (dy ** 2 + dx ** 2).sqrt()
    masks = torch.stack([
        dist < r,                                                       # disk
        (dy.abs() < r) & (dx.abs() < r),                                # square
        (dist < r) & (dist > 0.6 * r),                                  # ring
        torch.sin(yy * freq * 3.1416) > 0,                              # horizontal stripes
        torch.sin(xx * freq * 3.1416) > 0,                              # vertical stripes
        (torch.sin(yy * freq * 3.1416) * torch.sin(xx * freq * 3.1416)) > 0,  # checkerboard
        ((dy.abs() < 0.3 * r) & (dx.abs() < r)) | ((dx.abs() < 0.3 * r) & (dy.abs() < r)),  # cross
        torch.sin((yy + xx) * freq * 2.2214) > 0,                       # diagonal stripes
        (torch.sin(yy * freq * 3.1416) > 0.7) & (torch.sin(xx * freq * 3.1416) > 0.7),  # dots
        (dy < r) & (dy > -r) & (dx.abs() < (dy + r) / 2),               # triangle
    ], dim=1)
    return masks[torch.arange(n, device=device), labels % len(PATTERNS)]


def synthetic_batch(batch_size: int, image_size: int, num_classes: int, generator: torch.Generator,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(images [N, 3, S, S] float32 in about [-1, 1], labels [N]); num_classes <= len(PATTERNS)."""
    if not 2 <= num_classes <= len(PATTERNS):
        raise ValueError(f"num_classes must be between 2 and {len(PATTERNS)} for the synthetic data, got {num_classes}")
    labels = torch.randint(0, num_classes, (batch_size,), generator=generator, device=device)
    mask = _masks(labels, image_size, generator).unsqueeze(1).float()
    fg = torch.rand(batch_size, 3, 1, 1, generator=generator, device=device) * 2 - 1
    bg = torch.rand(batch_size, 3, 1, 1, generator=generator, device=device) * 2 - 1
    images = mask * fg + (1 - mask) * bg
    images = images + 0.2 * torch.randn(images.shape, generator=generator, device=device)
    return images, labels


def class_folder_name(label: int) -> str:
    """Folder of a class in an image folder: its label first, so that ImageFolder's sorted order is the label's."""
    return f"{label:02d}_{PATTERNS[label].replace(' ', '_')}"


def write_image_folder(root: str, images_per_class: int, image_size: int = 256, num_classes: int = len(PATTERNS),
                       seed: int = 0) -> int:
    """Writes images_per_class PNG images of each class under root/<class_folder_name(label)>/; returns the count."""
    if images_per_class < 1:
        raise ValueError(f"images_per_class must be at least 1, got {images_per_class}")
    from PIL import Image  # Pillow, which torchvision (needed to read the folder back) depends on

    generator = torch.Generator().manual_seed(seed)
    written = [0] * num_classes
    while min(written) < images_per_class:
        images, labels = synthetic_batch(64, image_size, num_classes, generator, torch.device("cpu"))
        pixels = ((images.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        for image, label in zip(pixels, labels.tolist()):
            if written[label] == images_per_class:
                continue
            folder = os.path.join(root, class_folder_name(label))
            os.makedirs(folder, exist_ok=True)
            Image.fromarray(np.ascontiguousarray(image)).save(os.path.join(folder, f"{written[label]:05d}.png"),
                                                              compress_level=1)
            written[label] += 1
    return sum(written)


def main() -> None:
    p = argparse.ArgumentParser(description="Write the synthetic shapes as an image folder (one folder per class).",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("root", help="the folder to write (created)")
    p.add_argument("--per-class", type=int, default=100, help="images per class")
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--classes", type=int, default=len(PATTERNS))
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    count = write_image_folder(args.root, args.per_class, args.image_size, args.classes, args.seed)
    print(f"wrote {count} images of {args.classes} classes under {args.root}")


if __name__ == "__main__":
    main()
