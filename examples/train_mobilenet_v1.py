"""Train MobileNet v1 end to end with torch_cudnn_fusion's fused layers.

    python examples/train_mobilenet_v1.py                     # synthetic shapes, full size on a GPU, small on a CPU
    python examples/train_mobilenet_v1.py --compare-eager     # + the eager model from the same weights and batches
    python examples/train_mobilenet_v1.py --data /path/to/imagefolder   # real images (needs torchvision)
    python examples/synthetic_shapes.py /tmp/shapes && python examples/train_mobilenet_v1.py --data /tmp/shapes
    torchrun --nproc-per-node 2 examples/train_mobilenet_v1.py            # DistributedDataParallel (NCCL; gloo on CPU)

Needs matplotlib and tqdm (`pip install ".[examples]"`). Writes OUT/loss.png (the loss curves) and OUT/train_log.json.
bf16 autocast by default (--dtype float16 uses a GradScaler), channels_last, SGD with momentum, a linear warm-up and a
cosine learning-rate schedule. The default data (examples/synthetic_shapes.py) needs no download and is learnable: accuracy
rises well above chance.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_cudnn_fusion as tcf  # noqa: E402
from synthetic_shapes import PATTERNS, synthetic_batch  # noqa: E402
from torch_cudnn_fusion.models import mobilenet_v1  # noqa: E402


def parse_args():
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--steps", type=int, default=300 if gpu else 500, help="training steps")
    p.add_argument("--batch-size", type=int, default=256 if gpu else 32, help="per process")
    p.add_argument("--image-size", type=int, default=224 if gpu else 64, help="training images are this square")
    p.add_argument("--width", type=float, default=1.0 if gpu else 0.25, help="MobileNet width multiplier")
    p.add_argument("--classes", type=int, default=len(PATTERNS), help="synthetic classes (with --data: the folder's)")
    p.add_argument("--lr", type=float, default=0.05, help="peak learning rate (SGD, Nesterov momentum 0.9)")
    p.add_argument("--weight-decay", type=float, default=4e-5, help="SGD weight decay")
    p.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16" if gpu else "float32",
                   help="autocast dtype (float16 with a GradScaler; float32: no autocast)")
    p.add_argument("--data", default=None, help="an image folder (class per subdirectory); needs torchvision")
    p.add_argument("--held-out", type=float, default=0.1, help="with --data: the fraction of images never trained on")
    p.add_argument("--workers", type=int, default=8, help="with --data: data-loading processes")
    p.add_argument("--compare-eager", action="store_true",
                   help="also train the eager model from the same initial weights on the same batches")
    p.add_argument("--out", default="mobilenet_v1_run", help="directory for the loss plot and the JSON log")
    p.add_argument("--seed", type=int, default=0, help="weights, data and held-out split")
    return p.parse_args()


def plot_losses(path: str, history: dict[str, list[float]]) -> None:
    """The training loss per step of each model: fused solid, eager dashed on top of it, so both stay visible."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    styles = {"fused": {"color": "tab:blue", "linewidth": 2.5},
              "eager": {"color": "tab:orange", "linewidth": 1.2, "linestyle": "--"}}
    for name, losses in history.items():
        ax.plot(range(1, len(losses) + 1), losses, label=f"{name} ({losses[0]:.2f} -> {losses[-1]:.2f})",
                **styles.get(name, {}))
    ax.set_xlabel("training step")
    ax.set_ylabel("cross-entropy loss")
    ax.set_title("MobileNet v1: " + " vs ".join(history) + " from the same weights and batches")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def image_folder_data(path, batch_size, image_size, device, seed, held_out_fraction, workers, ddp):
    """(endless training batches, held-out batches, class count, held-out image count) from an image folder (one
    subfolder per class). A fixed random held_out_fraction of the images is never trained on; under DDP each process
    trains on its own shard (DistributedSampler)."""
    try:
        from torchvision import datasets, transforms
    except ImportError as error:
        raise SystemExit(f"--data needs torchvision ({error}); the default synthetic data needs nothing") from error
    normalize = transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    train_tf = transforms.Compose([transforms.RandomResizedCrop(image_size), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), normalize])
    eval_tf = transforms.Compose([transforms.Resize(image_size * 8 // 7), transforms.CenterCrop(image_size),
                                  transforms.ToTensor(), normalize])
    train_set, eval_set = datasets.ImageFolder(path, train_tf), datasets.ImageFolder(path, eval_tf)
    order = torch.randperm(len(train_set), generator=torch.Generator().manual_seed(seed)).tolist()
    held = int(len(order) * held_out_fraction)
    if len(order) - held < batch_size:
        raise SystemExit(f"--data: {len(order) - held} training images (of {len(order)}, {held} held out) are fewer "
                         f"than one batch of --batch-size {batch_size}")
    train_set = torch.utils.data.Subset(train_set, order[held:])
    eval_set = torch.utils.data.Subset(eval_set, order[:held])
    sampler = torch.utils.data.DistributedSampler(train_set, seed=seed) if ddp else None
    # persistent workers: a small folder's epochs are a few batches long, and starting the workers again for each
    # one would leave the GPU waiting
    loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, shuffle=sampler is None, sampler=sampler,
                                         num_workers=workers, drop_last=True, pin_memory=device.type == "cuda",
                                         persistent_workers=workers > 0, generator=torch.Generator().manual_seed(seed))
    held_out = torch.utils.data.DataLoader(eval_set, batch_size=batch_size, num_workers=workers)

    def batches():
        for epoch in itertools.count():
            if sampler is not None:
                sampler.set_epoch(epoch)
            for images, labels in loader:
                yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)

    def held_out_batches():
        for images, labels in held_out:
            yield images.to(device), labels.to(device)

    return batches(), held_out_batches if held else None, len(train_set.dataset.classes), held


def synthetic_batches(batch_size, image_size, classes, device, seed):
    generator = torch.Generator(device=device).manual_seed(seed)
    while True:
        yield synthetic_batch(batch_size, image_size, classes, generator, device)


class Trainer:
    def __init__(self, model, args, device, dtype, ddp):
        self.model = model
        if ddp:
            self.model = torch.nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        self.opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=args.weight_decay,
                                   nesterov=True)
        warmup = max(1, args.steps // 10)  # linear warm-up, then cosine decay to 0
        self.sched = torch.optim.lr_scheduler.LambdaLR(
            self.opt, lambda s: (s + 1) / warmup if s < warmup
            else 0.5 * (1 + math.cos(math.pi * min(s - warmup, args.steps - warmup) / (args.steps - warmup))))
        self.dtype, self.device = dtype, device
        self.scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def step(self, images, labels):
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        with torch.autocast(self.device.type, self.dtype, enabled=self.dtype != torch.float32):
            logits = self.model(images)
            loss = F.cross_entropy(logits.float(), labels)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.opt)
        self.scaler.update()
        self.sched.step()
        return loss.detach(), (logits.argmax(1) == labels).float().mean()

    @torch.no_grad()
    def accuracy(self, batches):
        self.model.eval()
        correct = total = 0
        for images, labels in batches:
            with torch.autocast(self.device.type, self.dtype, enabled=self.dtype != torch.float32):
                logits = self.model(images.to(memory_format=torch.channels_last))
                correct += (logits.argmax(1) == labels).sum().item()
            total += labels.numel()
        return correct / total


def main():
    args = parse_args()
    try:
        from tqdm import tqdm
    except ImportError as error:
        raise SystemExit(f"this example needs tqdm and matplotlib: pip install \".[examples]\" ({error})") from error
    ddp = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    rank, local_rank = 0, int(os.environ.get("LOCAL_RANK", 0))
    if ddp:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        rank = dist.get_rank()
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    dtype = getattr(torch, args.dtype)
    torch.backends.cudnn.benchmark = device.type == "cuda"
    torch.manual_seed(args.seed)
    classes = args.classes
    if args.data:
        batches, held_out_batches, classes, held_out_images = image_folder_data(
            args.data, args.batch_size, args.image_size, device, args.seed, args.held_out, args.workers, ddp)
    else:
        batches = synthetic_batches(args.batch_size, args.image_size, classes, device, args.seed + rank)

        def held_out_batches():  # 4 batches never trained on (another seed), the same ones for each model
            return itertools.islice(synthetic_batches(args.batch_size, args.image_size, classes, device,
                                                      10_000 + args.seed), 4)

        held_out_images = 4 * args.batch_size

    plain = mobilenet_v1(num_classes=classes, width_multiplier=args.width).to(device)
    plain = plain.to(memory_format=torch.channels_last)
    initial = copy.deepcopy(plain) if args.compare_eager else None
    # an example batch, so that the report says how each fused layer runs here (on a CPU: eager, and why)
    example = torch.randn(2, 3, args.image_size, args.image_size, device=device).to(memory_format=torch.channels_last)
    with torch.autocast(device.type, dtype, enabled=dtype != torch.float32):
        fused_model, report = tcf.fuse(plain, example)
    if rank == 0:
        print(f"fuse(): {report.summary()}")
    trainers = {"fused": Trainer(fused_model, args, device, dtype, ddp)}
    if initial is not None:
        trainers["eager"] = Trainer(initial, args, device, dtype, ddp)

    history = {name: [] for name in trainers}
    accuracy = {name: [] for name in trainers}
    max_diff = []
    progress = tqdm(range(1, args.steps + 1), desc="training", unit="step", disable=rank != 0)
    start = time.time()
    for step in progress:
        images, labels = next(batches)
        images = images.to(memory_format=torch.channels_last)
        for name, trainer in trainers.items():
            loss, acc = trainer.step(images, labels)
            history[name].append(loss.item())
            accuracy[name].append(acc.item())
        text = f"loss {history['fused'][-1]:.3f} acc {accuracy['fused'][-1]:.2f}"
        if "eager" in trainers:
            max_diff.append(abs(history["fused"][-1] - history["eager"][-1]))
            text += f" |Δloss| vs eager {max_diff[-1]:.2e}"
        progress.set_postfix_str(text, refresh=False)
    elapsed = time.time() - start
    # stops the loader's workers and pin-memory thread now: left to the interpreter's exit, their shutdown hung
    # (H200, 14 workers)
    batches.close()

    results = {"args": vars(args), "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "classes": classes, "held_out_images": held_out_images, "seconds": elapsed,
               "loss": history, "train_accuracy": accuracy}
    if held_out_batches is not None:
        results["held_out_accuracy"] = {name: t.accuracy(held_out_batches()) for name, t in trainers.items()}
    if max_diff:
        results["max_loss_difference_per_step"] = max_diff
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "train_log.json"), "w") as f:
            json.dump(results, f, indent=1)
        first, last = history["fused"][0], sum(history["fused"][-10:]) / min(10, len(history["fused"]))
        print(f"fused: loss {first:.3f} -> {last:.3f} (mean of the last 10 steps) in {elapsed:.1f} s, "
              f"{args.steps * args.batch_size * (dist.get_world_size() if ddp else 1) / elapsed:.0f} images/s "
              "(both models, when comparing)")
        if held_out_batches is not None:
            chance = 1 / classes
            for name, acc in results["held_out_accuracy"].items():
                print(f"{name}: held-out accuracy {acc:.3f} on {held_out_images} images never trained on "
                      f"(chance {chance:.3f})")
        if max_diff:
            print(f"largest |loss difference| fused vs eager over {len(max_diff)} steps: {max(max_diff):.3e} "
                  f"(step {max_diff.index(max(max_diff)) + 1}); first 5 steps: "
                  + ", ".join(f"{d:.1e}" for d in max_diff[:5]))
        plot_losses(os.path.join(args.out, "loss.png"), history)
        print(f"loss curves: {os.path.join(args.out, 'loss.png')}")
    if ddp:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
