"""The viewer's cache folder: the only place the viewer writes (003 seed, "Exporting the table for an
agent", "Exporting chart data", "The run database", "Security and resource use")."""

from __future__ import annotations

import csv
import io
import os
import sqlite3
import struct
from pathlib import Path

import orjson
import pytest

from traceml_ai.runs.analysis import BarSpec, BoxSpec, LineSpec, ScatterSpec
from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.cache import (
    MAX_UI_STATE_BYTES,
    CacheError,
    CacheFolder,
    check_cache_dir,
    default_cache_dir,
    migrate_cache_dir,
    slugify,
)
from traceml_ai.ui.png import is_png, png_dpi

T0 = 1_796_040_000.0  # 2026-11-30T12:00:00Z


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ws") / "traceml" / "runs"
    generate(root, runs=24, seed=0)
    return root


@pytest.fixture(scope="module")
def store(fake_root: Path) -> RunStore:
    s = RunStore([fake_root])
    s.poll()
    return s


@pytest.fixture
def cache(tmp_path: Path) -> CacheFolder:
    return CacheFolder(tmp_path / "traceml" / ".cache", clock=Clock())


def _files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


# -- where -----------------------------------------------------------------------------------------


def test_default_cache_dir_is_the_projects_or_keyed_by_the_roots(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir(["traceml/runs"], None) == str(tmp_path / "traceml" / ".cache")
    assert default_cache_dir([], None) == str(tmp_path / "traceml" / ".cache")
    assert default_cache_dir(["/p/traceml/runs2/"], None) == "/p/traceml/.cache"
    home_runs = default_cache_dir([str(Path.home() / "runs")], None)
    assert home_runs.startswith(str(tmp_path / "xdg" / "traceml" / "runs-"))  # never ~/.cache itself
    a, b = default_cache_dir(["/data/a"], None), default_cache_dir(["/data/b"], None)
    assert a != b and os.path.dirname(a) == os.path.dirname(b) == str(tmp_path / "xdg" / "traceml")
    both = default_cache_dir(["traceml/runs", "/other/runs"], None)
    assert both != default_cache_dir(["traceml/runs"], None) and both == default_cache_dir(
        ["traceml/runs", "/other/runs"], None)  # keyed by the set of roots, stable
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir(["/data/a"], None).startswith(str(Path.home() / ".cache" / "traceml" / "a-"))
    assert default_cache_dir(["traceml/runs"], "my-cache") == str(tmp_path / "my-cache")
    assert default_cache_dir(["traceml/runs"], "/abs/cache") == "/abs/cache"


def test_the_old_cache_folder_is_migrated_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    root = tmp_path / "home" / "runs"
    root.mkdir(parents=True)
    old = tmp_path / "home" / ".cache"  # where a root at ~/runs used to put it
    old.mkdir()
    (old / "hidden-runs.json").write_text('["a"]')
    (old / "ui-state.json").write_text('{"view": "runs"}')
    (old / "runs.sqlite").write_bytes(b"stale")
    (old / "other-programs-file").write_text("x")
    new = default_cache_dir([str(root)], None)
    assert sorted(migrate_cache_dir([str(root)], new)) == ["hidden-runs.json", "ui-state.json"]
    assert sorted(os.listdir(new)) == ["hidden-runs.json", "ui-state.json"]  # not the old database
    assert CacheFolder(new, roots=[root]).hidden_runs() == ["a"]
    assert (old / "hidden-runs.json").exists() and (old / "other-programs-file").exists()  # nothing removed
    (old / "hidden-runs.json").write_text('["b"]')
    assert migrate_cache_dir([str(root)], new) == []  # once
    assert CacheFolder(new, roots=[root]).hidden_runs() == ["a"]


def test_cache_folder_anywhere_inside_a_root_is_refused(fake_root: Path) -> None:
    run = next(p for p in fake_root.iterdir() if p.is_dir())
    for bad in (fake_root, run / ".cache", run, fake_root / ".cache"):
        with pytest.raises(CacheError, match="inside the runs folder"):
            check_cache_dir(bad, [fake_root])
    check_cache_dir(fake_root.parent / ".cache", [fake_root])
    # One root holding another: the default cache of the first lies inside the second.
    with pytest.raises(CacheError, match="inside the runs folder"):
        check_cache_dir(fake_root.parent / ".cache", [fake_root, fake_root.parent])


def test_nothing_is_written_until_asked(tmp_path: Path) -> None:
    folder = tmp_path / "traceml" / ".cache"
    cache = CacheFolder(folder)
    assert cache.load_ui_state() == {} and cache.hidden_runs() == []
    assert not folder.exists()


# -- ui-state.json ---------------------------------------------------------------------------------


def test_ui_state_round_trip_and_limits(cache: CacheFolder) -> None:
    state = {"metrics": ["val/auc"], "filters": {"status": "running"}, "zoom": [0, 1.5]}
    cache.save_ui_state(state)
    assert cache.load_ui_state() == state
    with pytest.raises(CacheError, match="JSON object"):
        cache.save_ui_state(["not", "an", "object"])
    with pytest.raises(CacheError, match="at most"):
        cache.save_ui_state({"big": "x" * MAX_UI_STATE_BYTES})
    assert cache.load_ui_state() == state  # a refused state changes nothing


@pytest.mark.parametrize("content", [b"{not json", b"[1, 2]", b'{"a": "' + b"x" * MAX_UI_STATE_BYTES + b'"}'])
def test_a_bad_ui_state_file_gives_the_default_view_with_a_warning(cache: CacheFolder, content: bytes) -> None:
    os.makedirs(cache.path)
    Path(cache.path, "ui-state.json").write_bytes(content)
    assert cache.load_ui_state() == {}
    assert any("ui-state.json" in w for w in cache.warnings)


# -- hidden-runs.json ------------------------------------------------------------------------------


def test_hiding_and_showing_runs(cache: CacheFolder) -> None:
    assert cache.set_hidden(["/r/a", "/r/b"], True) == ["/r/a", "/r/b"]
    assert cache.set_hidden(["/r/b", "/r/c"], True) == ["/r/a", "/r/b", "/r/c"]
    assert cache.set_hidden(["/r/a"], False) == ["/r/b", "/r/c"]
    assert orjson.loads(Path(cache.path, "hidden-runs.json").read_bytes()) == ["/r/b", "/r/c"]
    assert CacheFolder(cache.path).hidden_runs() == ["/r/b", "/r/c"]
    with pytest.raises(CacheError):
        cache.set_hidden([""], True)


def test_hidden_runs_file_is_validated_entry_by_entry(cache: CacheFolder) -> None:
    os.makedirs(cache.path)
    Path(cache.path, "hidden-runs.json").write_text('["/r/a", 3, null, "", "/r/a", "/r/b", {"x": 1}]')
    assert cache.hidden_runs() == ["/r/a", "/r/b"]
    assert any("5 invalid or repeated" in w for w in cache.warnings)
    Path(cache.path, "hidden-runs.json").write_text('{"keys": ["/r/a"]}')
    assert CacheFolder(cache.path).hidden_runs() == []


# -- runs.sqlite -----------------------------------------------------------------------------------


class Monotonic:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_run_db_is_replaced_atomically_and_throttled(store: RunStore, tmp_path: Path) -> None:
    mono = Monotonic()
    cache = CacheFolder(tmp_path / ".cache", clock=Clock(), monotonic=mono)
    path = cache.save_run_db(store.runs(), store.stamps())
    assert path == str(tmp_path / ".cache" / "runs.sqlite")
    assert _files(tmp_path / ".cache") == ["runs.sqlite"]  # no temp file, no journal left
    first_inode = os.stat(path).st_ino

    runs = store.runs()
    runs[0].notes = "edited after the first save"
    mono.t += 3
    assert cache.save_run_db(runs, store.stamps()) is None  # within 10 s: later
    mono.t += 8
    assert cache.save_run_db(runs, store.stamps()) == path
    assert os.stat(path).st_ino == first_inode  # one run changed: rewritten in the file, in one transaction
    assert _files(tmp_path / ".cache") == ["runs.sqlite"]  # no journal left
    mono.t += 60
    assert cache.save_run_db(runs, store.stamps()) is None  # nothing changed: nothing written

    loaded = CacheFolder(tmp_path / ".cache").load_run_db()
    assert loaded is not None and loaded.runs[runs[0].key].summary.notes == "edited after the first save"

    # Another program wrote the file since: it is not this folder's last write, so the next save
    # writes a whole new file and renames it into place (what that program wrote is not trusted).
    con = sqlite3.connect(path)
    con.execute("UPDATE runs SET notes = 'edited by hand'")
    con.commit()
    con.close()
    for run in runs:
        run.notes = "all edited"
    mono.t += 11
    assert cache.save_run_db(runs, store.stamps()) == path
    assert os.stat(path).st_ino != first_inode
    assert _files(tmp_path / ".cache") == ["runs.sqlite"]
    again = CacheFolder(tmp_path / ".cache")
    loaded = again.load_run_db()
    assert loaded is not None and again.warnings == []
    assert {c.summary.notes for c in loaded.runs.values()} == {"all edited"}
    for run in runs:
        run.notes = ""


def test_a_restarted_viewer_rewrites_nothing_when_nothing_changed(store: RunStore, tmp_path: Path) -> None:
    CacheFolder(tmp_path / ".cache").save_run_db(store.runs(), store.stamps())
    written = os.stat(tmp_path / ".cache" / "runs.sqlite")
    later = CacheFolder(tmp_path / ".cache")
    loaded = later.load_run_db()
    assert loaded is not None and later.warnings == []
    runs = [c.summary for c in loaded.runs.values()]
    assert later.save_run_db(runs, {key: c.stamps for key, c in loaded.runs.items()}) is None
    assert os.stat(tmp_path / ".cache" / "runs.sqlite").st_ino == written.st_ino


def test_with_a_changed_hint_only_the_named_runs_are_compared_and_rewritten(store: RunStore, tmp_path: Path) -> None:
    cache = CacheFolder(tmp_path / ".cache")
    path = cache.save_run_db(store.runs(), store.stamps(), force=True)
    runs = store.runs()
    named, unnamed = runs[0], runs[1]
    notes = named.notes, unnamed.notes
    try:
        named.notes, unnamed.notes = "named", "not named"
        # Nothing named: nothing to write (the viewer names every run its polls changed).
        assert cache.save_run_db(runs, store.stamps(), force=True, changed=set()) is None
        assert cache.save_run_db(runs, store.stamps(), force=True, changed={named.key}) == path
        loaded = CacheFolder(tmp_path / ".cache").load_run_db()
        assert loaded is not None
        assert loaded.runs[named.key].summary.notes == "named"
        assert loaded.runs[unnamed.key].summary.notes != "not named"
        # Without the hint every run is compared: the other edit is found and written.
        assert cache.save_run_db(runs, store.stamps(), force=True) == path
        loaded = CacheFolder(tmp_path / ".cache").load_run_db()
        assert loaded is not None and loaded.runs[unnamed.key].summary.notes == "not named"
    finally:
        named.notes, unnamed.notes = notes


def test_hidden_runs_are_left_out_of_the_run_db(store: RunStore, tmp_path: Path) -> None:
    cache = CacheFolder(tmp_path / ".cache")
    hidden = store.runs()[3].key
    cache.set_hidden([hidden], True)
    cache.save_run_db(store.runs(), store.stamps(), force=True)
    loaded = cache.load_run_db()
    assert loaded is not None and hidden not in loaded.runs and len(loaded.runs) == 23


def test_a_corrupt_run_db_is_rebuilt(store: RunStore, tmp_path: Path) -> None:
    folder = tmp_path / ".cache"
    folder.mkdir()
    (folder / "runs.sqlite").write_bytes(b"this is not a database" * 100)
    cache = CacheFolder(folder)
    assert cache.load_run_db() is None
    assert any("runs.sqlite" in w and "rebuilding" in w for w in cache.warnings)
    cache.save_run_db(store.runs(), store.stamps(), force=True)
    loaded = CacheFolder(folder).load_run_db()
    assert loaded is not None and len(loaded.runs) == 24


# -- table exports ---------------------------------------------------------------------------------


def test_table_export_names_latest_and_same_second_collisions(store: RunStore, cache: CacheFolder) -> None:
    runs = store.runs()
    path, latest = cache.export_table_csv(runs, ["name", "run.best.val/auc"])
    assert os.path.basename(path) == "table-20261130-120000.csv"
    assert Path(path).read_bytes() == Path(latest).read_bytes()
    rows = list(csv.reader(io.StringIO(Path(latest).read_text(encoding="utf-8"))))
    assert rows[0] == ["id", "name", "status", "group", "tags", "path", "run.best.val/auc"]
    assert len(rows) == 25
    second, _ = cache.export_table_csv(runs[:2], ["name"])
    third, _ = cache.export_table_csv(runs[:3], ["name"])
    names = [os.path.basename(p) for p in (second, third)]
    assert names == ["table-20261130-120000-1.csv", "table-20261130-120000-2.csv"]
    assert len(Path(latest).read_text().splitlines()) == 4  # latest.csv is the newest export
    assert Path(path).read_bytes() != Path(latest).read_bytes()


def test_a_table_export_is_written_row_by_row_as_to_csv_and_a_bad_column_makes_no_file(
        store: RunStore, cache: CacheFolder) -> None:
    # The export streams its rows (issue 16: 100,000 rows) and writes the bytes to_csv gives;
    # latest.csv is its own file name: deleting the timestamped export leaves it whole.
    from traceml_ai.runs.table import ColumnError, to_csv

    runs = store.runs()
    columns = ["name", "config.optim.lr", "run.best.val/auc", "tags"]
    path, latest = cache.export_table_csv(runs, columns)
    want = to_csv(runs, columns).encode("utf-8")
    assert Path(path).read_bytes() == want
    os.unlink(path)
    assert Path(latest).read_bytes() == want
    before = _files(Path(latest).parent)
    with pytest.raises(ColumnError):
        cache.export_table_csv(runs, ["name", "no.such.column"])
    assert _files(Path(latest).parent) == before


def test_pruning_keeps_the_20_newest_exports_and_never_touches_other_files(store: RunStore, tmp_path: Path) -> None:
    clock = Clock()
    cache = CacheFolder(tmp_path / ".cache", clock=clock)
    exports = tmp_path / ".cache" / "exports"
    exports.mkdir(parents=True)
    strays = ["notes.txt", "table-mine.csv", "table-20200101-000000.csv.bak", "latest.csv.orig"]
    for name in strays:
        (exports / name).write_text("mine")
    for i in range(25):
        clock.t = T0 + i
        cache.export_table_csv(store.runs()[:1], ["name"])
    names = _files(exports)
    stamped = [n for n in names if n.startswith("table-2026")]
    assert len(stamped) == 20
    assert stamped[0] == "table-20261130-120005.csv" and stamped[-1] == "table-20261130-120024.csv"
    assert all(name in names for name in strays) and "latest.csv" in names
    assert (exports / "notes.txt").read_text() == "mine"


# -- chart exports ---------------------------------------------------------------------------------


def test_chart_csv_files_have_the_seed_columns(store: RunStore, cache: CacheFolder) -> None:
    runs = store.runs()
    keys = tuple(r.key for r in runs)
    cases = [
        (BarSpec(keys, "run.best.val/auc"), "plot-bar-best-val-auc-20261130-120000.csv",
         ["run", "path", "run.best.val/auc"]),
        (BarSpec(keys, "run.best.val/auc", "config.data.dataset"), None,
         ["group:config.data.dataset", "n", "mean run.best.val/auc", "min run.best.val/auc", "max run.best.val/auc"]),
        (ScatterSpec(keys, "config.optim.lr", "run.best.val/auc", "config.model.hidden", "config.data.dataset"), None,
         ["run", "path", "config.optim.lr", "run.best.val/auc", "config.model.hidden", "group:config.data.dataset"]),
        (BoxSpec(keys, "run.best.val/auc", "config.data.dataset"), None,
         ["group:config.data.dataset", "run", "path", "run.best.val/auc"]),
    ]
    for spec, name, header in cases:
        path = cache.export_chart(spec, runs, fmt="csv")
        if name:
            assert os.path.basename(path) == name
        rows = list(csv.reader(io.StringIO(Path(path).read_text(encoding="utf-8"))))
        assert rows[0] == header and len(rows) > 1
    baseline = store.find("baseline")
    path = cache.export_chart(LineSpec((baseline.key,), ("val/auc",)), [baseline],
                              [(baseline, store.history(baseline.key))], fmt="csv")
    assert os.path.basename(path) == "plot-val-auc-20261130-120000.csv"
    rows = list(csv.reader(io.StringIO(Path(path).read_text(encoding="utf-8"))))
    assert rows[0] == ["run", "path", "step", "epoch", "time_s", "val/auc"]
    assert len(rows) - 1 == sum("val/auc" in r for r in store.history(baseline.key).rows)


def _phys(data: bytes) -> tuple[int, int, int]:
    pos = 8
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        if data[pos + 4 : pos + 8] == b"pHYs":
            return struct.unpack(">IIB", data[pos + 8 : pos + 17])  # type: ignore[return-value]
        pos += 12 + length
    raise AssertionError("no pHYs chunk")


@pytest.mark.parametrize("kind", ["line", "bar", "scatter", "box"])
def test_png_export_is_a_300_dpi_png(store: RunStore, cache: CacheFolder, kind: str) -> None:
    pytest.importorskip("matplotlib")
    runs = store.runs()
    keys = tuple(r.key for r in runs)
    spec = {
        "line": LineSpec(keys[:4], ("val/auc", "train/loss"), ema=0.6, log_y=True),
        "bar": BarSpec(keys, "run.best.val/auc", "config.data.dataset"),
        "scatter": ScatterSpec(keys, "config.optim.lr", "run.best.val/auc", None, "config.data.dataset", log_x=True),
        "box": BoxSpec(keys, "run.best.val/auc", "config.data.dataset"),
    }[kind]
    histories = [(r, store.history(r.key)) for r in runs[:4]] if kind == "line" else []
    path = cache.export_chart(spec, runs[:4] if kind == "line" else runs, histories, fmt="png", max_points=200)
    assert path.endswith(".png") and os.path.dirname(path) == os.path.join(cache.path, "plots")
    data = Path(path).read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and is_png(data)
    assert _phys(data) == (11811, 11811, 1)  # 300 DPI in pixels per metre
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 2000 and height >= 1000


def test_a_no_data_chart_is_a_300_dpi_png_too() -> None:
    pytest.importorskip("matplotlib")
    from traceml_ai.ui.png import render_chart_png

    data = render_chart_png(BarSpec((), "name"), [])  # no numbers: a "no data" chart, still a PNG
    assert is_png(data) and round(png_dpi(data) or 0) == 300  # savefig(dpi=300) writes the pHYs chunk
    assert not is_png(b"GIF89a....") and not is_png(data[:-5])


def test_plots_keep_the_50_newest_of_each_kind_and_leave_strays_alone(store: RunStore, tmp_path: Path) -> None:
    clock = Clock()
    cache = CacheFolder(tmp_path / ".cache", clock=clock)
    plots = tmp_path / ".cache" / "plots"
    plots.mkdir(parents=True)
    (plots / "notes.txt").write_text("mine")
    (plots / "plot-mine.png").write_bytes(b"mine")
    (plots / "plot-val-auc-20200101-000000.png").write_bytes(b"an old png")  # matches: the oldest png
    spec = BarSpec((), "run.best.val/auc")
    for i in range(55):
        clock.t = T0 + i
        cache.export_chart(spec, store.runs(), fmt="csv")
    names = _files(plots)
    assert len([n for n in names if n.startswith("plot-bar-") and n.endswith(".csv")]) == 50
    assert "plot-bar-best-val-auc-20261130-120004.csv" not in names
    assert "plot-bar-best-val-auc-20261130-120005.csv" in names
    # Pruning CSVs never removes PNGs, and files of other names are never touched.
    assert {"notes.txt", "plot-mine.png", "plot-val-auc-20200101-000000.png"} <= set(names)


def test_a_symlinked_plots_folder_is_refused(store: RunStore, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / ".cache"
    folder.mkdir()
    (folder / "plots").symlink_to(outside)
    with pytest.raises(CacheError, match="not a folder"):
        CacheFolder(folder).export_chart(BarSpec((), "run.best.val/auc"), store.runs(), fmt="csv")
    assert list(outside.iterdir()) == []


def test_slugs_are_safe_ascii() -> None:
    assert slugify("val/auc") == "val-auc"
    assert slugify("bar best val/auc") == "bar-best-val-auc"
    assert slugify("Genauigkeit/über alles") == "genauigkeit-uber-alles"
    assert slugify("../../etc/passwd") == "etc-passwd"
    assert slugify("損失") == "chart"
    assert len(slugify("x" * 500)) == 60


def test_chart_names_are_safe_for_any_metric_name(store: RunStore, cache: CacheFolder) -> None:
    baseline = store.find("baseline")
    spec = LineSpec((baseline.key,), ("../../evil name/ü",))
    path = cache.export_chart(spec, [baseline], [(baseline, store.history(baseline.key))], fmt="csv")
    assert os.path.dirname(path) == os.path.join(cache.path, "plots")
    assert os.path.basename(path) == "plot-evil-name-u-20261130-120000.csv"


def test_an_empty_table_is_not_exported_and_latest_csv_keeps_the_last_export_with_rows(
        store: RunStore, cache: CacheFolder) -> None:
    runs = store.runs()
    _, latest = cache.export_table_csv(runs[:3], ["name"])
    before = _files(Path(latest).parent)
    kept = Path(latest).read_bytes()
    with pytest.raises(CacheError, match="nothing to export: the table shows no runs"):
        cache.export_table_csv([], ["name"])
    assert _files(Path(latest).parent) == before and Path(latest).read_bytes() == kept
