#!/usr/bin/env python3
"""PyTorch twin of xpipe's byte-level GPT (models/gpt.hpp), layer for layer, with xpipe's init
(embedding tables N(0, 0.02), Linear He-uniform with biases 0, LayerNorm gamma 1 beta 0), Adam
and text corpus (data/text.hpp): a baseline for xpipe-train --model gpt's throughput and
validation loss.
  --mode time:  tokens/s of plain training steps at batch B sequences; prints one JSON line
                (on --device cuda also the same step replayed as a CUDA graph).
  --mode train: training on the fortunes corpus; per-epoch validation loss (nats per token),
                perplexity and token accuracy, then JSON.
  /usr/bin/python3 benchmarks/torch_gpt.py --mode time [--threads 2] [--batch 16] [--steps 20]
  /usr/bin/python3 benchmarks/torch_gpt.py --mode train --epochs 3 [--train-tokens N] [--seed S]
      [--dim 64 --context 128 --heads 4] [--device cuda]
"""
import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

VOCAB = 256  # byte-level tokens: gpt::vocab, text_vocabulary
BLOCKS = 8
DEFAULT_TEXT_DIR = "/usr/share/games/fortunes"  # default_text_corpus_dir() without XPIPE_TEXT_DIR
# What text.hpp reads from Debian's fortunes package (43 files, 13,696 training and 1,521
# validation fortunes), checked when the default directory is used: a drift in either reader shows.
FORTUNES_BYTES = {"train": 2286608, "validation": 259634}
FORTUNES_SEQUENCES_128 = {"train": 17864, "validation": 2028}
# xpipe's parameter count of Gpt<64, 4, 128>::K1 (unpadded, and in its flat buffer, where each
# layer's block starts on a 16-float boundary), by hand from the layer sizes in gpt.hpp:
#   Embedding<256, 128, 64>   256*64 + 128*64                                   =  24576
#   Block, 8 times:
#     LayerNorm<64>           2*64                                              =    128
#     Linear<64, 192>         64*192 + 192                                      =  12480
#     Linear<64, 64>          64*64 + 64                                        =   4160
#     LayerNorm<64>           2*64                                              =    128
#     Linear<64, 256>         64*256 + 256                                      =  16640
#     Linear<256, 64>         256*64 + 64                                       =  16448
#                             one block 49984, eight                            = 399872
#   LayerNorm<64>             2*64                                              =    128
#   Linear<64, 256>           64*256 + 256                                      =  16640
#   total 24576 + 399872 + 128 + 16640 = 441216; every block is a multiple of 16, so the padded
#   buffer holds 441216 too (CausalSelfAttention, GELU and the residuals have no parameters).
XPIPE_PARAMS_64_128 = (441216, 441216)


def xpipe_layer_sizes(dim, context):
    """The parameter count of each layer of Gpt<dim, heads, context>::K1 in xpipe's order: the
    comment above as a formula, for the sizes --dim and --context pick."""
    d = dim
    block = [2 * d, d * 3 * d + 3 * d, d * d + d, 2 * d, d * 4 * d + 4 * d, 4 * d * d + d]
    return [VOCAB * d + context * d] + BLOCKS * block + [2 * d, d * VOCAB + VOCAB]


def padded(sizes):
    return sum((s + 15) // 16 * 16 for s in sizes)


# ---- the model ----------------------------------------------------------------------------------

class Embedding(nn.Module):
    """layers/embedding.hpp: token table (256 x D) + learned position table (T x D), one xpipe
    layer (one parameter block)."""

    def __init__(self, context, dim):
        super().__init__()
        self.tokens = nn.Parameter(torch.empty(VOCAB, dim))
        self.positions = nn.Parameter(torch.empty(context, dim))

    def forward(self, ids):  # ids: B x T byte values
        return F.embedding(ids, self.tokens) + self.positions[:ids.shape[1]]


def causal_attention(q, k, v):
    """Per head: softmax(q k^T / sqrt(dh), causal) v; q, k, v are B x H x T x dh."""
    sdpa = getattr(F, "scaled_dot_product_attention", None)  # torch >= 2.0
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=True)
    t, dh = q.shape[-2], q.shape[-1]
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(dh))
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu_(1)  # token t sees 0..t
    return torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1) @ v


class Block(nn.Module):
    """gpt::Block: x + Linear<D, D>(attn(Linear<D, 3D>(LN(x)))), then
    x + Linear<4D, D>(GELU(Linear<D, 4D>(LN(x))))."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.qkv = nn.LayerNorm(dim), nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2, self.fc = nn.LayerNorm(dim), nn.Linear(dim, 4 * dim)
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        # q | k | v, D each; head h in columns [h dh, (h + 1) dh) of each (attention.hpp).
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).split(d, dim=-1))
        x = x + self.proj(causal_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))  # exact (erf) GELU, as kernels' Gelu


class Gpt(nn.Module):
    """Gpt<D, H, T>::K1: Embedding, 8 Blocks, LayerNorm, Linear<D, 256>; ids B x T -> logits
    B x T x 256."""

    def __init__(self, dim, context, heads):
        super().__init__()
        self.embed = Embedding(context, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(BLOCKS)])
        self.norm = nn.LayerNorm(dim)  # eps 1e-5: NormOptions' default
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, ids):
        return self.head(self.norm(self.blocks(self.embed(ids))))


def xpipe_layers(model):
    """The modules that are one xpipe layer each (one parameter block), in xpipe's order."""
    return [m for m in model.modules() if isinstance(m, (Embedding, nn.LayerNorm, nn.Linear))]


def init_like_xpipe(model, seed):
    """Embedding::init: both tables N(0, 0.02); layers/init.hpp He-uniform: Linear weights
    U(-b, b), b = sqrt(6 / in features), biases 0; LayerNorm::init: gamma 1, beta 0. The draws
    differ from xpipe's Rng, the distributions are the same."""
    torch.manual_seed(seed)
    for m in xpipe_layers(model):
        if isinstance(m, Embedding):
            nn.init.normal_(m.tokens, 0.0, 0.02)
            nn.init.normal_(m.positions, 0.0, 0.02)
        elif isinstance(m, nn.Linear):
            bound = math.sqrt(6 / m.in_features)
            nn.init.uniform_(m.weight, -bound, bound)
            nn.init.zeros_(m.bias)
        else:
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


def parameter_counts(model):
    """(total, as xpipe's flat buffer holds it: each layer's block rounded up to 16 floats)."""
    sizes = [sum(p.numel() for p in m.parameters(recurse=False)) for m in xpipe_layers(model)]
    return sum(p.numel() for p in model.parameters()), padded(sizes)


# ---- data: data/text.hpp ------------------------------------------------------------------------

def corpus_files(d):
    """text_corpus_files: regular files that are not symlinks and not *.dat, by the bytes of the
    name."""
    if not os.path.isdir(d):
        sys.exit(f"error: text corpus directory '{d}' does not exist or is not a directory "
                 "(install Debian's `fortunes` package or set XPIPE_TEXT_DIR)")
    files = [n for n in os.listdir(d)
             if not os.path.islink(os.path.join(d, n)) and os.path.isfile(os.path.join(d, n))
             and os.path.splitext(n)[1] != ".dat"]
    if not files:
        sys.exit(f"error: text corpus directory '{d}' holds no corpus files "
                 "(regular files other than symlinks and *.dat)")
    return [os.path.join(d, n) for n in sorted(files, key=os.fsencode)]


def fortunes(text):
    """for_each_fortune: the pieces between lines that are exactly '%' (b'\\n' ends a line),
    separators dropped, newlines kept, empty pieces skipped."""
    start = line = 0
    while line < len(text):
        nl = text.find(b"\n", line)
        end, nxt = (len(text), len(text)) if nl < 0 else (nl, nl + 1)
        if text[line:end] == b"%":
            if line > start:
                yield text[start:line]
            start = nxt
        line = nxt
    if len(text) > start:
        yield text[start:]


def read_corpus(d):
    """read_text_corpus: {"train": bytes, "validation": bytes}; fortune i, counted over all
    files, goes to validation when i % 10 == 9."""
    parts, i = {"train": [], "validation": []}, 0
    for path in corpus_files(d):
        with open(path, "rb") as f:
            text = f.read()
        if b"\0" in text:
            sys.exit(f"error: text corpus file '{path}' is damaged: byte {text.index(0)} is NUL, "
                     "so it is binary, not text")
        for piece in fortunes(text):
            parts["validation" if i % 10 == 9 else "train"].append(piece)
            i += 1
    return {split: b"".join(p) for split, p in parts.items()}


def sequences(text, context, what):
    """text_sequences: (inputs, labels), both N x T uint8, N = (size - 1) // T; sequence s reads
    bytes [s T, s T + T) and predicts bytes [s T + 1, s T + T]."""
    n = (len(text) - 1) // context
    if n < 1:
        sys.exit(f"error: {what} holds {len(text)} bytes, fewer than one sequence of context "
                 f"{context} needs ({context + 1})")
    data = torch.frombuffer(bytearray(text[:n * context + 1]), dtype=torch.uint8)
    return data[:-1].view(n, context), data[1:].view(n, context)


def load_corpus(d, context):
    """{"train": (x, y), "validation": (x, y)}; for Debian's corpus, sizes checked against
    xpipe's."""
    text = read_corpus(d)
    if os.path.normpath(d) == DEFAULT_TEXT_DIR:
        sizes = {split: len(t) for split, t in text.items()}
        assert sizes == FORTUNES_BYTES, f"{d}: split sizes {sizes} != xpipe's {FORTUNES_BYTES}"
    out = {split: sequences(t, context, f"text corpus '{d}': the {split} split")
           for split, t in text.items()}
    if os.path.normpath(d) == DEFAULT_TEXT_DIR and context == 128:
        counts = {split: len(x) for split, (x, _) in out.items()}
        assert counts == FORTUNES_SEQUENCES_128, f"{counts} != xpipe's {FORTUNES_SEQUENCES_128}"
    return out


# ---- training -----------------------------------------------------------------------------------

def loss_of(model, x, y):
    """Softmax cross-entropy, mean over every token of the batch (layers/loss.hpp)."""
    return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))


def train_step(model, opt, x, y):
    """One step; the loss stays on the device (no synchronisation)."""
    opt.zero_grad(set_to_none=True)
    loss = loss_of(model, x, y)
    loss.backward()
    opt.step()
    return loss.detach()


@torch.no_grad()
def evaluate(model, x, y, batch, device):
    """(mean loss in nats per token, token accuracy) over all of x, y."""
    total, right = 0.0, 0
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch].to(device).long(), y[i:i + batch].to(device).long()
        logits = model(xb)
        total += F.cross_entropy(logits.reshape(-1, VOCAB), yb.reshape(-1),
                                 reduction="sum").item()
        right += (logits.argmax(-1) == yb).sum().item()
    return total / y.numel(), right / y.numel()


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_cuda_graph(args, model, batches, device):
    """The same step (forward, loss, backward, Adam) captured once as a CUDA graph and replayed,
    a batch copied into the static inputs before each replay: PyTorch's whole-network capture
    (Adam with capturable=True, gradients allocated inside the capture)."""
    opt = torch.optim.Adam(model.parameters(), lr=args.lr, capturable=True)
    sx, sy = batches[0][0].clone(), batches[0][1].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as capture requires
        for _ in range(max(args.warmup, 3)):
            train_step(model, opt, sx, sy)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        loss_of(model, sx, sy).backward()
        opt.step()
    graph.replay()
    sync(device)
    start = time.perf_counter()
    for i in range(args.steps):
        x, y = batches[i % len(batches)]
        sx.copy_(x)
        sy.copy_(y)
        graph.replay()
    sync(device)
    return time.perf_counter() - start


def run_time(args, model, opt, params, device):
    b, t = args.batch, args.context
    if os.path.isdir(args.text_dir):
        x, y = load_corpus(args.text_dir, t)["train"]
        source = "fortunes"
    else:  # uniform random bytes: the same arithmetic
        gen = torch.Generator().manual_seed(args.seed)
        x = torch.randint(0, VOCAB, (max(b, 64), t), generator=gen, dtype=torch.uint8)
        y = torch.randint(0, VOCAB, x.shape, generator=gen, dtype=torch.uint8)
        source = "random"
    if len(x) < b:
        sys.exit(f"error: --batch {b} is more than the {len(x)} sequences there are")
    # Consecutive batches of the training sequences, cycled, on the device before timing.
    count = min(args.steps, len(x) // b)
    batches = [(x[i * b:(i + 1) * b].to(device).long(), y[i * b:(i + 1) * b].to(device).long())
               for i in range(count)]
    # Warm-up: oneDNN/cuBLAS pick and cache their kernels, Adam makes its moments.
    for i in range(args.warmup):
        train_step(model, opt, *batches[i % len(batches)])
    sync(device)
    start = time.perf_counter()
    for i in range(args.steps):
        train_step(model, opt, *batches[i % len(batches)])
    sync(device)
    seconds = time.perf_counter() - start
    tokens = args.steps * b * t
    rec = {"model": f"gpt<{args.dim},{args.heads},{args.context}>", "device": str(device),
           "threads": args.threads, "batch": b, "context": t, "steps": args.steps,
           "tokens": tokens, "data": source, "seconds": round(seconds, 4),
           "tokens_per_second": round(tokens / seconds, 1), "attention": attention_kind(),
           "parameters": {"total": params[0], "xpipe_padded": params[1]},
           "torch": torch.__version__}
    if device.type == "cuda" and not args.no_cuda_graph:
        try:
            g = time_cuda_graph(args, model, batches, device)
            rec["cuda_graph"] = {"seconds": round(g, 4), "tokens_per_second": round(tokens / g, 1)}
        except Exception as e:  # optional: the plain step's numbers stand without it
            rec["cuda_graph"] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(rec))


def run_train(args, model, opt, params, device):
    data = load_corpus(args.text_dir, args.context)
    xtr, ytr = data["train"]
    xva, yva = data["validation"]
    if args.train_tokens:  # the first N tokens, in whole sequences (as Dataset's subset)
        xtr, ytr = xtr[:args.train_tokens // args.context], ytr[:args.train_tokens // args.context]
        if len(xtr) == 0:
            sys.exit(f"error: --train-tokens {args.train_tokens} is less than one sequence "
                     f"of {args.context}")
    if args.val_tokens:  # at least one sequence
        n = max(1, args.val_tokens // args.context)
        xva, yva = xva[:n], yva[:n]
    shuffle = torch.Generator().manual_seed(args.seed)  # on the CPU: one order on every device
    start, epochs = time.perf_counter(), []
    for e in range(1, args.epochs + 1):
        order = torch.randperm(len(xtr), generator=shuffle)
        total = torch.zeros((), dtype=torch.float64, device=device)
        for i in range(0, len(xtr), args.batch):  # the last batch may be short, as Batcher's
            idx = order[i:i + args.batch]
            loss = train_step(model, opt, xtr[idx].to(device).long(), ytr[idx].to(device).long())
            total += loss.double() * len(idx)
        val_loss, val_acc = evaluate(model, xva, yva, args.eval_batch, device)
        rec = {"epoch": e, "train_loss": total.item() / len(xtr), "val_loss": val_loss,
               "val_perplexity": math.exp(val_loss), "val_accuracy": val_acc,
               "seconds": time.perf_counter() - start}
        epochs.append(rec)
        print(f"epoch {e}: train loss {rec['train_loss']:.4f}  validation loss {val_loss:.4f} "
              f"nats/token  perplexity {rec['val_perplexity']:.3f}  accuracy "
              f"{100 * val_acc:.2f}%  ({rec['seconds']:.1f} s)", flush=True)
    last = epochs[-1]
    print(json.dumps({"model": f"gpt<{args.dim},{args.heads},{args.context}>",
                      "device": str(device), "threads": args.threads, "batch": args.batch,
                      "lr": args.lr, "epochs": args.epochs, "seed": args.seed,
                      "text_dir": args.text_dir, "train_sequences": len(xtr),
                      "train_tokens": xtr.numel(), "validation_sequences": len(xva),
                      "validation_tokens": xva.numel(), "attention": attention_kind(),
                      "parameters": params[0], "xpipe_padded_parameters": params[1],
                      "final_val_loss": last["val_loss"],
                      "final_val_perplexity": last["val_perplexity"],
                      "final_val_accuracy": last["val_accuracy"],
                      "seconds": round(time.perf_counter() - start, 2), "epoch_records": epochs,
                      "torch": torch.__version__}))


def attention_kind():
    return "sdpa" if hasattr(F, "scaled_dot_product_attention") else "explicit"


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mode", choices=["time", "train"], default="time")
    ap.add_argument("--dim", type=int, default=64, help="model width D (default 64)")
    ap.add_argument("--context", type=int, default=128, help="tokens per sequence T (default 128)")
    ap.add_argument("--heads", type=int, default=4, help="attention heads, dividing D (default 4)")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--batch", type=int, default=16, help="sequences per mini-batch (default 16)")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (default 1e-3)")
    ap.add_argument("--seed", type=int, default=1, help="init and shuffle seed (default 1)")
    ap.add_argument("--text-dir", default=os.environ.get("XPIPE_TEXT_DIR") or DEFAULT_TEXT_DIR,
                    help="the fortune files (default $XPIPE_TEXT_DIR or " + DEFAULT_TEXT_DIR + ")")
    t = ap.add_argument_group("--mode time")
    t.add_argument("--steps", type=int, default=20, help="timed steps (default 20; random bytes "
                   "unless --text-dir exists)")
    t.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    t.add_argument("--no-cuda-graph", action="store_true",
                   help="on --device cuda, skip timing the step as a CUDA graph")
    r = ap.add_argument_group("--mode train")
    r.add_argument("--epochs", type=int, default=3, help="default 3")
    r.add_argument("--train-tokens", type=int, default=0,
                   help="train on the first N // T training sequences each epoch (0: all)")
    r.add_argument("--val-tokens", type=int, default=0,
                   help="validate on the first N // T validation sequences (0: all, the default)")
    r.add_argument("--eval-batch", type=int, default=64, help="sequences per validation batch")
    args = ap.parse_args()
    if min(args.dim, args.context, args.heads, args.threads, args.batch, args.steps, args.epochs,
           args.eval_batch) < 1 or min(args.warmup, args.train_tokens, args.val_tokens) < 0:
        ap.error("sizes, --threads, --batch, --steps, --epochs and --eval-batch must be positive; "
                 "--warmup, --train-tokens and --val-tokens not negative")
    if args.dim % args.heads:
        ap.error(f"--heads {args.heads} does not divide --dim {args.dim}")
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: torch sees no CUDA device")

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if device.type == "cuda":  # fp32 throughout, as xpipe's kernels: no TF32 in matmuls or convs
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        if hasattr(torch, "set_float32_matmul_precision"):
            torch.set_float32_matmul_precision("highest")
    model = Gpt(args.dim, args.context, args.heads)
    init_like_xpipe(model, args.seed)  # on the CPU: one init on every device
    params = parameter_counts(model)
    sizes = xpipe_layer_sizes(args.dim, args.context)
    assert params == (sum(sizes), padded(sizes)), \
        f"{params} != xpipe's {(sum(sizes), padded(sizes))}"
    if (args.dim, args.context) == (64, 128):
        assert params == XPIPE_PARAMS_64_128, f"{params} != Gpt<64, 4, 128>'s {XPIPE_PARAMS_64_128}"
    model.to(device)
    # torch's Adam defaults are xpipe's: betas (0.9, 0.999), eps 1e-8, no weight decay.
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    (run_time if args.mode == "time" else run_train)(args, model, opt, params, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
