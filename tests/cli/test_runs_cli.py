"""`traceml runs ls / show` and `traceml demo`, run as real commands (`traceml query`: tests/catalog)."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import run_traceml
from traceml_ai.runs.fake import generate
from traceml_ai.runs.store import RunStore


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fake") / "runs"
    generate(root, runs=24, seed=0)
    return root


def _ls_json(*args: str) -> dict[str, dict]:
    proc = run_traceml("runs", "ls", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    return {row["name"]: row for row in rows}


def test_a_run_linked_from_a_sibling_folder_with_the_roots_name_as_prefix_is_not_listed(tmp_path: Path) -> None:
    """``runs-private`` sits beside the root ``runs`` and starts with its name: a symlink into it leaves
    the root as much as one into ``/etc`` does (and one of its files linked into a run is not read)."""
    root, private = tmp_path / "runs", tmp_path / "runs-private"
    for folder, name in ((root / "mine", "mine"), (private / "theirs", "their secret run")):
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps({"schema_version": 1, "name": name, "status": "completed"}))
    (private / "params.yaml").write_text("api_key: their-secret-key\n")
    (root / "peek").symlink_to(private / "theirs", target_is_directory=True)
    (root / "mine" / "params.yaml").symlink_to(private / "params.yaml")
    proc = run_traceml("runs", "ls", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["name"] for line in proc.stdout.splitlines()] == ["mine"]
    shown = run_traceml("runs", "show", "mine", "--root", str(root), "--json")
    assert shown.returncode == 0, shown.stderr
    assert "their-secret-key" not in shown.stdout and "api_key" not in shown.stdout
    assert "their secret run" not in proc.stdout + shown.stdout


def test_ls_json_shows_every_special_run_with_its_status(fake_root: Path) -> None:
    rows = _ls_json(str(fake_root))
    assert len(rows) == 24
    assert rows["stale-run"]["display_status"] == "stale"
    assert rows["stale-run"]["status"] == "running"
    assert rows["legacy-run"]["display_status"] == "legacy"
    assert rows["failed-run"]["display_status"] == "failed"
    assert rows["killed-run"]["display_status"] == "killed"
    assert rows["baseline"]["display_status"] == "completed" and rows["baseline"]["warnings"] == []
    assert any("schema_version 2" in w for w in rows["future-schema"]["warnings"])
    assert any("corrupt line" in w for w in rows["malformed-lines"]["warnings"])


def test_ls_filter_sort_and_columns(fake_root: Path) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "run.best.val/auc>=0.9", "--sort",
                       "-run.best.val/auc", "--columns", "name,run.best.val/auc", "--json")
    assert proc.returncode == 0, proc.stderr
    values = [json.loads(line)["values"]["run.best.val/auc"] for line in proc.stdout.splitlines()]
    assert values and all(v >= 0.9 for v in values)
    assert values == sorted(values, reverse=True)


def test_ls_terminal_rows_always_name_their_run(fake_root: Path) -> None:
    """Review 13d: ``--columns run.best.val/auc`` printed rows nobody could tell apart."""
    proc = run_traceml("runs", "ls", str(fake_root), "--columns", "run.best.val/auc", "--filter", "name=baseline")
    assert proc.returncode == 0, proc.stderr
    header, row = proc.stdout.splitlines()[:2]
    assert header.split() == ["name", "run.best.val/auc"] and row.split()[0] == "baseline"


def test_ls_status_and_search(fake_root: Path) -> None:
    rows = _ls_json(str(fake_root), "--status", "failed,killed")
    assert set(rows) == {"failed-run", "nan-loss", "killed-run"}
    rows = _ls_json(str(fake_root), "--search", "LEGACY")
    assert set(rows) == {"legacy-run"}


def test_ls_csv_starts_with_the_six_fixed_columns(fake_root: Path) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), "--csv")
    assert proc.returncode == 0, proc.stderr
    reader = csv.reader(io.StringIO(proc.stdout))
    header = next(reader)
    assert header[:6] == ["id", "name", "status", "group", "tags", "path"] and len(header) > 6
    rows = list(reader)
    assert len(rows) == 24 and all(os.path.isdir(r[5]) for r in rows)


def test_ls_csv_with_columns_has_only_those(fake_root: Path) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), "--csv", "--columns", "config.optim.lr,summary.test/auc")
    assert proc.returncode == 0, proc.stderr
    reader = csv.reader(io.StringIO(proc.stdout))
    assert next(reader) == ["config.optim.lr", "summary.test/auc"]
    assert len(list(reader)) == 24
    proc = run_traceml("runs", "ls", str(fake_root), "--csv", "--columns", "name,path", "--group-by", "group")
    assert proc.returncode == 0, proc.stderr
    assert next(csv.reader(io.StringIO(proc.stdout))) == ["group:group", "name", "path"]


def test_ls_non_number_ordering_filter_on_a_number_column_is_bad_usage(fake_root: Path) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "run.best.val/auc>=abc")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: filter 'run.best.val/auc>=abc': 'abc' is not a number, and "
                                   "run.best.val/auc holds numbers; write e.g. run.best.val/auc>=0.8")
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "run.best.val/auc:a..z")
    assert proc.returncode == 2 and "is not numeric" in proc.stderr
    for mixed in ("abc..1", "0.5..abc"):  # (review: abc..1 was "the low end is above the high end")
        proc = run_traceml("runs", "ls", str(fake_root), "--filter", f"run.best.val/auc:{mixed}")
        assert proc.returncode == 2 and f"the range {mixed} is not numeric" in proc.stderr, proc.stderr
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "name>=m", "--json")  # text column: fine
    assert proc.returncode == 0, proc.stderr


def test_ls_status_filter_no_run_can_match_is_bad_usage(fake_root: Path) -> None:
    """Issue 14: ``status=faild`` listed 0 runs with exit 0; the statuses are the format's fixed set."""
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "status=faild")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: filter 'status=faild': 'faild' is not a run status; did you mean "
                                   "'failed'? the statuses are running, running?, stale, completed, failed, "
                                   "killed, legacy, unknown")
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "status=failed", "--json")
    assert proc.returncode == 0 and proc.stdout, proc.stderr


def test_ls_perf_verdict_filter_with_a_typo_is_bad_usage(fake_root: Path) -> None:
    """Issue 13 review: ``perf.verdict=inputbound`` listed 0 runs with exit 0."""
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "perf.verdict=inputbound")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: filter 'perf.verdict=inputbound': 'inputbound' is not a verdict; "
                                  "did you mean 'input_bound'? the verdicts are input_bound, "), proc.stderr
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "perf.telemetry=pending", "--json")
    assert proc.returncode == 0, proc.stderr


def test_ls_word_on_a_metric_no_run_logged_is_bad_usage(tmp_path: Path) -> None:
    """A metric's values are numbers by the format: ``>=abc`` is refused before any run is read."""
    root = tmp_path / "runs"
    generate(root, runs=2, seed=1)
    proc = run_traceml("runs", "ls", str(root), "--filter", "run.best.val/acc>=abc")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: filter 'run.best.val/acc>=abc': 'abc' is not a number, and "
                                   "run.best.val/acc holds numbers; write e.g. run.best.val/acc>=0.8")


def test_ls_table_groups_rows(fake_root: Path) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), "--group-by", "config.data.dataset")
    assert proc.returncode == 0, proc.stderr
    assert "config.data.dataset = cifar10" in proc.stdout
    assert "24 runs (" in proc.stdout and " of 24 runs" not in proc.stdout


def test_ls_missing_root_is_one_line_error(tmp_path: Path) -> None:
    proc = run_traceml("runs", "ls", str(tmp_path / "nope"))
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: no runs folder found")
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr


def test_ls_one_missing_root_of_two_is_a_warning(fake_root: Path, tmp_path: Path) -> None:
    proc = run_traceml("runs", "ls", str(tmp_path / "nope"), str(fake_root), "--json")
    assert proc.returncode == 0
    assert "runs folder not found, skipped" in proc.stderr
    assert len(proc.stdout.splitlines()) == 24


@pytest.mark.parametrize("args", [
    ["--filter", "name:/([/"],  # invalid regular expression
    ["--filter", "config.optim.lr:1.."],  # a range without its high end
    ["--filter", "nosuchcolumn>1"],
    ["--sort", "nosuchcolumn"],
    ["--columns", ",,"],
    ["--json", "--csv"],
])
def test_ls_bad_usage_is_one_line_error_with_exit_code_2(fake_root: Path, args: list[str]) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error:") and len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args", [
    ["--columns", "name,perf.bogus"],
    ["--sort", "perf.bogus"],
    ["--filter", "perf.bogus>1"],
    ["--group-by", "perf.bogus"],
])
def test_ls_an_unknown_perf_column_is_an_error_naming_the_known_ones(fake_root: Path, args: list[str]) -> None:
    """Issue 13 review: ``--columns perf.bogus`` printed a blank column instead of an error."""
    proc = run_traceml("runs", "ls", str(fake_root), *args)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("error:") and len(proc.stderr.strip().splitlines()) == 1
    assert "'perf.bogus'" in proc.stderr
    assert "perf.step_ms.p50" in proc.stderr and "perf.share.dataloader" in proc.stderr


def test_ls_a_misspelt_perf_column_gets_the_closest_one_and_known_ones_work(fake_root: Path) -> None:
    near = run_traceml("runs", "ls", str(fake_root), "--columns", "perf.share.dataloder")
    assert near.returncode == 2 and "did you mean 'perf.share.dataloader'" in near.stderr
    ok = run_traceml("runs", "ls", str(fake_root), "--columns", "name,perf.step_ms.p50,perf.share.h2d", "--csv")
    assert ok.returncode == 0, ok.stderr


def test_ls_open_ended_range_with_inf(fake_root: Path) -> None:
    rows = _ls_json(str(fake_root), "--filter", "run.best.val/auc:0.9..inf")
    assert rows and all(r["values"]["run.best.val/auc"] >= 0.9 for r in rows.values())


def test_ls_group_by_is_kept_in_json_and_csv(fake_root: Path) -> None:
    rows = _ls_json(str(fake_root), "--group-by", "config.data.dataset")
    assert rows["baseline"]["group_by"] == {"column": "config.data.dataset", "label": "cifar10"}
    assert rows["legacy-run"]["group_by"]["label"] == "cifar10"
    proc = run_traceml("runs", "ls", str(fake_root), "--group-by", "config.data.dataset", "--csv")
    header, *lines = list(csv.reader(io.StringIO(proc.stdout)))
    assert header[6] == "group:config.data.dataset"
    labels = [line[6] for line in lines]
    assert labels == sorted(labels, key=lambda x: (x == "(none)", x))  # rows come group by group


def test_ls_table_fits_a_narrow_terminal(fake_root: Path) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), env={"COLUMNS": "90"})
    assert proc.returncode == 0, proc.stderr
    table_lines = proc.stdout.split("24 runs (")[0].splitlines()
    assert all(len(line) <= 90 for line in table_lines)
    assert "did not fit" in proc.stdout


def test_control_characters_in_names_never_reach_the_terminal(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    run = root / "20261130-101500_evil_abcd"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"name": "\x1b[31mred\nx2", "status": "completed"}))
    proc = run_traceml("runs", "ls", str(root))
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\\x1b[31mred\\x0ax2" in proc.stdout  # one row, escaped


def test_one_unreadable_number_never_hides_other_runs(fake_root: Path, tmp_path: Path) -> None:
    root = tmp_path / "runs"
    shutil.copytree(fake_root, root)
    bad = next(root.glob("*_baseline_*"))
    (bad / "run.json").write_text('{"name": "baseline", "status": "completed", "x": ' + "9" * 5000 + "}")
    (bad / "params.yaml").write_text("a: " + "9" * 5000 + "\n")
    with open(bad / "metrics.jsonl", "a") as f:
        f.write('{"step": 99, "big": ' + "9" * 5000 + "}\n")
    rows = _ls_json(str(root))
    assert len(rows) == 24
    warnings = " ".join(rows["20261117-010345_baseline_4309"]["warnings"] if "20261117-010345_baseline_4309" in rows
                        else next(r for r in rows.values() if r["id"] == bad.name)["warnings"])
    assert "run.json" in warnings and "params.yaml" in warnings
    assert rows["high-lr"]["warnings"] == []
    shown = run_traceml("runs", "show", bad.name, "--root", str(root))
    assert shown.returncode == 0, shown.stderr


@pytest.mark.parametrize(("env", "words"), [
    ({"TRACEML_MAX_METRICS_FILE_MB": "inf"}, ["max_metrics_file_mb", "finite"]),
    ({"TRACEML_STALE_AFTER_SECONDS": "soon"}, ["stale_after_seconds", "valid number"]),
])
def test_a_bad_setting_is_bad_usage_in_one_line_naming_its_source(
    fake_root: Path, env: dict[str, str], words: list[str],
) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), env=env)
    assert proc.returncode == 2  # a bad setting is bad usage, like a bad flag (DESIGN §7)
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert f"from environment {next(iter(env))}:" in proc.stderr  # where the value came from
    assert all(w in proc.stderr for w in words), proc.stderr


def test_show_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    proc = run_traceml("runs", "show", str(tmp_path / "empty"))
    assert proc.returncode == 1 and "not a run folder" in proc.stderr


def test_demo_never_deletes_runs_it_did_not_write(tmp_path: Path) -> None:
    mine = tmp_path / "traceml" / "runs" / "20261130-101500_mine_abcd"
    mine.mkdir(parents=True)
    (mine / "run.json").write_text('{"status": "completed"}')
    proc = run_traceml("demo", "--workspace", str(tmp_path), "--epochs", "1", "--fake-runs", "1")
    assert proc.returncode == 1 and "did not write" in proc.stderr
    assert (mine / "run.json").exists()


def test_the_environment_beats_the_settings_file_and_a_flag_beats_both(fake_root: Path, tmp_path: Path) -> None:
    """DESIGN §6: flag > TRACEML_<NAME> > traceml.yaml > default, seen as which runs `runs ls` lists."""
    env_root, flag_root = tmp_path / "env-runs", tmp_path / "flag-runs"
    generate(env_root, runs=3, seed=1)
    generate(flag_root, runs=2, seed=2)
    (tmp_path / "traceml.yaml").write_text(f"roots: [{json.dumps(str(fake_root))}]\n")

    def listed(*args: str, env: dict[str, str] | None = None) -> int:
        proc = run_traceml("runs", "ls", *args, "--json", cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        return len(proc.stdout.splitlines())

    assert listed() == 24  # the settings file sets the roots
    assert listed(env={"TRACEML_ROOTS": str(env_root)}) == 3  # the environment over the file
    assert listed(str(flag_root), env={"TRACEML_ROOTS": str(env_root)}) == 2  # the flag over both


def test_show_failed_run_has_error_callout(fake_root: Path) -> None:
    proc = run_traceml("runs", "show", "failed-run", "--root", str(fake_root))
    assert proc.returncode == 0, proc.stderr
    assert "OutOfMemoryError" in proc.stdout and "CUDA out of memory" in proc.stdout
    assert "Traceback (most recent call last)" in proc.stdout
    assert "exit code 1" in proc.stdout


def test_show_warns_about_file_problems(fake_root: Path) -> None:
    proc = run_traceml("runs", "show", "malformed-lines", "--root", str(fake_root))
    assert proc.returncode == 0, proc.stderr
    assert "file problems" in proc.stdout and "corrupt line" in proc.stdout


def _named_runs(root: Path, name: str, started: list[str]) -> list[str]:
    """Finished runs all named ``name``, started at the given times; their ids."""
    ids = []
    for i, when in enumerate(started):
        run_id = f"20261130-10150{i}_{name}_{i:04x}"
        (root / run_id).mkdir(parents=True)
        (root / run_id / "run.json").write_text(json.dumps(
            {"schema_version": 1, "id": run_id, "name": name, "status": "completed", "started_at": when}))
        ids.append(run_id)
    return ids


def test_show_a_name_of_several_runs_shows_the_newest_with_a_note(tmp_path: Path) -> None:
    """Issue 14: a name matching several runs takes the newest and says how to pick another."""
    root = tmp_path / "runs"
    ids = _named_runs(root, "baseline", ["2026-11-30T10:15:00Z", "2026-11-30T12:00:00Z", "2026-11-30T11:00:00Z"])
    proc = run_traceml("runs", "show", "baseline", "--root", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["id"] == ids[1]
    assert proc.stderr.strip() == (f"note: 3 runs are named 'baseline'; using the newest, {ids[1]} (started "
                                   "2026-11-30T12:00:00Z); name another by its id or folder path (traceml runs "
                                   "ls --filter name=baseline lists them)")
    proc = run_traceml("runs", "show", ids[0], "--root", str(root), "--json")  # another one, by its id
    assert proc.returncode == 0 and json.loads(proc.stdout)["id"] == ids[0] and proc.stderr == ""


def test_show_unknown_run(fake_root: Path) -> None:
    proc = run_traceml("runs", "show", "no-such-run", "--root", str(fake_root))
    assert proc.returncode == 1 and "no run 'no-such-run'" in proc.stderr


@pytest.mark.timeout(900)  # two real demos: three trainings
def test_demo_trains_a_real_model_beside_fake_runs(tmp_path: Path) -> None:
    proc = run_traceml("demo", "--workspace", str(tmp_path / "ws"), "--epochs", "8", "--no-ui", timeout=300)
    assert proc.returncode == 0, proc.stderr
    store = RunStore([tmp_path / "ws" / "traceml" / "runs"])
    store.poll()
    runs = {r.name: r for r in store.runs()}
    real = runs["digits-mlp"]
    assert real.display_status == "completed" and real.step == 7
    assert real.best["val/acc"].value is not None and real.best["val/acc"].value > 0.5  # it really learned
    assert 0.5 < float(real.summary["test/acc"]) <= 1.0  # type: ignore[arg-type]
    assert runs["stale-run"].display_status == "stale"
    assert runs["legacy-run"].display_status == "legacy"
    assert runs["failed-run"].error is not None
    # one run trained with PyTorch under `traceml run`, with its telemetry and diagnosis
    captured = runs["digits-torch-captured"]
    assert captured.display_status == "completed" and captured.group == "captured"
    assert (Path(captured.path) / "aggregator" / "telemetry.sqlite").is_file()
    assert (Path(captured.path) / "aggregator" / "final_summary.json").is_file()
    # The demo can run again over its own workspace.
    again = run_traceml("demo", "--workspace", str(tmp_path / "ws"), "--epochs", "2", "--fake-runs", "3", "--no-ui",
                        timeout=300)
    assert again.returncode == 0, again.stderr



def test_ls_group_headers_are_whole(fake_root: Path) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), "--group-by", "id", "--columns", "name,status",
                       env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    ids = sorted(p.name for p in fake_root.iterdir() if p.is_dir())
    headers = [line for line in proc.stdout.splitlines() if line.startswith("id = ")]
    assert sorted(h.split(" = ", 1)[1].rsplit("  (", 1)[0] for h in headers) == ids
    assert "…" not in "".join(headers)


def test_ls_of_an_empty_folder_says_how_to_get_runs(tmp_path: Path, fake_root: Path) -> None:
    empty = tmp_path / "traceml" / "runs"
    empty.mkdir(parents=True)
    proc = run_traceml("runs", "ls", str(empty))
    assert proc.returncode == 0, proc.stderr
    assert "0 runs" in proc.stdout and "0 of 0" not in proc.stdout
    assert "traceml run SCRIPT" in proc.stdout and "--filter" not in proc.stdout
    proc = run_traceml("runs", "ls", str(fake_root), "--search", "no-such-run-anywhere")
    assert proc.returncode == 0, proc.stderr
    assert "0 of 24 runs" in proc.stdout and "no run matches" in proc.stdout


@pytest.mark.parametrize("width", [200, 80, 24])
def test_run_table_lines_print_as_richs_table_would(width: int) -> None:
    """`runs ls` lays out its rows itself (Rich's table layout cost more than reading 27 runs): every
    character and its colour must come out as Rich's Table(box=None) prints them, cut cells, wide
    characters, right-aligned numbers and a table wider than the terminal included."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from traceml_ai.cli import runs as runs_cli

    cols = ["name", "status", "tags", "run.best.val/auc"]
    widths = [32, 9, 6, 16]
    rows = [
        [("⚠", "yellow"), ("a-run-name-much-longer-than-the-column", "bold"), ("killed", "magenta"),
         ("精度✓精度", ""), ("0.9123 ", "")],
        [("", ""), ("short", "bold"), ("running", "bold green"), ("", ""), ("12", "")],
        [("", ""), ("x" * 32, "bold"), ("", ""), ("a, b, c, d", "dim"), ("", "")],
        [("", ""), ("精" * 20, "bold"), ("failed", "bold red"), ("", ""), ("1234567890123456789", "")],
    ]

    def printed(renderable: object) -> list[list[tuple[str, object]]]:
        console = Console(file=io.StringIO(), width=width, force_terminal=True, color_system="truecolor")
        console.print(renderable, soft_wrap=isinstance(renderable, Text))
        out = []
        for line in console.file.getvalue().split("\n"):  # type: ignore[attr-defined]
            text = Text.from_ansi(line)
            out.append([(ch, text.get_style_at_offset(console, i)) for i, ch in enumerate(text.plain)])
        return out

    for show_header in (True, False):
        table = Table(show_lines=False, header_style="bold", pad_edge=False, box=None, show_header=show_header)
        table.add_column("", no_wrap=True, width=1)
        for c, w in zip(cols, widths, strict=True):
            table.add_column(c, justify="right" if c.startswith("run.") else "left", no_wrap=True,
                             overflow="ellipsis", width=w)
        for row in rows:
            table.add_row(*(Text(text, style=style) for text, style in row))
        runs_cli.out = Console(width=width)
        ours = runs_cli._table(cols, widths, rows, show_header)
        assert printed(ours) == printed(table)
        if width == 200:
            assert isinstance(ours, Text)  # laid out here, not by Rich's Table


def test_ls_filters_the_time_columns_by_date_and_refuses_what_is_no_date(fake_root: Path) -> None:
    # Issue 14 review: `started>2026` (a timestamp column) matched nothing with exit 0.
    proc = run_traceml("runs", "ls", str(fake_root), "--csv", "--columns", "started")
    started = sorted(row[0] for row in list(csv.reader(io.StringIO(proc.stdout)))[1:])
    day = started[len(started) // 2][:10]  # a day some runs started on

    def names(*filters: str) -> list[str]:
        args = [a for f in filters for a in ("--filter", f)]
        out = run_traceml("runs", "ls", str(fake_root), *args, "--csv", "--columns", "started")
        assert out.returncode == 0, out.stderr
        return sorted(row[0] for row in list(csv.reader(io.StringIO(out.stdout)))[1:])

    year = started[0][:4]
    assert names(f"started>={year}") == started and names(f"started<{year}") == []
    assert names(f"started>{day}") == [s for s in started if s[:10] > day]
    assert names(f"started>={day}") == [s for s in started if s[:10] >= day]
    assert names(f"started<={day}") == [s for s in started if s[:10] <= day]
    assert names(f"started={day}") == [s for s in started if s[:10] == day] != []
    assert names(f"started:{started[0][:10]}..{day}") == [s for s in started if s[:10] <= day]
    assert names(f"started>={day}T12:00") == [s for s in started if s >= f"{day}T12:00"]
    for bad in ("started>abc", "started>=2026-13-01", "ended:2026..soon"):
        proc = run_traceml("runs", "ls", str(fake_root), "--filter", bad)
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr
        column = bad.split(">")[0].split(":")[0]
        assert proc.stderr.strip().startswith(f"error: filter {bad!r}: ")
        assert f"is not a date or time, and {column} holds times (ISO-8601 UTC); write 2026, 2026-11, " in proc.stderr
        assert proc.stderr.count("\n") == 1


def test_ls_a_word_compared_for_equality_with_a_number_column_is_bad_usage(fake_root: Path) -> None:
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "run.best.val/auc=abc")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == ("error: filter 'run.best.val/auc=abc': 'abc' is not a number, and "
                                   "run.best.val/auc holds numbers, so it would match no run; "
                                   "write e.g. run.best.val/auc=0.8")
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "run.best.val/auc!=abc")
    assert proc.returncode == 2 and "so it would match every run" in proc.stderr
    proc = run_traceml("runs", "ls", str(fake_root), "--filter", "name=abc", "--json")  # text column: fine
    assert proc.returncode == 0 and proc.stdout == ""


@pytest.mark.parametrize("fmt", [["--json"], ["--csv"], []], ids=["json", "csv", "table"])
def test_a_reader_that_stops_reading_ends_the_listing_quietly(tmp_path: Path, fmt: list[str]) -> None:
    # Issue 14 review: `traceml runs ls --json | head -1` printed "error: [Errno 32] Broken pipe"
    # and exited 1. Enough runs that the output outgrows the pipe, then the reader goes.
    import subprocess
    import sys

    generate(tmp_path / "runs", runs=300, seed=3)
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "traceml_ai", "runs", "ls", str(tmp_path / "runs"), *fmt],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert b"Broken pipe" not in err and b"error" not in err


def test_the_readmes_duration_filter_lists_the_runs_longer_than_an_hour(fake_root: Path) -> None:
    # README, "Columns": traceml runs ls --filter 'duration_s>3600', as written there.
    readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    assert "`traceml runs ls --filter 'duration_s>3600'`" in readme
    rows = _ls_json(str(fake_root), "--filter", "duration_s>3600", "--columns", "name,duration_s")
    everyone = _ls_json(str(fake_root), "--columns", "name,duration_s")
    longer = {name for name, r in everyone.items() if (r["values"]["duration_s"] or 0) > 3600}
    assert longer and set(rows) == longer
    assert all(r["values"]["duration_s"] > 3600 for r in rows.values())


def test_ls_warnings_of_two_runs_sharing_a_name_say_which_run(tmp_path: Path) -> None:
    """Review 13e: two runs named ``same`` were warned about as "⚠ same: …" twice."""
    root = tmp_path / "runs"
    for run_id in ("20261204-101500_same_20ba", "20261204-111500_same_2814"):
        run_dir = root / run_id
        run_dir.mkdir(parents=True)
        (run_dir / "run.json").write_text(json.dumps({"schema_version": 1, "name": "same", "status": "completed",
                                                      "started_at": "2026-12-04T10:15:00Z"}))
        (run_dir / "metrics.jsonl").write_text('{"step": 1, "metrics": {"loss": 1.0}}\nnot json\n')
    proc = run_traceml("runs", "ls", str(root))
    assert proc.returncode == 0, proc.stderr
    warned = [line for line in proc.stdout.splitlines() if line.startswith("⚠ same")]
    assert sorted(line.split(":")[0] for line in warned) == ["⚠ same · 20ba", "⚠ same · 2814"], proc.stdout
