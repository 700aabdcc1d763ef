"""Fresh-user review of the Performance view's memory, host and GPU charts, in a real browser (Debian's
chromium via Playwright, a real ``traceml ui``) on synthetic captured runs (telemetry databases written
as the aggregator writes them): each GPU's power and temperature on their own charts and units, a
CPU run saying why it has none, wall-time ticks at clock steps (``0s 15s 30s 45s 1m 1m 15s``, ``0 2m
4m``), byte ticks at power-of-two steps, and the heatmap's hint in 3 significant digits.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.diagnose.telemetry_db import HEALTHY_CPU, MIB, RunSpec, write_run
from tests.ui.test_browser import CHROMIUM, Viewer, expect, open_viewer, perf_view, serve, shot
from tests.ui.test_browser import browser as browser  # the module's chromium (a fixture)
from traceml_ai.diagnose.summary import write_final_summary

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Locator

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason="the browser tests need /usr/bin/chromium")

CLOCK_UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
BYTE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def _slow(factor: float) -> Any:
    """Healthy phases ``factor`` times longer: a run of a few steps lasts minutes of wall time."""
    return lambda rank, step: {k: v * factor for k, v in HEALTHY_CPU.items()}


def _run(root: Path, i: int, name: str, spec: RunSpec) -> Path:
    folder = root / f"2026113{i}-100000_{name}_ab2{i}"
    write_run(folder, spec)
    (folder / "run.json").write_text(json.dumps({
        "schema_version": 1, "id": folder.name, "name": name, "status": "completed",
        "started_at": f"2026-11-2{i}T10:00:00Z", "ended_at": f"2026-11-2{i}T10:30:00Z", "duration_s": 1800.0}))
    write_final_summary(folder)
    return folder


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Viewer]:
    root = tmp_path_factory.mktemp("perfgpu") / "traceml" / "runs"
    # about 75 s: 103 steps of ~0.73 s, a snapshot a second; the GPU warms up and draws more power
    _run(root, 0, "gpu75", RunSpec(steps=103, gpu=True, phases=_slow(50), interval_s=1.0,
                                   gpu_temp=lambda t: 40.0 + t / 3, gpu_power=lambda t: 120.0 + t,
                                   gpu_power_limit=300.0, rss=lambda r, t: 300 * MIB + t * 2 * MIB))
    # about 10 minutes on a CPU; its RSS grows from 300 to ~600 MiB
    _run(root, 1, "cpu10m", RunSpec(steps=420, phases=_slow(100), interval_s=5.0,
                                    rss=lambda r, t: 300 * MIB + t * 0.5 * MIB))
    with serve(root) as v:
        yield v


SETTLED = """el => new Promise((done) => {
  const check = () => {
    const u = el.querySelector(".uplot");
    if (u && Math.abs(u.clientWidth - el.clientWidth) <= 2) requestAnimationFrame(() => requestAnimationFrame(done));
    else setTimeout(check, 50);
  };
  check();
})"""


def card(run: Locator, testid: str) -> Locator:
    """A chart card of the "Memory and system" block (``telemetry-host`` also names the panel's host)."""
    return run.locator(f".telem-card[data-testid={testid}]")


def ticks(chart: Locator, axis: str) -> list[str]:
    """A telemetry chart's tick labels as drawn (``data-x-ticks`` / ``data-y-ticks``, ``|`` between)."""
    plot = chart.locator(".plot")
    expect(plot).to_have_attribute(f"data-{axis}-ticks", re.compile(r"\S"))
    # A chart first drawn before the page's layout settled is widened (and its ticks redrawn) once
    # its card has its width: read them after that.
    plot.evaluate(SETTLED)
    return (plot.get_attribute(f"data-{axis}-ticks") or "").split("|")


def clock_seconds(label: str) -> int:
    """``1m 15s`` → 75; ``0`` and ``0s`` → 0. Fails on anything else (``1.0833m``)."""
    if label in ("0", "0s"):
        return 0
    parts = label.split(" ")
    assert all(re.fullmatch(r"[1-9]\d*[dhms]", p) for p in parts), label
    return sum(int(p[:-1]) * CLOCK_UNITS[p[-1]] for p in parts)


def assert_clock_steps(labels: list[str], allowed: set[int]) -> int:
    values = [clock_seconds(t) for t in labels]
    steps = {b - a for a, b in itertools.pairwise(values)}
    assert len(labels) >= 3 and len(steps) == 1, labels
    (step,) = steps
    assert step in allowed, labels
    return step


def test_a_gpu_runs_power_and_temperature_have_their_own_charts_and_units(browser: Browser,
                                                                          workspace: Viewer) -> None:
    with open_viewer(browser, workspace) as s:
        page = s.page
        run = perf_view(page, "gpu75")
        util = card(run, "telemetry-gpu")
        power = card(run, "telemetry-gpu-power")
        temp = card(run, "telemetry-gpu-temperature")
        for chart in (util, power, temp):
            expect(chart.locator("canvas").first).to_be_visible()
        expect(power.get_by_test_id("telemetry-legend-item")).to_have_text(["GPU 0 power", "GPU 0 power limit"])
        expect(temp.get_by_test_id("telemetry-legend-item")).to_have_text(["GPU 0"])
        expect(power).to_contain_text("GPU power draw and limit (W)")
        expect(temp).to_contain_text("GPU temperature (°C)")
        # each unit on its own axis: watts up to the 300 W limit, degrees up to ~65 °C, percent apart
        watts = ticks(power, "y")
        assert all(t.endswith(" W") for t in watts) and max(float(t[:-2]) for t in watts) >= 300, watts
        celsius = ticks(temp, "y")
        assert all(t.endswith(" °C") for t in celsius) and max(float(t[:-3]) for t in celsius) < 100, celsius
        assert all(t.endswith("%") for t in ticks(util, "y"))
        expect(run.get_by_test_id("perf-missing")).not_to_contain_text("GPU: no GPU")
        power.scroll_into_view_if_needed()
        shot(page, "perf-gpu-power-temperature")
        s.assert_clean()


def test_a_cpu_run_has_no_power_chart_and_says_why(browser: Browser, workspace: Viewer) -> None:
    with open_viewer(browser, workspace) as s:
        page = s.page
        run = perf_view(page, "cpu10m")
        expect(card(run, "telemetry-host").locator("canvas").first).to_be_visible()
        for chart in ("telemetry-gpu", "telemetry-gpu-power", "telemetry-gpu-temperature"):
            expect(run.get_by_test_id(chart)).to_have_count(0)
        expect(run.get_by_test_id("perf-why").filter(has_text="GPU: no GPU on this host")).to_have_count(1)
        s.assert_clean()


def test_wall_time_and_byte_ticks_are_round_steps(browser: Browser, workspace: Viewer) -> None:
    """Fresh-user review: a 75 s run's axis read ``1m, 1.0833m, 1.1667m`` and a long one's
    ``1.6667m, 3.3333m``; RSS ticks were 191 MiB and 381 MiB."""
    with open_viewer(browser, workspace) as s:
        page = s.page
        run = perf_view(page, "gpu75")
        host = card(run, "telemetry-host")
        labels = ticks(host, "x")
        assert labels[0] == "0s" and "1m" in labels, labels
        assert_clock_steps(labels, {5, 10, 15, 30})
        assert any(re.fullmatch(r"1m [1-9]\d*s", t) for t in labels), labels  # minutes and seconds, no decimals
        host.scroll_into_view_if_needed()
        shot(page, "perf-ticks-75s")

        page.get_by_test_id("nav-runs").click()
        run = perf_view(page, "cpu10m")
        for testid in ("telemetry-host", "telemetry-rss"):
            labels = ticks(card(run, testid), "x")
            assert labels[0] == "0", labels
            assert_clock_steps(labels, {60, 120, 300})
        rss = ticks(card(run, "telemetry-rss"), "y")
        units = {t.split(" ")[1] for t in rss if t != "0"}
        assert len(units) == 1, rss  # one unit along the axis
        values = [0.0 if t == "0" else float(t.split(" ")[0]) * BYTE_UNITS[t.split(" ")[1]] for t in rss]
        steps = {b - a for a, b in itertools.pairwise(values)}
        assert len(steps) == 1, rss
        (step,) = steps
        assert step >= 64 * MIB and int(step) & (int(step) - 1) == 0, rss  # 64, 128, 256 MiB …: a power of two
        run.get_by_test_id("telemetry-rss").scroll_into_view_if_needed()
        shot(page, "perf-ticks-10m")
        s.assert_clean()


def test_the_heatmap_hint_gives_its_range_in_3_significant_digits(browser: Browser, workspace: Viewer) -> None:
    with open_viewer(browser, workspace) as s:
        run = perf_view(s.page, "gpu75")
        hint = run.get_by_test_id("perf-heatmap").locator(".perf-card-hint")
        expect(hint).to_contain_text("(blue)")
        found = re.search(r"from (\S+) ms \(blue\) to (\S+) ms \(red\)", hint.inner_text())
        assert found, hint.inner_text()
        for number in found.groups():
            digits = re.sub(r"\D", "", number.rstrip("0").rstrip(".") if "." in number else number)
            assert len(digits.lstrip("0")) <= 3, number
