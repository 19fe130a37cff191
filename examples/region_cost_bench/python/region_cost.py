"""The per-region cost of PyTorch's own checkpointing, measured as region_cost_bench measures
recompose's: the same body (Linear(4, 4) + tanh on a [4, 4] tensor), a chain of --regions blocks
forward and backward, variants in alternation, process CPU time, medians over --reps.

  time         the variant's step time / regions
  overhead     variant minus plain, paired within each repetition
  bookkeeping  overhead minus the overhead of "rerun body in backward" (the body run again from
               a tensor hook during backward: what a recomputation costs by itself)

  $(bash scripts/setup-python-peer.sh | tail -n1) examples/region_cost_bench/python/region_cost.py
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
from torch.distributed._composable import checkpoint as composable_checkpoint
from torch.utils.checkpoint import checkpoint


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.tanh(self.lin(x))


def make_chain(n):
    torch.manual_seed(0)
    return [Tiny() for _ in range(n)]


def rerun_call(block, x):
    y = block(x)

    def rerun(_grad):
        with torch.enable_grad():
            block.forward(x)

    y.register_hook(rerun)
    return y


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--regions", type=int, default=100)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--reps", type=int, default=15)
    a = p.parse_args()
    torch.set_num_threads(1)

    variants = [
        ("plain", make_chain(a.regions), lambda b, x: b(x)),
        ("rerun body in backward", make_chain(a.regions), rerun_call),
        ("checkpoint(fn, x), non-reentrant", make_chain(a.regions),
         lambda b, x: checkpoint(b, x, use_reentrant=False)),
        ("composable checkpoint(module)", [composable_checkpoint(m) for m in make_chain(a.regions)],
         lambda b, x: b(x)),
    ]
    x = torch.randn(4, 4)

    def sample(chain, call, steps):
        t0 = time.process_time()
        for _ in range(steps):
            y = x
            for b in chain:
                y = call(b, y)
            y.sum().backward()
        return time.process_time() - t0

    seconds = {name: [] for name, _, _ in variants}
    for name, chain, call in variants:
        sample(chain, call, 2)  # warm-up
    for _ in range(a.reps):
        for name, chain, call in variants:
            seconds[name].append(sample(chain, call, a.steps))

    per = 1e6 / (a.steps * a.regions)
    plain, rerun = seconds["plain"], seconds["rerun body in backward"]
    print(f"PyTorch {torch.__version__} region cost: body Linear(4,4)+tanh on [4,4], {a.regions} regions x "
          f"{a.steps} steps per sample, {a.reps} alternating reps, 1 thread, process CPU time, medians (us per region)")
    print(f"{'variant':36s} {'time':>10s} {'overhead':>10s} {'bookkeeping':>12s}")
    for name, _, _ in variants:
        t = statistics.median(seconds[name]) * per
        if name == "plain":
            print(f"{name:36s} {t:10.2f}")
            continue
        over = statistics.median([(v - p) * per for v, p in zip(seconds[name], plain)])
        book = "-" if name.startswith("rerun") else \
            f"{statistics.median([(v - r) * per for v, r in zip(seconds[name], rerun)]):.2f}"
        print(f"{name:36s} {t:10.2f} {over:10.2f} {book:>12s}")


if __name__ == "__main__":
    main()
