"""Every number the diagnosis rules and the run comparison decide with (DESIGN §3.5).

Each constant is documented, with the reasoning behind its value, in ``docs/diagnoses.md``; change
one here and there together. Shares are fractions of the step's iteration time (0.30 = 30 %),
utilisation figures are percent, memory sizes bytes, and relative growths fractions.
"""

from __future__ import annotations

from typing import Final

MIB: Final = 1024 * 1024

# -- warm-up and minimum data -------------------------------------------------------------------------

WARMUP_STEPS: Final = 5
"""The first steps of each rank that no rule reads (allocator growth, lazy init, cold caches)."""

WARMUP_SAMPLES: Final = 2
"""Snapshots (system/process) skipped per series when no step tells when warm-up ended."""

MIN_STEPS: Final = 5
"""Post-warm-up steps a phase-share rule needs on a rank."""

MIN_STRAGGLER_STEPS: Final = 5
"""Post-warm-up steps each of at least two ranks needs before ranks are compared."""

MIN_SERIES_SAMPLES: Final = 3
"""Post-warm-up snapshots a system, GPU-utilisation or pressure rule needs."""

MIN_CREEP_SAMPLES: Final = 6
"""Post-warm-up points (steps or snapshots) a memory-creep test needs on one series."""

MAX_STEP_ROWS: Final = 20_000
"""A run with more step rows is read every k-th step (k = rows / this, rounded up; warm-up steps
always): every rule is a median, a share or a trend, which an even sample keeps, and reading stays
within a second and tens of MB. Memory peaks are still read from every step. 20,000 rows are 2,500
steps per rank at 8 ranks, more than the 1,000 points a chart draws or the 240 columns of the
heatmap; at 50,000 (before) decoding the rows was half of opening the Performance view of 8 ranks x
100,000 steps (1.04 s server-side, 1.29 s in chromium; 0.60 s and 0.85 s now, issue 13 item 5)."""

# -- phase shares -------------------------------------------------------------------------------------

CONTAINMENT_TOLERANCE: Final = 0.03
"""``traceml:step`` shorter than (1 - this) x the sum of the built-in phases means the dataloader
wait was timed outside the step region, so the iteration is step + dataloader wait."""

INPUT_BOUND_INFO: Final = 0.10
INPUT_BOUND_WARN: Final = 0.20
INPUT_BOUND_CRITICAL: Final = 0.40
"""Share of the iteration spent waiting for ``next(dataloader)`` (info / warning / critical)."""

INPUT_BOUND_MIN_MS: Final = 2.0
"""Median wait for ``next(dataloader)`` per step (ms) below which ``input_bound`` never fires, whatever
its share: on a step of a few ms, the loader's own per-batch cost (collating a small batch, handing it
over from a worker) is a large share that more workers cannot remove."""

H2D_BOUND_WARN: Final = 0.25
H2D_BOUND_CRITICAL: Final = 0.50
"""Share of the iteration spent copying the batch to the device."""

OPTIMIZER_BOUND_WARN: Final = 0.50
OPTIMIZER_BOUND_CRITICAL: Final = 0.75
"""Share of the iteration spent in ``optimizer.step()``."""

COMPUTE_BOUND_SHARE: Final = 0.80
"""Share of the iteration in forward + backward + optimizer that makes a run compute-bound (info)."""

COMPUTE_BOUND_GPU_UTIL: Final = 70.0
"""Median GPU utilisation (percent) that confirms a compute-bound GPU run."""

# -- ranks --------------------------------------------------------------------------------------------

STRAGGLER_WARN: Final = 0.15
STRAGGLER_CRITICAL: Final = 0.50
"""Excess of the slowest rank over the median of the other ranks, as a fraction of their median
iteration time (0.15 = the straggler costs every step 15 % more)."""

# -- memory -------------------------------------------------------------------------------------------

GPU_MEMORY_PRESSURE_WARN: Final = 0.90
GPU_MEMORY_PRESSURE_CRITICAL: Final = 0.97
"""Peak reserved GPU memory of a rank over its device's total memory."""

HOST_MEMORY_PRESSURE_WARN: Final = 0.80
HOST_MEMORY_PRESSURE_CRITICAL: Final = 0.90
"""Summed peak RSS of the ranks on one host over that host's RAM total."""

CREEP_MIN_GROWTH: Final = 0.05
"""Late-window median over early-window median, minus one, that counts as growth."""

CREEP_MIN_BYTES: Final = 32 * MIB
"""Absolute growth below which a series is never creeping (allocator and page-cache noise)."""

CREEP_MIN_TAU: Final = 0.5
"""Kendall's tau between position and value: how consistently the series rises."""

CREEP_MIN_CONTINUATION: Final = 0.2
"""Share of the growth each half (early→middle, middle→late window) must carry: a one-time jump
that then stays flat is not a creep."""

CREEP_CRITICAL_GROWTH: Final = 0.50
"""Relative growth that makes a creep critical."""

# -- system -------------------------------------------------------------------------------------------

LOW_GPU_UTIL_WARN: Final = 50.0
LOW_GPU_UTIL_CRITICAL: Final = 20.0
"""Median utilisation (percent) of the GPUs the run uses, below which they are underfed."""

CPU_PRESSURE: Final = 90.0
"""Median host CPU utilisation (percent) that counts as saturated."""

RAM_PRESSURE_WARN: Final = 0.90
RAM_PRESSURE_CRITICAL: Final = 0.95
"""90th percentile of host RAM used over RAM total."""

# -- comparison ---------------------------------------------------------------------------------------

COMPARE_MIN_SAMPLES: Final = 10
"""Samples each run needs per metric; fewer gives ``inconclusive``."""

COMPARE_MARGIN: Final = 0.05
"""Equivalence margin on the ratio of medians (B/A within 1 ± 0.05 is the same)."""

COMPARE_CONFIDENCE: Final = 0.95
"""Confidence level of the bootstrap interval of the ratio of medians."""

COMPARE_RESAMPLES: Final = 2000
"""Bootstrap resamples per metric."""

COMPARE_SEED: Final = 20261130
"""Seed of the bootstrap, so the same two runs always give the same verdicts."""

COMPARE_PHASE_FLOOR_SHARE: Final = 0.02
"""A phase whose median moved by less than this share of run A's median iteration time is
``equivalent`` whatever its ratio (a 0.01 ms → 0.02 ms copy is not a regression)."""

COMPARE_MEMORY_FLOOR_BYTES: Final = 8 * MIB
"""Memory medians closer than this are ``equivalent``."""

COMPARE_UTIL_FLOOR_PERCENT: Final = 2.0
"""GPU-utilisation medians closer than this many points are ``equivalent``."""
