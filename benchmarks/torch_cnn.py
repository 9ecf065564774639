#!/usr/bin/env python3
"""PyTorch twins of xpipe's two Fashion-MNIST CNNs (models/vgg.hpp, models/resnet.hpp), layer for
layer, with xpipe's init (He-uniform, biases 0, BN gamma 1 beta 0), Adam and data normalisation:
a CPU baseline for xpipe-train's sequential (K = 1) throughput and accuracy.
  --mode time:  samples/s of plain training on T threads; prints one JSON line.
  --mode train: a full training run on Fashion-MNIST; per-epoch loss and test accuracy, then JSON.
  /usr/bin/python3 benchmarks/torch_cnn.py --mode time --model vgg [--threads 2] [--samples 4096]
      [--channels-last]
  /usr/bin/python3 benchmarks/torch_cnn.py --mode train --model resnet --epochs 3
      [--augment-pad 2 --augment-flip] [--train-samples N --test-samples N]
"""
import argparse
import gzip
import json
import math
import os
import re
import struct
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

FILES = {  # split -> (images, labels), the names load_fashion_mnist reads
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# xpipe's parameter counts (unpadded, and in its flat buffer where each layer's block starts on a
# 16-float boundary), worked out by hand from the layer sizes in vgg.hpp and resnet.hpp; the
# PyTorch models are checked against them so a drift on either side shows.
XPIPE_PARAMS = {"vgg": (218490, 218496), "resnet": (272186, 272192)}


# ---- the models ---------------------------------------------------------------------------------

def conv3(cin, cout, stride=1, bias=False):
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=bias)


class Basic(nn.Module):
    """conv-BN-ReLU-conv-BN + shortcut (identity, or a strided 1x1 conv + BN), then ReLU."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.f = nn.Sequential(conv3(cin, cout, stride), nn.BatchNorm2d(cout), nn.ReLU(),
                               conv3(cout, cout), nn.BatchNorm2d(cout))
        self.shortcut = nn.Identity() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        return F.relu(self.f(x) + self.shortcut(x))


class ChannelsLast(nn.Module):
    """The input in channels-last memory (torch.channels_last), which the convolutions and
    BatchNorms after it keep: PyTorch's NHWC path, as xpipe lays its images out."""

    def forward(self, x):
        return x.contiguous(memory_format=torch.channels_last)


def vgg():
    return nn.Sequential(
        # Each pooling before its ReLU, as models/vgg.hpp has it: the same function.
        conv3(1, 16, bias=True), nn.ReLU(), conv3(16, 16, bias=True), nn.MaxPool2d(2), nn.ReLU(),
        conv3(16, 32, bias=True), nn.ReLU(), conv3(32, 32, bias=True), nn.MaxPool2d(2), nn.ReLU(),
        nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(), nn.Linear(128, 10))


def resnet():
    blocks = []
    for cin, cout in [(16, 16), (16, 32), (32, 64)]:
        blocks += [Basic(cin, cout, 1 if cin == cout else 2)] + [Basic(cout, cout, 1)
                                                                 for _ in range(2)]
    return nn.Sequential(conv3(1, 16), nn.BatchNorm2d(16), nn.ReLU(), *blocks,
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def init_like_xpipe(model, seed):
    """layers/init.hpp: weights U(-b, b), b = sqrt(6 / fan_in) (fan_in = C k^2 or In), biases 0;
    BatchNorm gamma 1, beta 0 (PyTorch's own BN default). The draws differ from xpipe's Rng, the
    distributions are the same."""
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            nn.init.uniform_(m.weight, -math.sqrt(6 / fan_in), math.sqrt(6 / fan_in))
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):  # eps 1e-5, momentum 0.1: NormOptions' defaults
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def parameter_counts(model):
    """(total, as xpipe's flat buffer holds it: each layer's block rounded up to 16 floats)."""
    leaves = [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear, nn.BatchNorm2d))]
    sizes = [sum(p.numel() for p in m.parameters(recurse=False)) for m in leaves]
    return sum(p.numel() for p in model.parameters()), sum((s + 15) // 16 * 16 for s in sizes)


# ---- data ---------------------------------------------------------------------------------------

def read_idx(path):
    """An IDX file (gzip) as a uint8 tensor of its dimensions."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        sys.exit(f"error: {path}: not an IDX file of unsigned bytes")
    dims = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    body = data[4 + 4 * ndim:]
    if len(body) != math.prod(dims):
        sys.exit(f"error: {path}: {len(body)} data bytes, expected {math.prod(dims)}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(dims)


def has_data(d):
    return all(os.path.isfile(os.path.join(d, n)) for pair in FILES.values() for n in pair)


def load_fashion_mnist(d):
    """{split: (N x 1 x 28 x 28 float, N labels)}, normalised as dataset.hpp's loader does: pixels
    / 255, then standardised by the mean and std of the whole training set (both splits; a set of
    one pixel value only centred), before any subset is taken."""
    out = {}
    for split, (img, lab) in FILES.items():
        x = read_idx(os.path.join(d, img)).to(torch.float32).mul_(1 / 255)
        out[split] = [x.unsqueeze(1), read_idx(os.path.join(d, lab)).long()]
    train = out["train"][0].double()  # double sums, as the loader's
    mean = train.mean().item()
    var = (train * train).mean().item() - mean * mean
    inv_std = 1.0 if torch.all(train == train.flatten()[0]) else 1 / math.sqrt(var)
    for split in out:
        out[split][0] = (out[split][0] - float(mean)) * float(inv_std)
    return out


def augment(x, pad, flip):
    """augment.hpp: pad by `pad` zeros, crop 28 x 28 at a uniform offset in [0, 2 pad] per axis,
    then mirror with probability 1/2 (the zeros are in normalised space, as xpipe pads)."""
    n, c, h, w = x.shape
    if pad > 0:
        p = F.pad(x, (pad, pad, pad, pad))
        rows = torch.randint(0, 2 * pad + 1, (n, 1)) + torch.arange(h)  # n x h
        cols = torch.randint(0, 2 * pad + 1, (n, 1)) + torch.arange(w)  # n x w
        x = p[torch.arange(n)[:, None, None, None], torch.arange(c)[None, :, None, None],
              rows[:, None, :, None], cols[:, None, None, :]]
    if flip:
        x = torch.where(torch.rand(n, 1, 1, 1) < 0.5, x.flip(-1), x)
    return x


# ---- training -----------------------------------------------------------------------------------

def train_step(model, opt, x, y):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)  # softmax cross-entropy, mean over the batch
    loss.backward()
    opt.step()
    return loss.item()


@torch.no_grad()
def accuracy(model, x, y, batch=1000):
    model.eval()  # BN on its running statistics, as xpipe evaluates
    right = sum((model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
                for i in range(0, len(x), batch))
    model.train()
    return right / len(x)


def run_time(args, model, opt, params):
    n = args.samples
    if has_data(args.data_dir):
        x, y = load_fashion_mnist(args.data_dir)["train"]
        x, y, source = x[:n], y[:n], "fashion-mnist"
        n = len(x)
    else:  # standard-normal inputs: what the normalised images look like to the arithmetic
        x, y, source = torch.randn(n, 1, 28, 28), torch.randint(0, 10, (n,)), "random"
    # Warm-up: oneDNN/ATen pick and cache their kernels, Adam makes its moments.
    for _ in range(args.warmup):
        train_step(model, opt, x[:args.batch], y[:args.batch])
    start = time.perf_counter()
    for i in range(0, n, args.batch):
        train_step(model, opt, x[i:i + args.batch], y[i:i + args.batch])
    seconds = time.perf_counter() - start
    print(json.dumps({"model": args.model, "threads": args.threads, "batch": args.batch,
                      "channels_last": args.channels_last, "samples": n, "data": source, "seconds": round(seconds, 4),
                      "samples_per_second": round(n / seconds, 1),
                      "parameters": {"total": params[0], "xpipe_padded": params[1]},
                      "torch": torch.__version__}))


def lr_scheduler(args, opt):
    """torch's own scheduler for --lr-schedule, stepped after each epoch (as xpipe-train's)."""
    if args.lr_schedule == "constant":
        return None
    if args.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=args.epochs)
    milestones = [int(m) for m in args.lr_schedule[len("step:"):].split(",")]
    return torch.optim.lr_scheduler.MultiStepLR(opt, milestones=milestones, gamma=0.1)


def run_train(args, model, opt, params):
    if not has_data(args.data_dir):
        sys.exit(f"error: --data-dir {args.data_dir} does not hold the four Fashion-MNIST .gz "
                 f"files ({', '.join(n for p in FILES.values() for n in p)})")
    data = load_fashion_mnist(args.data_dir)
    xtr, ytr = (t[:args.train_samples or None] for t in data["train"])
    xte, yte = (t[:args.test_samples or None] for t in data["test"])
    start, epochs = time.perf_counter(), []
    schedule = lr_scheduler(args, opt)
    for e in range(1, args.epochs + 1):
        order = torch.randperm(len(xtr))
        total = 0.0
        for i in range(0, len(xtr), args.batch):
            idx = order[i:i + args.batch]
            # Per batch, not per epoch: the crop's gather indices are 8 bytes per pixel.
            x = augment(xtr[idx], args.augment_pad, args.augment_flip)
            total += train_step(model, opt, x, ytr[idx]) * len(idx)
        rec = {"epoch": e, "lr": opt.param_groups[0]["lr"], "loss": total / len(xtr),
               "test_accuracy": accuracy(model, xte, yte), "seconds": time.perf_counter() - start}
        if schedule is not None:
            schedule.step()
        epochs.append(rec)
        print(f"epoch {e}: loss {rec['loss']:.4f}  test accuracy {100 * rec['test_accuracy']:.2f}%"
              f"  ({rec['seconds']:.1f} s)", flush=True)
    print(json.dumps({"model": args.model, "threads": args.threads, "batch": args.batch,
                      "lr": args.lr, "lr_schedule": args.lr_schedule, "epochs": args.epochs,
                      "seed": args.seed,
                      "train_samples": len(xtr), "test_samples": len(xte),
                      "augment_pad": args.augment_pad, "augment_flip": args.augment_flip,
                      "parameters": params[0], "final_test_accuracy": epochs[-1]["test_accuracy"],
                      "seconds": round(time.perf_counter() - start, 2), "epoch_records": epochs,
                      "torch": torch.__version__}))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["time", "train"], default="time")
    ap.add_argument("--model", choices=["vgg", "resnet"], default="vgg")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--batch", type=int, default=128, help="mini-batch (default 128)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    ap.add_argument("--seed", type=int, default=1, help="init, shuffle and augmentation seed")
    ap.add_argument("--channels-last", action="store_true",
                    help="train in channels-last memory (PyTorch's NHWC path; default NCHW)")
    ap.add_argument("--data-dir", default=os.environ.get("XPIPE_DATA_DIR") or
                    "/usr/share/datasets/fashion-mnist",
                    help="the four Fashion-MNIST .gz IDX files (default $XPIPE_DATA_DIR or "
                         "/usr/share/datasets/fashion-mnist)")
    t = ap.add_argument_group("--mode time")
    t.add_argument("--samples", type=int, default=4096, help="samples timed (default 4096; random "
                   "inputs unless --data-dir holds Fashion-MNIST)")
    t.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    r = ap.add_argument_group("--mode train")
    r.add_argument("--epochs", type=int, default=3, help="default 3, as xpipe-train")
    r.add_argument("--train-samples", type=int, default=0, help="first N training samples (0: all)")
    r.add_argument("--test-samples", type=int, default=0, help="first N test samples (0: all)")
    r.add_argument("--augment-pad", type=int, default=0, help="random crop after N zeros (0..8)")
    r.add_argument("--augment-flip", action="store_true", help="mirror with probability 1/2")
    r.add_argument("--lr-schedule", default="constant",
                   help="constant, cosine (to 0 over --epochs) or step:E1,E2,... (x0.1 after "
                        "each epoch named), per epoch as xpipe-train --lr-schedule")
    args = ap.parse_args()
    if not 0 <= args.augment_pad <= 8:  # augment.hpp's max_pad
        ap.error(f"--augment-pad {args.augment_pad} is outside 0..8")
    milestones = re.fullmatch(r"step:(\d+(?:,\d+)*)", args.lr_schedule)
    steps = [int(m) for m in milestones.group(1).split(",")] if milestones else []
    if not (args.lr_schedule in ("constant", "cosine") or milestones) or \
            any(m < 1 for m in steps) or any(b <= a for a, b in zip(steps, steps[1:])):
        ap.error(f"--lr-schedule {args.lr_schedule}: expected constant, cosine or step:E1,E2,... "
                 "(whole epochs >= 1, each above the one before), as xpipe-train")
    if min(args.threads, args.batch, args.samples, args.epochs) < 1:
        ap.error("--threads, --batch, --samples and --epochs must be positive")

    torch.set_num_threads(args.threads)
    model = {"vgg": vgg, "resnet": resnet}[args.model]()
    init_like_xpipe(model, args.seed)
    if args.channels_last:
        model = nn.Sequential(ChannelsLast(), model).to(memory_format=torch.channels_last)
    params = parameter_counts(model)
    assert params == XPIPE_PARAMS[args.model], f"{args.model}: {params} != xpipe's"
    # torch's Adam defaults are xpipe's: betas (0.9, 0.999), eps 1e-8, no weight decay.
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    (run_time if args.mode == "time" else run_train)(args, model, opt, params)
    return 0


if __name__ == "__main__":
    sys.exit(main())
