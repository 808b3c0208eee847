"""A learnable image-classification dataset that needs no download: shapes and textures drawn on the fly.

Each class is one pattern (disk, square, ring, horizontal stripes, vertical stripes, checkerboard, cross, diagonal
stripes, ...) with a random position, size, frequency, foreground and background colour, plus Gaussian noise. A
convnet learns them well above chance within a few hundred steps.
"""

from __future__ import annotations

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
