#!/usr/bin/env python3
"""The PyTorch baseline of bench_gpu's training steps: the 784-1024-1024-1024-10 ReLU MLP and the
ResNet of benchmarks/torch_cnn.py (xpipe's models/resnet.hpp, layer for layer; cuDNN with
cudnn.benchmark on), fp32 (TF32 off), batch 128, cross-entropy, Adam(fused=True); samples/s eager
and with the whole step (forward, loss, backward, optimizer step) captured in one CUDA graph and
replayed. Prints one JSON object. Exits 77 without torch or without a CUDA device.
  python3 benchmarks/cuda/torch_step.py [--short] [--json PATH]
"""
import argparse
import json
import os
import statistics
import sys

# torch_cnn.py: beside this file in gpu-bundle/, one folder up in the checkout.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--short", action="store_true", help="fewer repeats (a smoke run)")
    ap.add_argument("--json", help="also write the JSON object to this file")
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"SKIP: no PyTorch ({e})")
        return 77
    if not torch.cuda.is_available():
        print("SKIP: no CUDA device visible to PyTorch")
        return 77
    import torch_cnn

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # cuDNN's fastest algorithm per shape: the strongest baseline
    torch.manual_seed(0)
    dev = torch.device("cuda")
    batch = 128
    widths = [784, 1024, 1024, 1024, 10]
    layers = []
    for i, (a, b) in enumerate(zip(widths, widths[1:])):
        layers.append(torch.nn.Linear(a, b))
        if i < len(widths) - 2:
            layers.append(torch.nn.ReLU())
    mlp = torch.nn.Sequential(*layers).to(dev)
    eager, replay = step_seconds(torch, mlp, torch.rand(batch, 784, device=dev),
                                 torch.randint(0, 10, (batch,), device=dev), args.short)
    resnet = torch_cnn.resnet().to(dev)
    torch_cnn.init_like_xpipe(resnet, 1)
    resnet_eager, resnet_replay = step_seconds(
        torch, resnet, torch.randn(batch, 1, 28, 28, device=dev),
        torch.randint(0, 10, (batch,), device=dev), args.short)

    out = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name(0),
        "batch": batch,
        "tf32": False,
        "eager_samples_per_s": batch / eager,
        "graph_samples_per_s": batch / replay,
        "resnet_eager_samples_per_s": batch / resnet_eager,
        "resnet_graph_samples_per_s": batch / resnet_replay,
    }
    text = json.dumps(out)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


def step_seconds(torch, model, x, y, short):
    """Seconds per training step of `model` on the batch (x, y), eager and replayed from a CUDA
    graph of the whole step, each the median over repeats (CUDA events)."""
    loss_fn = torch.nn.CrossEntropyLoss()
    reps, iters = (5, 5) if short else (21, 100)

    def timed(fn):
        """Median seconds per call over reps timings of iters calls (CUDA events)."""
        for _ in range(max(2, iters // 4)):
            fn()
        times = []
        for _ in range(reps):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop) / 1e3 / iters)
        return statistics.median(times)

    # Eager: the ordinary loop.
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)

    def eager_step():
        opt.zero_grad(set_to_none=False)
        loss_fn(model(x), y).backward()
        opt.step()

    eager = timed(eager_step)

    # Whole-step CUDA graph (PyTorch's documented recipe: warm up on a side stream, capturable
    # Adam so the step count lives on the device, static inputs).
    gopt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True, capturable=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            gopt.zero_grad(set_to_none=False)
            loss_fn(model(x), y).backward()
            gopt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    # Gradients set to None before capture: the captured backward then writes them afresh from
    # the graph's memory pool on every replay instead of accumulating into old ones.
    gopt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_fn(model(x), y).backward()
        gopt.step()
    replay = timed(graph.replay)
    return eager, replay


if __name__ == "__main__":
    sys.exit(main())
