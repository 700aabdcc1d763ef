"""A first scan without a run database says how far it is while it lasts (review 16c: 100,000 runs
from a cold disk took nine minutes in silence)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui import warm
from traceml_ai.ui.warm import open_warm, scan_progress


def _slowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each run takes 2 ms more to check: a scan of 300 runs lasts over half a second anywhere."""
    check = RunStore._update_one

    def slow(self: RunStore, *args: object, **kwargs: object) -> None:
        time.sleep(0.002)
        check(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(RunStore, "_update_one", slow)
    monkeypatch.setattr(warm, "PROGRESS_FIRST_S", 0.05)
    monkeypatch.setattr(warm, "PROGRESS_EVERY_S", 0.05)


@pytest.mark.timeout(60)
def test_a_long_scan_reports_how_many_runs_it_read_and_a_short_one_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "runs"
    generate(root, runs=300, seed=1)
    told: list[tuple[int, int]] = []
    quick = RunStore([root])
    with scan_progress(quick, lambda read, listed: told.append((read, listed))):
        quick.poll()
    assert told == [] and quick.progress == (300, 300)  # (under 3 s: nothing said)

    _slowed(monkeypatch)
    warmed = open_warm([str(root)], cache_dir=str(tmp_path / "cache"), stale_after_seconds=60,
                       max_metrics_file_mb=64, progress=lambda read, listed: told.append((read, listed)))
    assert len(warmed.store.runs()) == 300
    assert told, "a scan of over half a second said nothing"
    assert all(listed == 300 and 0 <= read <= 300 for read, listed in told)
    assert [read for read, _ in told] == sorted(read for read, _ in told)  # (it only goes forward)
