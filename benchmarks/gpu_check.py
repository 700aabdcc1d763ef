"""The device check of issue 11 item 9: one prepared script for a machine with a CUDA GPU.

    python benchmarks/gpu_check.py                  # on a GPU machine (about 3 minutes)
    python benchmarks/gpu_check.py --device cpu --epochs 1   # a rehearsal on the CPU: no GPU figures

It trains ``examples/train_digits.py`` under ``traceml run --exporter jsonl --export-streams all``
once per case and prints what TraceML measured, from the exported records (the 000 document's
record streams) and ``traceml summary --json``:

- **healthy**: a model wide enough to keep the GPU busy, batches from 2 worker processes;
- **h2d_bound**: ``--plant h2d_bound`` (a 64 MB pageable copy to the GPU every step);
- **low_gpu_util**: ``--plant low_gpu_util`` (the GPU idles 20 ms of every step).

Per case it prints:

- CUDA event timing: for each phase, how many ``step_time`` events say ``is_gpu`` and carry a
  ``gpu_ms``, and the median GPU and CPU ms;
- host-to-device copies: the median ``traceml:h2d`` per step and its share of the step;
- per-step peaks: the ``step_memory`` devices, the steps with a peak and the highest allocated and
  reserved peaks (MiB);
- NVML: how many ``system_gpu`` records carry each field, and its range;
- the verdict: the findings (kind, severity) and whether the planted kind came first.

Nothing is asserted: these are the figures to compare with the thresholds in docs/diagnoses.md.
With ``OUT`` set (the device tool's output folder) the same is written to ``$OUT/gpu_check.json``.
Exits 2 when ``--device cuda`` is asked for on a machine without CUDA, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_digits.py"

CASES: dict[str, tuple[list[str], str | None]] = {
    # name: (example arguments, the finding kind that should come first; None: no warning or worse).
    # Sized for an H100 (not measured yet): the healthy case's ~200 GFLOP per step should take a few
    # ms of GPU time, well above the host's per-step cost; each case runs a few seconds.
    "healthy": (["--hidden", "8192", "--batch-size", "512", "--workers", "2", "--epochs", "60"], None),
    "h2d_bound": (["--plant", "h2d_bound", "--epochs", "10"], "h2d_bound"),
    "low_gpu_util": (["--plant", "low_gpu_util", "--epochs", "10"], "low_gpu_util"),
}
INTERVAL_S = "0.25"  # the samplers' interval: several NVML samples even in a few seconds
NVML_FIELDS = ("util", "mem_used_bytes", "mem_total_bytes", "temperature_c", "power_usage_w", "power_limit_w")


def traceml(*args: str) -> list[str]:
    """The ``traceml`` command of this interpreter's environment."""
    return [sys.executable, "-m", "traceml_ai", *args]


def records(run: Path, stream: str) -> list[dict[str, Any]]:
    """The data records of one exported stream (the closing record left out)."""
    path = run / "aggregator" / "export" / f"{stream}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        if not rec.get("closing"):
            out.append(rec)
    return out


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def phase_timing(steps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per phase: events, events timed on the GPU (``is_gpu`` and a ``gpu_ms``), median GPU / CPU ms."""
    out: dict[str, dict[str, Any]] = {}
    for rec in steps:
        for phase, by_device in (rec.get("events") or {}).items():
            for device, stats in by_device.items():
                entry = out.setdefault(phase, {"events": 0, "gpu_timed": 0, "devices": set(), "gpu": [], "cpu": []})
                entry["events"] += 1
                entry["devices"].add(device)
                if stats.get("is_gpu") and stats.get("gpu_ms") is not None:
                    entry["gpu_timed"] += 1
                    entry["gpu"].append(stats["gpu_ms"])
                if stats.get("cpu_ms") is not None:
                    entry["cpu"].append(stats["cpu_ms"])
    return {
        phase: {"events": e["events"], "gpu_timed": e["gpu_timed"], "devices": sorted(e["devices"]),
                "median_gpu_ms": _median(e["gpu"]), "median_cpu_ms": _median(e["cpu"])}
        for phase, e in sorted(out.items())
    }


def memory_peaks(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``step_memory`` devices, steps with a peak, and the highest peaks in MiB."""
    alloc = [r["peak_alloc_bytes"] for r in rows if r.get("peak_alloc_bytes") is not None]
    reserved = [r["peak_reserved_bytes"] for r in rows if r.get("peak_reserved_bytes") is not None]
    return {
        "records": len(rows),
        "devices": sorted({str(r.get("device")) for r in rows}),
        "steps_with_peak": len(alloc),
        "max_alloc_mib": round(max(alloc) / 2**20, 1) if alloc else None,
        "max_reserved_mib": round(max(reserved) / 2**20, 1) if reserved else None,
    }


def nvml_fields(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per NVML field of ``system_gpu``: records carrying it, and its min / max."""
    out: dict[str, Any] = {"records": len(rows)}
    for name in NVML_FIELDS:
        values = [r[name] for r in rows if r.get(name) is not None]
        out[name] = {"measured": len(values), "min": min(values) if values else None,
                     "max": max(values) if values else None}
    return out


def run_case(name: str, extra: list[str], device: str, epochs: int | None, root: Path) -> dict[str, Any]:
    """Train one case under ``traceml run`` and collect its figures (``epochs``: None keeps the case's)."""
    logs = root / name
    if epochs is not None:
        extra = [*extra, "--epochs", str(epochs)]  # (the last --epochs wins)
    if device == "cpu" and "--hidden" in extra:
        # a rehearsal: the GPU-sized model would take minutes, and its batches of 512 make too few
        # steps in one epoch for a verdict (review 11f: the healthy case was never judged)
        extra = [*extra, "--hidden", "256", "--batch-size", "32"]
    cmd = traceml("run", "--logs-dir", str(logs), "--name", f"gpu-check-{name}", "--exporter", "jsonl",
                  "--export-streams", "all", "--mode", "quiet", "--interval", INTERVAL_S, str(EXAMPLE),
                  "--device", device, *extra)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    folders = sorted(p for p in logs.iterdir() if p.is_dir()) if logs.exists() else []
    result: dict[str, Any] = {"case": name, "args": extra, "exit": proc.returncode, "wall_s": round(wall, 1)}
    if proc.returncode != 0 or not folders:
        result["error"] = (proc.stderr or proc.stdout).strip()[-2000:]
        return result
    run = folders[-1]
    result["run"] = str(run)
    summary = json.loads(subprocess.run(traceml("summary", str(run), "--json"), capture_output=True, text=True,
                                        check=True).stdout)
    step_time = summary.get("step_time") or {}
    shares = {p["name"]: p for p in step_time.get("phases") or []}
    h2d = shares.get("traceml:h2d") or {}
    result.update(
        steps=(summary.get("steps") or {}).get("seen"),
        iteration_median_ms=step_time.get("iteration_median_ms"),
        phases=phase_timing(records(run, "step_time")),
        h2d={"median_ms": h2d.get("median_ms"), "share": h2d.get("share")},
        shares={n: p.get("share") for n, p in shares.items()},
        step_memory=memory_peaks(records(run, "step_memory")),
        nvml=nvml_fields(records(run, "system_gpu")),
        gpu_util_median=(summary.get("system") or {}).get("gpu_util_median"),
        findings=[(f["kind"], f["severity"]) for f in summary.get("findings") or []],
        abstained=[a["rule"] for a in summary.get("abstained") or []],
        verdict=(summary.get("verdict") or {}).get("text"),
        verdict_kind=(summary.get("verdict") or {}).get("kind"),
    )
    return result


def planted_first(result: dict[str, Any], expected: str | None) -> bool:
    """Whether the verdict names the planted cause first (healthy: no warning or critical finding)."""
    findings = result.get("findings") or []
    if expected is None:
        return result.get("verdict_kind") == "healthy"  # (also no warning or critical finding)
    return bool(findings) and findings[0][0] == expected


def report(result: dict[str, Any], expected: str | None) -> None:
    print(f"\n== {result['case']} ({' '.join(result['args'])}): exit {result['exit']}, {result['wall_s']} s",
          flush=True)
    if "error" in result:
        print(f"  failed: {result['error']}")
        return
    print(f"  {result['steps']} steps, median step {result['iteration_median_ms']} ms, "
          f"GPU utilisation median {result['gpu_util_median']}")
    print("  CUDA event timing (events with is_gpu and gpu_ms / all; median GPU ms, CPU ms):")
    for phase, p in result["phases"].items():
        print(f"    {phase:<26} {p['gpu_timed']:>5}/{p['events']:<5} gpu {p['median_gpu_ms']}  cpu {p['median_cpu_ms']}"
              f"  on {', '.join(p['devices'])}")
    print(f"  h2d: median {result['h2d']['median_ms']} ms per step, share {result['h2d']['share']}")
    print("  shares: " + ", ".join(f"{n.removeprefix('traceml:')} {s:.3f}" for n, s in result["shares"].items()
                                   if s is not None))
    m = result["step_memory"]
    print(f"  per-step peaks: {m['steps_with_peak']}/{m['records']} records on {', '.join(m['devices']) or '-'}, "
          f"max allocated {m['max_alloc_mib']} MiB, reserved {m['max_reserved_mib']} MiB")
    n = result["nvml"]
    print(f"  NVML ({n['records']} system_gpu records): " + "; ".join(
        f"{f} {n[f]['measured']} [{n[f]['min']}..{n[f]['max']}]" for f in NVML_FIELDS))
    ok = planted_first(result, expected)
    print(f"  verdict: {result['verdict']}; findings {result['findings']}; "
          f"{'the planted cause comes first' if expected else 'healthy'}: {'yes' if ok else 'NO'}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--epochs", type=int, default=None, help="epochs of every case (default: each case's own)")
    ap.add_argument("--cases", default=",".join(CASES), help="comma separated, of: " + ", ".join(CASES))
    ap.add_argument("--keep", metavar="DIR", help="write the runs here (default: a temporary folder)")
    args = ap.parse_args()
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing to check (use --device cpu for a rehearsal)", file=sys.stderr)
        return 2
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"gpu_check: device {args.device}, GPU {gpu}, torch {torch.__version__}, {os.cpu_count()} CPUs", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="traceml-gpu-check-") as tmp:
        root = Path(args.keep) if args.keep else Path(tmp)
        for name in [c.strip() for c in args.cases.split(",") if c.strip()]:
            extra, expected = CASES[name]
            result = run_case(name, extra, args.device, args.epochs, root)
            result["planted_first"] = planted_first(result, expected) if "error" not in result else False
            report(result, expected)
            results.append(result)
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_check.json").write_text(json.dumps({"gpu": gpu, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
