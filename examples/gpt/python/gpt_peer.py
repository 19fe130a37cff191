"""The GPT example trained by PyTorch in Python: the Python peer of examples/gpt.

Same model (model.cpp, module for module and op for op), same weights and CPU generator state
(written by `gpt --save-initial-state FILE`), same batches (data.cpp's sampling, replayed with
the same generator), same learning-rate schedule, AdamW and gradient clipping (train.cpp). With
`--check-losses loss.csv` (the C++ run's CSV) it prints how many steps' losses agree to 9
significant digits (the first ones: same model, weights, batches and dropout masks) and the
largest relative difference, and fails above 1e-3: LibTorch's AdamW and clip_grad_norm_ are
other implementations than torch.optim.AdamW and torch.nn.utils.clip_grad_norm_ (torch.optim
updates the first moment with lerp_, for one), so the last float32 bits differ after a few steps
and the difference grows with training.

Policies: none; full (torch.utils.checkpoint, non-reentrant, per block); composable (the
hook-based torch.distributed._composable.checkpoint on every block, as recompose::apply_checkpoint);
selective (the same save list as recompose::transformer_policy, through
create_selective_checkpoint_contexts); every-second-mm (that list with every second aten::mm of a
block recomputed, as TransformerPolicyOptions::recompute_every_second_mm); save-on-cpu
(torch.autograd.graph.save_on_cpu(pin_memory=True) around the forward: every saved tensor to
pinned host memory); torchtune-offload (torchtune's OffloadActivations, when torchtune is
importable).

--compile-budgets 1.0,0.75,0.5,0.3,0.0 is another mode (issue 27's comparison with the planner): the
same GPT and training step under torch.compile, once per value of
torch._functorch.config.activation_memory_budget (the min-cut partitioner recomputes activations
until the saved ones fit that fraction of what it would save at 1.0), each from the same weights and
batches. Per budget: the mean step time (without the first --compile-warmup steps, which compile)
and, on CUDA, the step's peak memory above weights and optimizer state; both also as ratios to the
compiled step at budget 1.0 (its own no-checkpointing step: torch.compile's default; run first even
when the list lacks it). On CPU there is no allocator peak to read: peak reads n/a. Each budget's
line (printed as it ends, so a run stopped by a timeout keeps the budgets it finished) also gives
the median step and the seconds the first steps took to compile. With --device cuda it exits at
once, saying why, where Triton is not importable or torch sees no CUDA device.

    python gpt_peer.py --compile-budgets 1.0,0.75,0.5,0.3,0.0 --device cuda --bf16 --steps 12

On a GPU (--device cuda, with --bf16 for CUDA autocast to bfloat16, as the C++ example's flag) the
summary line also gives the step's peak CUDA memory above the weights and optimizer state, measured
as the C++ example does (after zero_grad: reset the peak, read what is allocated, run the step).
Without --state the weights are the example's initialisation drawn from --seed (for timings, not
for comparing losses).

    python gpt_peer.py --state init.pt --policy full --steps 20 --threads 1 --check-losses loss.csv

Prints one line per step (loss to 9 digits) and a summary line:
    python <policy>: ... mean step <ms> ms (CPU <ms> ms; ...), <faults> page faults per step ...
    ...; median step <ms> ms
"""

import argparse
import contextlib
import functools
import math
import resource
import sys
import time
from pathlib import Path

import torch
import torch.jit._pickle  # restore_type_tag, for torch.load of torch::pickle_save's output
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

DEFAULT_DATA = Path(__file__).resolve().parent.parent / "data" / "alice.txt"


# ---- the model (model.cpp) ----

class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.resid_dropout = nn.Dropout(dropout)
        self.heads = heads
        self.attn_dropout = dropout

    def forward(self, x):
        batch, time_, width = x.shape
        q, k, v = self.qkv(x).view(batch, time_, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                           dropout_p=self.attn_dropout if self.training else 0.0, is_causal=True)
        y = y.transpose(1, 2).reshape(batch, time_, width)
        return self.resid_dropout(self.proj(y))


class MLP(nn.Module):
    def __init__(self, width, dropout):
        super().__init__()
        self.fc = nn.Linear(width, 4 * width)
        self.proj = nn.Linear(4 * width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, width, heads, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, dropout)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = MLP(width, dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers, width, heads, dropout):
        super().__init__()
        self.token_embedding = nn.Embedding(vocab, width)
        self.position_embedding = nn.Embedding(context, width)
        self.embedding_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout) for _ in range(layers))
        self.ln_final = nn.LayerNorm(width)
        self.run_block = lambda block, x: block(x)  # replaced by the checkpointing policy

    def forward(self, tokens):
        positions = torch.arange(tokens.size(1), dtype=tokens.dtype, device=tokens.device)
        x = self.embedding_dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = self.run_block(block, x)
        return F.linear(self.ln_final(x), self.token_embedding.weight)  # tied head


# ---- policies (policies.cpp) ----

def transformer_save_list():
    """recompose::transformer_policy's kSaveList (torchtitan's _save_list), the overloads this build has."""
    names = [("aten", "mm"), ("aten", "addmm"), ("aten", "bmm"), ("aten", "linear"), ("aten", "_scaled_mm"),
             ("aten", "_scaled_dot_product_flash_attention"), ("aten", "_scaled_dot_product_efficient_attention"),
             ("aten", "_scaled_dot_product_cudnn_attention"), ("aten", "_scaled_dot_product_flash_attention_for_cpu"),
             ("aten", "max"), ("_c10d_functional", "reduce_scatter_tensor")]
    ops = set()
    for namespace, name in names:
        packet = getattr(getattr(torch.ops, namespace), name, None)
        if packet is not None and hasattr(packet, "default"):
            ops.add(packet.default)
    return ops


def every_second_mm_contexts(save):
    """A fresh policy per region invocation: aten::mm calls 0, 2, 4... of the forward are saved,
    1, 3, 5... recomputed (recompose counts the calls of an op per invocation; so does torchtitan)."""
    counts = {"forward": 0, "recompute": 0}
    mm = torch.ops.aten.mm.default

    def policy_fn(ctx, op, *args, **kwargs):
        if op == mm:
            mode = "recompute" if ctx.is_recompute else "forward"
            index = counts[mode]
            counts[mode] += 1
            return CheckpointPolicy.MUST_SAVE if index % 2 == 0 else CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy_fn)


def apply_policy(model, policy):
    """Returns a context manager factory wrapped around each forward (save-on-cpu, torchtune)."""
    if policy == "none":
        return None
    if policy == "full":
        model.run_block = lambda block, x: checkpoint(block, x, use_reentrant=False)
        return None
    if policy == "composable":
        from torch.distributed._composable import checkpoint as composable_checkpoint
        for block in model.blocks:
            composable_checkpoint(block)
        return None
    if policy == "save-on-cpu":
        return lambda: torch.autograd.graph.save_on_cpu(pin_memory=True)
    if policy == "torchtune-offload":
        from torchtune.training import OffloadActivations  # ImportError: not installed
        return lambda: OffloadActivations()
    save = transformer_save_list()
    if policy == "every-second-mm":
        context_fn = functools.partial(every_second_mm_contexts, save)
    else:
        def policy_fn(ctx, op, *args, **kwargs):
            return CheckpointPolicy.MUST_SAVE if op in save else CheckpointPolicy.PREFER_RECOMPUTE

        context_fn = functools.partial(create_selective_checkpoint_contexts, policy_fn)
    model.run_block = lambda block, x: checkpoint(block, x, use_reentrant=False, context_fn=context_fn)
    return None


def init_weights(model, layers):
    """model.cpp's GPT-2 initialisation (for runs without --state)."""
    resid_std = 0.02 / math.sqrt(2.0 * layers)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.zero_()
            elif ".ln" in name or name.startswith("ln_final"):
                p.fill_(1.0)
            elif name.endswith("proj.weight"):
                p.normal_(0.0, resid_std)
            else:
                p.normal_(0.0, 0.02)


# ---- data (data.cpp) ----

class CharDataset:
    def __init__(self, path, context, validation_fraction=0.1):
        text = Path(path).read_bytes()
        alphabet = sorted(set(text))
        index = {c: i for i, c in enumerate(alphabet)}
        all_ids = torch.tensor([index[c] for c in text], dtype=torch.long)
        n_validation = int(len(text) * validation_fraction)
        self.train = all_ids[: len(text) - n_validation]
        self.vocab_size = len(alphabet)
        self.context = context

    def batch(self, batch, generator):
        starts = torch.randint(self.train.numel() - self.context - 1, (batch, 1), generator=generator, dtype=torch.long)
        index = starts + torch.arange(self.context + 1, dtype=torch.long)
        windows = self.train[index]
        return windows[:, : self.context], windows[:, 1:]


# ---- training (train.cpp) ----

def learning_rate(peak, step, steps):
    warmup = max(steps // 10, 1)
    if step <= warmup:
        return peak * step / warmup
    progress = (step - warmup) / max(steps - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(3.141592653589793 * progress)))


def begin_step(a, step, optimizer, data, batches, cuda):
    """What every step does before its forward: the learning rate, the batch, cleared gradients and,
    on CUDA, a fresh peak. Returns (inputs, targets, bytes allocated at rest or None)."""
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(a.lr, step, a.steps)
    inputs, targets = data.batch(a.batch, batches)
    inputs, targets = inputs.to(a.device), targets.to(a.device)
    optimizer.zero_grad()
    if not cuda:
        return inputs, targets, None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    return inputs, targets, torch.cuda.memory_allocated()


def end_step(model, optimizer, loss, cuda):
    """What every step does after its backward: clipped gradients, the optimizer's step, the loss
    read back (which waits for the step) and, on CUDA, the device drained. Returns the loss."""
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    value = loss.item()
    if cuda:
        torch.cuda.synchronize()
    return value


def median(values):
    v = sorted(values)
    return (v[(len(v) - 1) // 2] + v[len(v) // 2]) / 2 if v else float("nan")


# ---- torch.compile under activation_memory_budget (issue 27) ----

def compiled_run(a, data, budget, make_model, cuda):
    """One fresh compiled model at `budget`: [(step seconds, step peak bytes or None)] per step."""
    import torch._dynamo
    import torch._functorch.config as functorch_config

    torch._dynamo.reset()  # recompile: the budget is read when the graph is partitioned
    functorch_config.activation_memory_budget = budget
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.01, fused=cuda)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if a.bf16 else contextlib.nullcontext

    @torch.compile
    def loss_of(inputs, targets):
        with autocast():
            logits = model(inputs)
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    batches = torch.Generator().manual_seed(a.seed)
    out = []
    for step in range(1, a.steps + 1):
        inputs, targets, resting = begin_step(a, step, optimizer, data, batches, cuda)
        t0 = time.perf_counter()
        loss = loss_of(inputs, targets)
        loss.backward()
        value = end_step(model, optimizer, loss, cuda)
        out.append((time.perf_counter() - t0, torch.cuda.max_memory_allocated() - resting if cuda else None))
        if not a.quiet:
            print(f"budget {budget:.2f} step {step:4d}  loss {value:.9g}  {out[-1][0] * 1e3:.1f} ms")
    return out


def compile_unavailable(cuda):
    """Why torch.compile's CUDA path cannot run here (None when it can): Inductor generates
    Triton kernels for CUDA, so it needs a CUDA device and an importable Triton."""
    import importlib.util
    reasons = []
    if not cuda or not torch.cuda.is_available():
        reasons.append("no CUDA device (torch.cuda.is_available() is False or --device cpu)")
    if importlib.util.find_spec("triton") is None:
        reasons.append("Triton is not importable")
    return "; ".join(reasons) or None


def compile_budgets(a, data, make_model, cuda):
    if cuda and (reason := compile_unavailable(cuda)):
        sys.exit(f"gpt_peer: torch.compile cannot run here: {reason}")
    budgets = [float(b) for b in a.compile_budgets.split(",") if b.strip()]
    if not budgets or any(not 0.0 <= b <= 1.0 for b in budgets):
        sys.exit("gpt_peer: --compile-budgets takes fractions in [0, 1], e.g. 1.0,0.75,0.5,0.3,0.0")
    if a.steps <= a.compile_warmup:
        sys.exit(f"gpt_peer: --steps must exceed --compile-warmup ({a.compile_warmup}): the first steps compile")
    if 1.0 not in budgets:
        budgets.insert(0, 1.0)  # the reference: torch.compile's own step without recomputation
    rows = {}
    for budget in budgets:
        t0 = time.perf_counter()
        run = compiled_run(a, data, budget, make_model, cuda)
        steps = run[a.compile_warmup:]
        ms = 1e3 * sum(s for s, _ in steps) / len(steps)
        peak = max(p for _, p in steps) / 2**20 if cuda else None
        rows[budget] = (ms, peak)
        warmup = sum(s for s, _ in run[:a.compile_warmup])
        print(f"python compile budget {budget:.2f}: mean step {ms:.2f} ms"
              + (f"; step peak {peak:.1f} MiB (CUDA)" if cuda else "; step peak n/a (CPU)")
              + f"; median step {1e3 * median([s for s, _ in steps]):.2f} ms; first {a.compile_warmup} steps "
              f"(compiling) {warmup:.1f} s, {time.perf_counter() - t0:.1f} s in all", flush=True)
    ref_ms, ref_peak = rows[1.0]
    print(f"\ntorch.compile with torch._functorch.config.activation_memory_budget: layers {a.layers}, width {a.width}, "
          f"heads {a.heads}, context {a.context}, batch {a.batch}, {a.device}{' bf16 autocast' if a.bf16 else ''}, "
          f"{a.steps} steps per budget (mean without the first {a.compile_warmup}); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print(f"{'budget':>8} {'step ms':>9} {'peak MiB':>10} {'time x':>7} {'peak x':>7}")
    for budget, (ms, peak) in rows.items():
        peak_text = f"{peak:10.1f}" if peak is not None else f"{'n/a':>10}"
        peak_ratio = f"{peak / ref_peak:7.3f}" if peak is not None and ref_peak else f"{'n/a':>7}"
        print(f"{budget:8.2f} {ms:9.2f} {peak_text} {ms / ref_ms:7.3f} {peak_ratio}")
    print("time x / peak x: against the compiled step at budget 1.00 (torch.compile's default). peak MiB: the "
          "step's peak CUDA memory above weights and optimizer state (max allocated minus allocated at rest).")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", help="file written by gpt --save-initial-state (default: fresh weights from --seed)")
    ap.add_argument("--policy", default="none",
                    choices=["none", "full", "composable", "selective", "every-second-mm", "save-on-cpu",
                             "torchtune-offload"])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--bf16", action="store_true", help="forward under CUDA autocast to bfloat16")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--dropout", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--check-losses", help="the C++ run's loss.csv: fail unless every loss agrees to 9 digits")
    ap.add_argument("--quiet", action="store_true", help="only the summary line")
    ap.add_argument("--compile-budgets", metavar="LIST",
                    help="torch.compile mode: the step at each activation_memory_budget of LIST (e.g. 1.0,0.75,0.5,0.3,0.0)")
    ap.add_argument("--compile-warmup", type=int, default=2, help="steps left out of the compiled means (they compile)")
    a = ap.parse_args()

    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.bf16 and a.device != "cuda":
        sys.exit("gpt_peer: --bf16 needs --device cuda")
    cuda = a.device == "cuda"
    data = CharDataset(a.data, a.context)
    state = None
    if a.state:
        # torch::pickle_save tags the dict's types: allow that one helper, nothing else.
        with torch.serialization.safe_globals([torch.jit._pickle.restore_type_tag]):
            state = torch.load(a.state, weights_only=True)

    def make_model():
        torch.manual_seed(a.seed)
        model = GPT(data.vocab_size, a.context, a.layers, a.width, a.heads, a.dropout)
        params = dict(model.named_parameters())
        if state is not None:
            loaded = {k[len("param."):]: v for k, v in state.items() if k.startswith("param.")}
            if set(loaded) != set(params):
                sys.exit(f"gpt_peer: parameter names differ from the C++ model's: {sorted(set(loaded) ^ set(params))}")
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(loaded[name])
        else:
            init_weights(model, a.layers)
        model.to(a.device)
        model.train()
        if state is not None:
            torch.set_rng_state(state["cpu_rng_state"])  # dropout continues where the C++ model's construction left it
        return model

    if a.compile_budgets:
        if a.policy != "none":
            sys.exit("gpt_peer: --compile-budgets runs without a checkpointing policy (the budget is the partitioner's)")
        compile_budgets(a, data, make_model, cuda)
        return
    model = make_model()
    around_forward = apply_policy(model, a.policy)
    # fused on CUDA, as the C++ example (fused_adamw.h); LibTorch's and torch.optim's loops on CPU.
    optimizer = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.99), weight_decay=0.01, fused=cuda)
    batches = torch.Generator().manual_seed(a.seed)
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if a.bf16 else contextlib.nullcontext
    around = around_forward or contextlib.nullcontext

    losses, seconds, cpu, faults, peaks = [], [], [], [], []
    for step in range(1, a.steps + 1):
        inputs, targets, resting = begin_step(a, step, optimizer, data, batches, cuda)
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        t0, c0 = time.perf_counter(), time.process_time()
        with around():
            with autocast():
                logits = model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
            loss.backward()
        value = end_step(model, optimizer, loss, cuda)
        if cuda:
            peaks.append(torch.cuda.max_memory_allocated() - resting)
        seconds.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
        losses.append(value)
        if not a.quiet:
            print(f"step {step:4d}  loss {value:.9g}  {seconds[-1] * 1e3:.1f} ms  {faults[-1]} page faults")

    rest = slice(1, None) if len(seconds) > 1 else slice(None)
    mean_ms = 1e3 * sum(seconds[rest]) / len(seconds[rest])
    mean_cpu_ms = 1e3 * sum(cpu[rest]) / len(cpu[rest])
    mean_faults = sum(faults[rest]) / len(faults[rest])
    peak = f"; step peak {max(peaks[rest]) / 2**20:.1f} MiB (CUDA)" if cuda else ""
    print(f"python {a.policy}: loss {losses[-1]:.9g} after {a.steps} steps; mean step {mean_ms:.2f} ms "
          f"(CPU {mean_cpu_ms:.2f} ms; without the first step), {mean_faults:.0f} page faults per step; torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads{peak}; median step {1e3 * median(seconds[rest]):.2f} ms")

    if a.check_losses:
        cpp = {}
        for line in Path(a.check_losses).read_text().splitlines()[1:]:
            fields = line.split(",")
            cpp[int(fields[1])] = float(fields[2])
        worst, equal, leading = 0.0, 0, None
        for s, l in enumerate(losses, 1):
            if s not in cpp:
                sys.exit(f"gpt_peer: step {s} is missing from {a.check_losses}")
            same = float(f"{l:.9g}") == cpp[s]
            equal += same
            if not same and leading is None:
                leading = s - 1
            worst = max(worst, abs(l - cpp[s]) / abs(cpp[s]))
        leading = len(losses) if leading is None else leading
        print(f"losses against the C++ run's: the first {leading} steps equal to 9 digits, {equal} of "
              f"{len(losses)} in all; largest relative difference {worst:.1e}")
        if worst > 1e-3:
            sys.exit(f"gpt_peer: losses differ from {a.check_losses} by more than 1e-3 (relative)")

if __name__ == "__main__":
    main()
