"""What an eager framework's host pays per kernel: a Megatron-style GPT layer run by PyTorch on tensors so
small that the work is nothing and what is timed is the framework (Python, the dispatcher, autograd).

    python benchmarks/host_overhead.py [--layers 4 --repeats 60]
    python benchmarks/host_overhead.py --smoke

The layer is Megatron-LM's GPT layer as Megatron-DeepSpeed runs it [Megatron21 §3]: layer norm, the QKV
projection, unfused attention (batched QK^T, masked softmax, dropout, the product with V and a copy back to
the sequence-first layout), the output projection with its bias-dropout-add, layer norm, the MLP with
bias-GeLU and its bias-dropout-add; forward and backward, and again with the forward recomputed in the
backward (activation checkpointing, full recompute). A dispatch mode counts the operators that launch a
kernel (views and allocations launch none). The figure to compare with a profile's ``kernels.launch_s``
is the host time per layer over the step model's launch count for that layer (``LAYER_KERNELS``): both
count the same layer, so their ratio is the host time per counted kernel. On a GPU each operator also
pays its CUDA launch (a few µs [CUDA-Graphs]), while here the CPU runs the operator's tiny work instead,
and a framework adds its own Python (module hooks, the parallel regions, gradient accumulation): the
figure is a floor for an eager framework on this host, not a measurement of any one framework.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

from costmodel.training.step import LAYER_KERNELS

# Operators that launch no kernel: views, reshapes, allocations, metadata.
NO_KERNEL = {
    "view", "_unsafe_view", "expand", "permute", "transpose", "t", "split", "split_with_sizes", "slice",
    "select", "unsqueeze", "squeeze", "alias", "detach", "as_strided", "unbind", "_reshape_alias",
    "reshape", "empty", "empty_like", "new_empty", "empty_strided", "lift_fresh", "is_same_size",
    "_has_compatible_shallow_copy_type",
}  # fmt: skip


class Launches(TorchDispatchMode):
    """Counts the operators that reach a kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        if func.__name__.split(".")[0] not in NO_KERNEL:
            self.count += 1
        return func(*args, **(kwargs or {}))


class GPTLayer(nn.Module):
    """Megatron's GPT layer, sequence-first, unfused attention, biases added outside the multiplies."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.dense = nn.Linear(hidden, hidden, bias=False)
        self.fc1 = nn.Linear(hidden, 4 * hidden, bias=False)
        self.fc2 = nn.Linear(4 * hidden, hidden, bias=False)
        self.dense_bias, self.fc2_bias = nn.Parameter(torch.zeros(hidden)), nn.Parameter(torch.zeros(hidden))
        self.fc1_bias = nn.Parameter(torch.zeros(4 * hidden))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        seq, batch, hidden = x.shape
        d = hidden // self.heads
        q, k, v = self.qkv(self.norm1(x)).view(seq, batch * self.heads, 3 * d).split(d, dim=-1)
        scores = torch.baddbmm(
            torch.empty(batch * self.heads, seq, seq),
            q.transpose(0, 1),
            k.permute(1, 2, 0),
            beta=0.0,
            alpha=d**-0.5,
        )
        probs = F.dropout(F.softmax(scores.masked_fill(mask, -10000.0), dim=-1), 0.1, True)
        context = torch.bmm(probs, v.transpose(0, 1)).transpose(0, 1).contiguous().view(seq, batch, hidden)
        x = x + F.dropout(self.dense(context) + self.dense_bias, 0.1, True)
        y = F.gelu(self.fc1(self.norm2(x)) + self.fc1_bias)
        return x + F.dropout(self.fc2(y) + self.fc2_bias, 0.1, True)


def step(layers: nn.ModuleList, mask: torch.Tensor, recompute: bool) -> None:
    x = torch.randn(mask.shape[0], 1, layers[0].qkv.in_features, requires_grad=True)
    for layer in layers:
        x = checkpoint(layer, x, mask, use_reentrant=True) if recompute else layer(x, mask)
    x.sum().backward()


def measure(layers: nn.ModuleList, mask: torch.Tensor, recompute: bool, repeats: int) -> tuple[float, float]:
    """(kernels per layer, host seconds per layer): the lower quartile of whole fwd+bwd steps."""
    with Launches() as launches:
        step(layers, mask, recompute)
    for _ in range(max(3, repeats // 5)):
        step(layers, mask, recompute)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step(layers, mask, recompute)
        times.append(time.perf_counter() - start)
    return launches.count / len(layers), statistics.quantiles(times, n=4)[0] / len(layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--smoke", action="store_true", help="one layer, a few repeats")
    args = parser.parse_args()
    layers_n, repeats = (1, 4) if args.smoke else (args.layers, args.repeats)
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one host thread issues a rank's kernels
    hidden, heads, seq = 64, 4, 8
    layers = nn.ModuleList([GPTLayer(hidden, heads) for _ in range(layers_n)])
    mask = torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1)
    forward, backward = LAYER_KERNELS["unfused"]
    print(f"eager PyTorch {torch.__version__}, GPT layer of hidden {hidden}, {seq} tokens: host time only")
    for recompute in (False, True):
        ops, seconds = measure(layers, mask, recompute, repeats)
        counted = forward * (2 if recompute else 1) + backward
        print(
            f"  {'full recompute' if recompute else 'no recompute  '}: {ops:.0f} operators a layer, "
            f"{seconds * 1e6:.0f} us a layer, {seconds / ops * 1e6:.1f} us an operator; "
            f"the step model counts {counted} kernels: {seconds / counted * 1e6:.1f} us a counted kernel"
        )


if __name__ == "__main__":
    main()
