"""The Performance view's panels as files (issue 13 item 4): CSV data and 300-DPI PNGs drawn by the
server, from real telemetry databases written with the aggregator's schema (a GPU run, a corrupt
database, a run that was not captured)."""

from __future__ import annotations

import csv
import io
import struct
import zlib
from pathlib import Path

import pytest

from tests.diagnose.telemetry_db import GIB, MIB, RunSpec, write_run
from traceml_ai.runs.model import RunSummary
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.perf_export import PANELS, PanelError, export_panel, panel_figure, telemetry_of
from traceml_ai.ui.png import png_dpi

pytest.importorskip("matplotlib")


def run_of(run_dir: Path) -> RunSummary:
    return RunSummary(key=str(run_dir), id=run_dir.name, root=str(run_dir.parent), name=run_dir.name)


def rows(path: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(Path(path).read_text(encoding="utf-8"))))


def test_a_gpu_run_exports_every_panel_with_its_devices(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "gpu-run"
    write_run(run_dir, RunSpec(ranks=2, steps=40, gpu=True, interval_s=0.1, gpu_util=lambda t: 80.0,
                               peak_alloc=lambda r, s: (10 + r) * GIB))
    cache = CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"])
    run = run_of(run_dir)
    for panel in PANELS:
        png = export_panel(cache, run, panel, "png")
        assert Path(png).name.startswith(f"plot-gpu-run-telemetry-{panel}-")
        assert png_dpi(Path(png).read_bytes()) == pytest.approx(300, abs=0.01)
    memory = rows(export_panel(cache, run, "memory", "csv"))
    alloc = {r["value"] for r in memory if r["series"] == "rank 1 cuda:1 alloc"}
    assert alloc == {str(float(11 * GIB))}
    assert {r["series"] for r in memory if r["time_s"]} == {"rank 0 RSS", "rank 1 RSS"}
    gpu = rows(export_panel(cache, run, "gpu", "csv"))
    assert {r["value"] for r in gpu if r["series"] == "GPU 0 util"} == {"80.0"}
    assert {"CPU", "RAM", "GPU 0 memory", "GPU 1 memory"} <= {r["series"] for r in gpu}
    share = export_panel(cache, run, "step", "png", share=True)
    assert Path(share).read_bytes() != Path(export_panel(cache, run, "step", "png")).read_bytes()


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels, from the PNG's IHDR chunk."""
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_gpu_panel_gives_each_gpus_power_and_temperature_in_their_own_units(tmp_path: Path) -> None:
    """Fresh-user review: the issue asks for power and temperature per GPU; the gpu panel had only
    percentages. The CSV names their units (watts, celsius); the PNG draws them on two more axes,
    one per unit, never on the percent axis."""
    run_dir = tmp_path / "runs" / "gpu-run"
    write_run(run_dir, RunSpec(ranks=2, steps=40, gpu=True, interval_s=0.1, gpu_temp=lambda t: 61.5,
                               gpu_power=lambda t: 250.0, gpu_power_limit=350.0))
    cache = CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"])
    run = run_of(run_dir)
    got = rows(export_panel(cache, run, "gpu", "csv"))
    units = {r["series"]: r["unit"] for r in got}
    assert units["GPU 0 power"] == units["GPU 1 power limit"] == "watts"
    assert units["GPU 1 temperature"] == "celsius" and units["GPU 0 util"] == "percent"
    assert {r["value"] for r in got if r["series"] == "GPU 0 power"} == {"250.0"}
    assert {r["value"] for r in got if r["series"] == "GPU 0 power limit"} == {"350.0"}
    assert {r["value"] for r in got if r["series"] == "GPU 1 temperature"} == {"61.5"}

    tel = telemetry_of(run)
    fig = panel_figure(tel, "gpu", title="gpu-run")
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert titles == ["host CPU and RAM (%)", "GPU utilisation and memory (%)", "GPU power draw and limit (W)",
                      "GPU temperature (°C)"]
    power, temp = fig.axes[2], fig.axes[3]
    assert power.get_ylabel() == "W" and temp.get_ylabel() == "°C"
    assert [line.get_label() for line in power.get_lines()] == ["GPU 0 power", "GPU 0 power limit", "GPU 1 power",
                                                                "GPU 1 power limit"]
    assert {y for line in temp.get_lines() for y in line.get_ydata()} == {61.5}
    draw, limit = power.get_lines()[:2]  # a GPU's limit: dashed, in its power line's colour
    assert limit.get_linestyle() == "--" and draw.get_linestyle() == "-" and limit.get_color() == draw.get_color()
    png = Path(export_panel(cache, run, "gpu", "png")).read_bytes()
    assert png_size(png) == (2700, 3000)  # 9 x 10 inches at 300 DPI: four panels


def test_the_step_panels_png_says_what_the_page_says(tmp_path: Path) -> None:
    """Review 13i: the exported Share picture had a 0-1 axis and the raw phase names
    (``dataloader_next``) where the page shows percent and "dataloader"."""
    run_dir = tmp_path / "runs" / "cpu-run"
    write_run(run_dir, RunSpec(ranks=1, steps=40))
    tel = telemetry_of(run_of(run_dir))
    for share in (False, True):
        fig = panel_figure(tel, "step", title="cpu-run", share=share)
        ax = fig.axes[0]
        labels = ax.get_legend_handles_labels()[1]
        assert "dataloader" in labels and "optimizer" in labels and "forward" in labels
        assert not any(label.startswith("traceml:") or label.endswith(("_next", "_step")) for label in labels)
        fig.canvas.draw()
        ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert all(t.endswith("%") for t in ticks) == share, ticks


def test_a_cpu_runs_empty_parts_say_why_without_axes(tmp_path: Path) -> None:
    """Fresh-user review: a CPU run's gpu and memory PNGs drew meaningless 0-1 axes around the words
    saying why they are empty. Those parts are the words alone; the parts with data keep theirs."""
    run_dir = tmp_path / "runs" / "cpu-run"
    write_run(run_dir, RunSpec(ranks=1, steps=30))
    tel = telemetry_of(run_of(run_dir))
    gpu = panel_figure(tel, "gpu", title="cpu-run")
    assert len(gpu.axes) == 2  # no power or temperature parts without a GPU
    host, device = gpu.axes
    assert host.axison and host.get_lines()
    assert not device.axison and not device.get_lines()
    assert any("No GPU on this host" in t.get_text() for t in device.texts)
    memory = panel_figure(tel, "memory", title="cpu-run")
    peaks, rss = memory.axes
    assert not peaks.axison and any("a CPU run measures host RSS only" in t.get_text() for t in peaks.texts)
    assert rss.axison and rss.get_lines()
    png = Path(export_panel(CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"]), run_of(run_dir), "gpu",
                            "png")).read_bytes()
    assert png_size(png) == (2700, 1800)


def test_a_corrupt_missing_or_empty_database_is_a_clear_error_and_writes_nothing(tmp_path: Path) -> None:
    """Issue 13 review: a damaged database exported a picture of nothing (and ``traceml plot`` exited 0)."""
    run_dir = tmp_path / "runs" / "broken"
    (run_dir / "aggregator").mkdir(parents=True)
    db = run_dir / "aggregator" / "telemetry.sqlite"
    cache = CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"])
    for content, words in ((b"not a database" * 200, "telemetry database is damaged: "),
                           (None, "no telemetry.sqlite in this run")):
        if content is None:
            db.unlink()
        else:
            db.write_bytes(content)
        for panel in PANELS:
            for fmt in ("png", "csv"):
                with pytest.raises(PanelError, match=f"broken: aggregator/telemetry.sqlite: {words}.*nothing to draw"):
                    export_panel(cache, run_of(run_dir), panel, fmt)
    # with a final summary the capture had written one: removed since, in the run table's words (review 13h)
    (run_dir / "aggregator" / "final_summary.json").write_text("{}")
    with pytest.raises(PanelError, match="broken: aggregator/telemetry.sqlite: telemetry database is missing "
                                         r"\(removed after the final summary was written\); nothing to draw"):
        export_panel(cache, run_of(run_dir), "step", "png")
    assert not (tmp_path / "cache" / "plots").exists() or not list((tmp_path / "cache" / "plots").iterdir())


def test_a_run_that_was_not_captured_or_an_unknown_panel_is_a_clear_error(tmp_path: Path) -> None:
    plain = tmp_path / "runs" / "plain"
    plain.mkdir(parents=True)
    cache = CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"])
    with pytest.raises(PanelError, match="not captured"):
        export_panel(cache, run_of(plain), "step", "png")
    write_run(tmp_path / "runs" / "ok", RunSpec(steps=10))
    with pytest.raises(PanelError, match="step, ranks, memory, gpu"):
        export_panel(cache, run_of(tmp_path / "runs" / "ok"), "heat", "csv")
    assert not (tmp_path / "cache" / "plots").exists() or not list((tmp_path / "cache" / "plots").iterdir())


def test_the_memory_picture_reads_in_binary_units_and_the_csvs_carry_no_float_noise(tmp_path: Path) -> None:
    """Issue 13 review: the memory PNG's axes showed raw bytes (1e10) and the ranks CSV carried float
    noise (12.300000000000001)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from traceml_ai.ui.png import bytes_axis

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([0, 1, 2], [0.0, 6 * GIB, 11 * GIB])
    assert bytes_axis(ax.yaxis, 11 * GIB) == "GiB"
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert "10" in labels and all(float(v) <= 12 for v in labels), labels  # 0 .. 12 GiB, not 1e10
    assert all(tick % (GIB // 2) == 0 for tick in ax.get_yticks()), "round ticks in GiB, not in bytes"

    run_dir = tmp_path / "runs" / "gpu-run"
    write_run(run_dir, RunSpec(ranks=2, steps=40, gpu=True, interval_s=0.1, gpu_util=lambda t: 80.0,
                               peak_alloc=lambda r, s: (10 + r) * GIB, noise=0.3,
                               host_ram_used=lambda t: 20 * GIB + t * 1234567.0))
    cache = CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"])
    for panel in ("step", "ranks", "gpu"):
        text = Path(export_panel(cache, run_of(run_dir), panel, "csv")).read_text(encoding="utf-8")
        numbers = [cell for line in text.splitlines()[1:] for cell in line.split(",") if "." in cell]
        assert numbers, panel
        noisy = [n for n in numbers if len(n.split(".")[1]) > 6]
        assert not noisy, (panel, noisy[:5])


def test_the_step_csv_with_share_gives_each_phase_as_its_share_of_the_step(tmp_path: Path) -> None:
    """Issue 13 review: ``traceml plot RUN --telemetry step --share --format csv`` (and the page's
    CSV with its share toggle on) wrote the milliseconds anyway. With share each phase column is
    ``<phase>_share``, the phases of a step summing to 1, in the same rows as the ms file."""
    run_dir = tmp_path / "runs" / "cpu-run"
    write_run(run_dir, RunSpec(ranks=1, steps=30))
    cache = CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"])
    run = run_of(run_dir)
    ms = rows(export_panel(cache, run, "step", "csv"))
    shares = rows(export_panel(cache, run, "step", "csv", share=True))
    assert len(shares) == len(ms) == 30
    phase_ms = [k for k in ms[0] if k.endswith("_ms") and k != "iteration_ms"]
    phase_share = [k for k in shares[0] if k.endswith("_share")]
    assert phase_share == [k.removesuffix("_ms") + "_share" for k in phase_ms] and phase_share
    for m, sh in zip(ms, shares, strict=True):
        assert sh["step"] == m["step"] and sh["iteration_ms"] == m["iteration_ms"]
        values = [float(sh[k]) for k in phase_share if sh[k]]
        assert sum(values) == pytest.approx(1.0, abs=1e-3)
        total = sum(float(m[k]) for k in phase_ms if m[k])
        first = phase_ms[0]
        assert float(sh[phase_share[0]]) == pytest.approx(float(m[first]) / total, abs=1e-4)


def test_a_panel_with_no_data_is_not_exported_and_says_why(tmp_path: Path) -> None:
    """Issue 13 review: a ``watch`` run's step panel exported a CSV holding the word ``step`` and a
    PNG of empty axes, without a word. A panel with no row is an error naming why; nothing is
    written; the other panels of that run still export."""
    run_dir = tmp_path / "runs" / "watched"
    write_run(run_dir, RunSpec(ranks=1, steps=0))
    cache = CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"])
    run = run_of(run_dir)
    for panel in ("step", "ranks"):
        for fmt in ("csv", "png"):
            with pytest.raises(PanelError, match=rf"nothing to export: the {panel} panel has no data \(no step times"):
                export_panel(cache, run, panel, fmt)
    assert not list((tmp_path / "cache").rglob("plot-*"))
    assert rows(export_panel(cache, run, "gpu", "csv"))  # the system samples are there


def png_texts(data: bytes) -> dict[str, str]:
    """The PNG's ``tEXt`` chunks (keyword → text)."""
    out: dict[str, str] = {}
    pos = 8
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"tEXt":
            key, _, text = body.partition(b"\0")
            out[key.decode("latin-1")] = text.decode("latin-1")
        elif kind == b"zTXt":
            key, _, rest = body.partition(b"\0")
            out[key.decode("latin-1")] = zlib.decompress(rest[1:]).decode("latin-1")
        elif kind == b"iTXt":
            key, _, rest = body.partition(b"\0")
            text = rest[2:].split(b"\0", 2)[-1]
            out[key.decode("latin-1")] = (zlib.decompress(text) if rest[0] else text).decode("utf-8")
        pos += 12 + length
    return out


def test_two_runs_sharing_a_name_are_told_apart_by_their_short_id_in_the_picture(tmp_path: Path) -> None:
    """Review 13c: two ``train_digits`` runs gave two pictures titled alike."""
    cache = CacheFolder(tmp_path / "cache", roots=[tmp_path / "runs"])
    titles = []
    for run_id in ("20261201-101500_train_digits_e9df", "20261201-111500_train_digits_07aa"):
        run_dir = tmp_path / "runs" / run_id
        write_run(run_dir, RunSpec(ranks=1, steps=30))
        run = RunSummary(key=str(run_dir), id=run_id, root=str(run_dir.parent), name="train_digits")
        titles.append(png_texts(Path(export_panel(cache, run, "step", "png")).read_bytes()).get("Title"))
    assert titles == ["train_digits · e9df · Step time by phase", "train_digits · 07aa · Step time by phase"]


def test_every_gpu_chart_names_its_x_unit_and_each_y_axis_ends_on_a_tick_above_its_plateau(tmp_path: Path) -> None:
    """Fresh-user review: the gpu PNG's utilisation chart had no x unit, and a plateau (RSS at
    480 MiB, a GPU at 92 %, host CPU at 53 %) had no y tick at or above it."""
    run_dir = tmp_path / "runs" / "gpu-run"
    write_run(run_dir, RunSpec(ranks=2, steps=40, gpu=True, interval_s=0.1, gpu_util=lambda t: 92.0,
                               host_cpu=lambda t: 53.0, rss=lambda r, t: 480 * MIB))
    tel = telemetry_of(run_of(run_dir))
    figs = [panel_figure(tel, "gpu", title="gpu-run"), panel_figure(tel, "memory", title="gpu-run")]
    gpu_axes = figs[0].axes
    assert [ax.get_xlabel() for ax in gpu_axes] == ["wall time (s)"] * len(gpu_axes)
    for ax in [*gpu_axes, figs[1].axes[1]]:
        top = max(float(max(line.get_ydata())) for line in ax.get_lines())
        lo, hi = ax.get_ylim()
        shown = [t for t in ax.get_yticks() if lo - 1e-9 <= t <= hi + 1e-9]
        assert max(shown) >= top, (ax.get_title(loc="left"), shown, top)
