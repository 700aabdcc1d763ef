"""Train a small MLP on scikit-learn's handwritten digits (1,797 real 8x8 images, bundled with
scikit-learn: no download) with PyTorch on the CPU, under TraceML.

    traceml run examples/train_digits.py --epochs 3
    traceml run --nproc-per-node 2 examples/train_digits.py --epochs 3     # two ranks, gloo, DDP

Each training step is wrapped in ``traceml_ai.trace_step(model)``: TraceML then times the
dataloader wait, forward, backward and optimizer step of every step on every rank. The script
also logs its metrics with ``traceml_ai.Run`` (rank 0), so the run folder has both the script's
metrics and TraceML's telemetry.

``--plant`` plants a known bottleneck, to check that TraceML's diagnosis names it:

- ``input_stall``: the data set sleeps in ``__getitem__`` (a slow disk or decoder);
- ``straggler``: rank 1 computes slower than the others (a throttled or shared machine);
- ``memory_creep``: every step keeps a tensor alive in a growing list (a classic leak);
- ``optimizer_heavy``: an optimizer whose step costs far more than the model's forward/backward;
- ``h2d_bound``: every step also copies a 64 MB tensor from pageable host memory to the device (an
  oversized input); with ``--device cuda`` only (on the CPU there is no copy, and nothing to find);
- ``low_gpu_util``: every step also waits 20 ms on host-side work while the GPU has nothing to do
  (with ``--device cuda``; on the CPU it is a slower step);
- ``none`` (default): a healthy run.

``--device cuda`` trains on the GPU (the batches are moved there inside the step, so TraceML times
the copies as ``traceml:h2d``); ``--workers N`` loads batches in N worker processes.
``benchmarks/gpu_check.py`` runs these on a GPU machine and prints what TraceML measured.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import traceml_ai

PLANTS = ("none", "input_stall", "straggler", "memory_creep", "optimizer_heavy", "h2d_bound", "low_gpu_util")


class Digits(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """The digits images as float tensors scaled to [0, 1], with an optional per-item delay."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, delay_s: float = 0.0) -> None:
        self.images, self.labels, self.delay_s = images, labels, delay_s

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.delay_s:
            time.sleep(self.delay_s)  # planted: a slow data source
        return self.images[i], self.labels[i]


class SlowOnOneRank(nn.Module):
    """Wraps the model; on the straggler rank every forward pass takes ``delay_s`` longer."""

    def __init__(self, inner: nn.Module, delay_s: float) -> None:
        super().__init__()
        self.inner, self.delay_s = inner, delay_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.delay_s:
            time.sleep(self.delay_s)  # planted: this rank is slower
        out: torch.Tensor = self.inner(x)
        return out


class OrthogonalisingSGD(torch.optim.Optimizer):
    """SGD with momentum whose update of each weight matrix is orthogonalised by Newton–Schulz
    iterations (the idea behind optimizers such as Muon): an optimizer step that costs much more
    than the forward and backward passes of this small model."""

    def __init__(self, params: list[torch.nn.Parameter], lr: float = 0.02, momentum: float = 0.9,
                 iterations: int = 60) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum})
        self.iterations = iterations

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                buf = self.state[p].setdefault("momentum", torch.zeros_like(p))
                buf.mul_(group["momentum"]).add_(p.grad)
                update = buf
                if p.ndim == 2:
                    x = buf / (buf.norm() + 1e-7)
                    for _ in range(self.iterations):
                        x = 1.5 * x - 0.5 * x @ x.T @ x
                    update = x * max(1.0, (p.shape[0] / p.shape[1]) ** 0.5)
                p.add_(update, alpha=-group["lr"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=None,
                    help="width of the two hidden layers (default 1024; 128 with --plant optimizer_heavy)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--plant", choices=PLANTS, default="none")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--workers", type=int, default=0, help="DataLoader worker processes (default 0)")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        ap.error("--device cuda: this machine has no CUDA device")
    if args.device == "cpu" and args.plant in ("h2d_bound", "low_gpu_util"):
        # (review 11f: planted nothing without a word)
        print(f"note: --plant {args.plant} needs --device cuda to plant a GPU bottleneck; on the CPU "
              + ("there is no copy to the device: nothing is planted" if args.plant == "h2d_bound"
                 else "it only makes every step 20 ms slower"), file=sys.stderr)
    if args.hidden is None:
        # Wide enough that a healthy step's compute dwarfs its batch fetch (data loading a few percent
        # of the step, as in real pipelines); the optimizer plant keeps a small model, whose update
        # then costs far more than its forward and backward.
        args.hidden = 128 if args.plant == "optimizer_heavy" else 1024

    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world_size > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # several ranks share this machine's cores

    digits = load_digits()
    images = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    labels = torch.tensor(digits.target, dtype=torch.long)
    split = int(0.8 * len(labels))
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))
    train_idx, val_idx = order[:split], order[split:]
    train_set = Digits(images[train_idx], labels[train_idx], delay_s=0.003 if args.plant == "input_stall" else 0.0)
    sampler: DistributedSampler[tuple[torch.Tensor, torch.Tensor]] | None = None
    if world_size > 1:
        sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=args.seed)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler,
                        num_workers=args.workers, persistent_workers=args.workers > 0,
                        pin_memory=args.device == "cuda")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    # planted: an oversized input in pageable memory, copied to the device every step
    side_input = torch.ones(16 * 2**20) if args.plant == "h2d_bound" and device.type == "cuda" else None

    model: nn.Module = nn.Sequential(
        nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 10),
    )
    model = model.to(device)
    if args.plant == "straggler" and rank == 1:
        model = SlowOnOneRank(model, delay_s=0.03)
    if world_size > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer: torch.optim.Optimizer
    if args.plant == "optimizer_heavy":
        optimizer = OrthogonalisingSGD(list(model.parameters()), lr=args.lr)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    kept: list[torch.Tensor] = []  # only used by the memory_creep plant

    # Rank 0 logs the metrics; under `traceml run` the logger writes into the launched run's folder.
    with traceml_ai.Run(name="digits", params=vars(args), best={"val/acc": "max"}) if rank == 0 \
            else contextlib.nullcontext() as run:
        step = 0
        for epoch in range(args.epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            model.train()
            total, seen = 0.0, 0
            for x, y in loader:
                with traceml_ai.trace_step(model):
                    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                    if side_input is not None:
                        side_input.to(device)  # planted: a blocking copy from pageable memory
                    optimizer.zero_grad()
                    loss = loss_fn(model(x), y)
                    loss.backward()
                    optimizer.step()
                    if args.plant == "low_gpu_util":
                        loss.item()  # the GPU's work is done ...
                        time.sleep(0.02)  # planted: ... and it idles while the host works
                if args.plant == "memory_creep":
                    kept.append(torch.ones(512, 1024, device=device))  # planted leak: 2 MB kept every step
                total += loss.item() * len(y)
                seen += len(y)
                step += 1
            model.eval()
            with torch.no_grad():
                val_x, val_y = images[val_idx].to(device), labels[val_idx].to(device)
                logits = model(val_x)
                val_loss = float(loss_fn(logits, val_y))
                val_acc = float((logits.argmax(1) == val_y).float().mean())
            if run is not None:
                print(f"epoch {epoch}: train/loss {total / seen:.4f} val/loss {val_loss:.4f} val/acc {val_acc:.4f}")
                run.log(epoch, {"train/loss": total / seen, "val/loss": val_loss, "val/acc": val_acc})
        if run is not None:
            run.summary["steps"] = step
    if world_size > 1:
        dist.destroy_process_group()

if __name__ == "__main__":
    main()
