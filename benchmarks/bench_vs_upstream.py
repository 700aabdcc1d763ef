"""Capture overhead side by side with upstream traceml-ai 0.5.0, printed (never asserted).

    .venv/bin/python benchmarks/bench_vs_upstream.py [--rounds 5] [--steps 300] [--sizes tiny,b256,b1024]

Upstream is installed in its own virtualenv, outside this project's environment
(``~/.cache/traceml-bench/upstream-0.5.0``, made once with ``pip install traceml-ai==0.5.0``; its
import name is ``traceml_ai`` too, so it can never share our environment). That virtualenv sees
torch through a ``.pth`` line naming the directory of the torch this project uses, so every arm runs
the same torch build. When the virtualenv cannot be made (no network, no pip cache), the benchmark
says so in one line and exits 0.

The same training script runs in three arms, in interleaved rounds (every round runs each arm once,
in a fresh order), so that all three see the same machine state:

- ``plain``: ``python train.py`` with ``trace_step`` replaced by a null context;
- ``upstream``: ``traceml run train.py`` of upstream 0.5.0 (its ``traceml_ai.trace_step``);
- ``traceml``: ``traceml run --mode quiet train.py`` of this project.

The script trains an MLP on random data (a DataLoader over a TensorDataset, cross entropy,
backward, SGD) and prints the median *training-thread CPU time per step* (``time.thread_time_ns``,
after 30 warm-up steps): the training thread's own cost, which the time it spends preempted on a
shared machine does not disturb. The benchmark also takes the *whole-job CPU time* of each run
(user + system of the launcher and every process it waited for, ``RUSAGE_CHILDREN``), which
includes the aggregator and any other process a tool starts. Per size, the medians over rounds
and the ratios to ``plain`` are printed, with the load average.

Sizes: ``tiny`` (64-32-32-10 MLP, batch 32: a step of about a millisecond), ``b256`` and ``b1024``
(a 784-256-256-10 MLP at batch 256 and 1024: CPU steps of about 10 and 40 ms on one quiet core).
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import torch

UPSTREAM = "traceml-ai==0.5.0"
VENV = Path(os.environ.get("TRACEML_BENCH_UPSTREAM_VENV", Path.home() / ".cache" / "traceml-bench" / "upstream-0.5.0"))
ROOT = Path(__file__).resolve().parent.parent

SIZES = {"tiny": (64, 32, 32), "b256": (784, 256, 256), "b1024": (784, 256, 1024)}
"""name -> (input width, hidden width, batch size)."""

SCRIPT = textwrap.dedent('''
    import contextlib, os, statistics, time
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    if os.environ["BENCH_ARM"] == "plain":
        def trace_step(model):
            return contextlib.nullcontext()
    else:
        from traceml_ai import trace_step

    torch.set_num_threads(1)
    torch.manual_seed(0)
    width, hidden, batch, steps = (int(os.environ[k]) for k in ("BENCH_IN", "BENCH_HIDDEN", "BENCH_BATCH",
                                                                 "BENCH_STEPS"))
    model = torch.nn.Sequential(torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(batch * 16, width), torch.randint(0, 10, (batch * 16,)))
    loader = DataLoader(data, batch_size=batch, shuffle=True)
    cpu = []
    done = 0
    while done < steps:
        it = iter(loader)
        while done < steps:
            t0 = time.thread_time_ns()
            try:
                x, y = next(it)
            except StopIteration:
                break
            with trace_step(model):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
            cpu.append(time.thread_time_ns() - t0)
            done += 1
    print("BENCH_STEP_CPU_US", statistics.median(cpu[30:]) / 1e3, flush=True)
''')


def _upstream_python() -> Path | None:
    """The upstream virtualenv's python, made on first use; None (with a message) when it cannot be."""
    python = VENV / "bin" / "python"
    marker = VENV / ".traceml-bench-ready"
    if marker.exists() and python.exists():
        return python
    print(f"making the upstream virtualenv at {VENV} ({UPSTREAM}) ...", flush=True)
    try:
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True, capture_output=True,
                       timeout=300)
        subprocess.run([str(python), "-m", "pip", "install", "-q", UPSTREAM], check=True, capture_output=True,
                       text=True, timeout=900)
    except (subprocess.SubprocessError, OSError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        print(f"skipped: could not install {UPSTREAM} into {VENV}: {exc} {detail.strip()[-300:]}")
        return None
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    # The same torch in every arm: upstream's own packages come first, torch from ours after them.
    torch_dir = Path(torch.__file__).resolve().parent.parent
    (Path(site) / "traceml_bench_torch.pth").write_text(f"{torch_dir}\n")
    check = subprocess.run([str(python), "-c", "import torch, traceml_ai; print(traceml_ai.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0 or not check.stdout.strip().startswith("0.5"):
        print(f"skipped: the upstream virtualenv does not import torch and traceml_ai 0.5: {check.stderr[-300:]}")
        return None
    marker.write_text(UPSTREAM + "\n")
    return python


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(arm: str, size: str, steps: int, script: Path, work: Path, upstream: Path) -> tuple[float, float]:
    """(training-thread CPU µs per step, whole-job CPU s) of one run."""
    width, hidden, batch = SIZES[size]
    env = {**os.environ, "BENCH_ARM": arm, "BENCH_IN": str(width), "BENCH_HIDDEN": str(hidden),
           "BENCH_BATCH": str(batch), "BENCH_STEPS": str(steps), "OMP_NUM_THREADS": "1"}
    env.pop("TRACEML_RUN_DIR", None)
    logs = work / f"logs-{arm}"
    if arm == "plain":
        cmd = [sys.executable, str(script)]
    elif arm == "upstream":
        cmd = [str(upstream.parent / "traceml"), "run", str(script), "--mode", "summary", "--logs-dir", str(logs)]
    else:
        cmd = [sys.executable, "-m", "traceml_ai", "run", "--mode", "quiet", "--logs-dir", str(logs), str(script)]
    before = _children_cpu()
    proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=900)
    job_cpu = _children_cpu() - before
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("BENCH_STEP_CPU_US")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{arm} {size} failed ({proc.returncode}): {(proc.stderr or proc.stdout)[-800:]}")
    return float(lines[-1].split()[1]), job_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--sizes", default="tiny,b256,b1024")
    args = parser.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        parser.error(f"unknown size(s) {unknown}; choose from {', '.join(SIZES)}")
    upstream = _upstream_python()
    if upstream is None:
        return
    arms = ["plain", "upstream", "traceml"]
    rng = random.Random(0)
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    load0 = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="traceml-vs-upstream-") as tmp:
        work = Path(tmp)
        script = work / "train.py"
        script.write_text(SCRIPT)
        for round_ in range(args.rounds):
            for size in sizes:
                order = arms[:]
                rng.shuffle(order)
                for arm in order:
                    results.setdefault((size, arm), []).append(_run(arm, size, args.steps, script, work, upstream))
            print(f"round {round_ + 1}/{args.rounds} done (load average {os.getloadavg()[0]:.1f})", flush=True)
    load1 = os.getloadavg()[0]
    print(f"\ncapture overhead vs {UPSTREAM}, {os.cpu_count()} CPUs, torch {torch.__version__}, {args.rounds} "
          f"interleaved rounds × {args.steps} steps; load average {load0:.1f} → {load1:.1f}")
    # Besides the ratio of medians, each round's own ratio to that round's plain run: their spread
    # shows how much of a difference the machine's noise can make (a shared machine swings ±10 %).
    print(f"{'size':7} {'arm':9} {'thread CPU/step':>16} {'× plain':>8} {'per round':>15} {'job CPU':>9} "
          f"{'× plain':>8} {'per round':>15}")
    for size in sizes:
        plain = results[(size, "plain")]
        plain_step = statistics.median(s for s, _ in plain)
        plain_job = statistics.median(j for _, j in plain)
        for arm in arms:
            got = results[(size, arm)]
            step = statistics.median(s for s, _ in got)
            job = statistics.median(j for _, j in got)
            step_r = [s / p for (s, _), (p, _) in zip(got, plain, strict=False)]
            job_r = [j / p for (_, j), (_, p) in zip(got, plain, strict=False)]
            print(f"{size:7} {arm:9} {step:13.1f} µs {step / plain_step:8.3f} {_spread(step_r):>15} "
                  f"{job:7.2f} s {job / plain_job:8.3f} {_spread(job_r):>15}")


def _spread(ratios: list[float]) -> str:
    """``min–max`` of per-round ratios (empty without rounds)."""
    return f"{min(ratios):.3f}–{max(ratios):.3f}" if ratios else ""


if __name__ == "__main__":
    main()
