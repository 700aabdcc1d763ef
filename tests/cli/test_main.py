"""The top-level ``traceml`` command: fast start (nothing heavy imported), plain help that fits."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import run_traceml
from traceml_ai.runs.fake import generate

HEAVY = ("torch", "matplotlib", "starlette", "uvicorn", "opentelemetry", "ray", "numpy", "msgspec", "jsonschema",
         "psutil", "pydantic_settings")

# Runs the real command (main() as the console script calls it) and then reports which modules it left
# imported: what `traceml ...` costs at start-up is what it imports.
RUNNER = """
import json, sys
sys.argv = ["traceml", *sys.argv[1:]]
from traceml_ai.cli.main import main
try:
    main()
except SystemExit as e:
    code = e.code
else:
    code = 0
sys.stderr.write("\\nMODULES " + json.dumps({"code": code, "modules": sorted(sys.modules)}) + "\\n")
"""


def _modules_after(*args: str) -> tuple[int, set[str]]:
    env = {**os.environ, "COLUMNS": "120"}
    env.pop("TRACEML_RUN_DIR", None)
    proc = subprocess.run([sys.executable, "-c", RUNNER, *args], capture_output=True, text=True, env=env,
                          timeout=120)
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("MODULES "))
    report = json.loads(line[len("MODULES "):])
    return report["code"], {m.split(".")[0] for m in report["modules"]}


@pytest.mark.parametrize("args", [("--help",), ("runs", "ls", "ROOT"), ("runs", "ls", "ROOT", "--json")])
def test_quick_commands_import_nothing_heavy(tmp_path: Path, args: tuple[str, ...]) -> None:
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=27, seed=0)
    code, modules = _modules_after(*(str(root) if a == "ROOT" else a for a in args))
    assert code in (0, None)
    assert not modules & set(HEAVY), f"traceml {' '.join(args)} imported {sorted(modules & set(HEAVY))}"


def test_plain_listing_loads_neither_pydantic_nor_pyyaml(tmp_path: Path) -> None:
    # The fake set has a hand-written nested params.yaml; with no setting given nothing needs validating.
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=27, seed=0)
    code, modules = _modules_after("runs", "ls", str(root))
    assert code in (0, None)
    assert not modules & {"pydantic", "pydantic_core", "yaml"}, sorted(modules & {"pydantic", "pydantic_core", "yaml"})


def test_option_values_are_still_checked_and_converted_by_typer(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    generate(root, runs=27, seed=0)
    proc = run_traceml("runs", "ls", str(root), "--stale-after-seconds", "abc")
    assert proc.returncode == 2
    assert "Invalid value for '--stale-after-seconds'" in proc.stderr and "number" in proc.stderr
    proc = run_traceml("runs", "show", "baseline", "--root", str(root), "--tail", "x")
    assert proc.returncode == 2 and "Invalid value for '--tail'" in proc.stderr
    proc = run_traceml("runs", "ls", str(root), "--stale-after-seconds", "-1")
    assert proc.returncode == 2 and "stale_after_seconds" in proc.stderr and "greater than 0" in proc.stderr
    status = {}
    for after in ("60", "1e9"):  # the stale run's heartbeat is minutes old
        proc = run_traceml("runs", "ls", str(root), "--stale-after-seconds", after, "--json")
        assert proc.returncode == 0, proc.stderr
        rows = {row["name"]: row for row in map(json.loads, proc.stdout.splitlines())}
        status[after] = rows["stale-run"]["display_status"]
    assert status == {"60": "stale", "1e9": "running"}


def test_help_lists_every_command_on_whole_lines() -> None:
    from traceml_ai.cli.main import COMMANDS

    proc = run_traceml("--help", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert "(soon)" not in proc.stdout and "<bool>" not in proc.stdout
    assert all(len(line) <= 80 for line in proc.stdout.splitlines())
    assert proc.stdout.startswith("Usage: traceml ")
    assert "..." not in proc.stdout.split("Commands:")[1]  # no command's line is cut
    for name, spec in COMMANDS.items():
        assert f"  {name} " in proc.stdout and spec.summary.split()[0] in proc.stdout


def test_every_listed_command_loads_and_has_help() -> None:
    from traceml_ai.cli import capture
    from traceml_ai.cli.main import COMMANDS, load_command

    for name, spec in COMMANDS.items():
        command = load_command(name)
        assert command.name == name and command.short_help == spec.summary
        if spec.module == "traceml_ai.cli.capture" and name != "serve":
            assert spec.context_settings == capture.PASS_THROUGH


def test_subcommand_help_is_plain_and_not_cut() -> None:
    proc = run_traceml("runs", "--help", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert "..." not in proc.stdout.split("Commands:")[1] and "╭" not in proc.stdout
    proc = run_traceml("run", "--help", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    assert "<bool>" not in proc.stdout and "--nproc-per-node" in proc.stdout
    assert all(len(line) <= 80 for line in proc.stdout.splitlines())


def test_help_at_80_columns_never_splits_an_option_name_or_a_hyphenated_word() -> None:
    # Issue 14 review: `--nproc-per-` / `node` across two lines in `traceml run --help`.
    for command in [("--help",), *_every_command()]:
        args = command if command == ("--help",) else (*command, "--help")
        proc = run_traceml(*args, env={"COLUMNS": "80"})
        assert proc.returncode == 0, proc.stderr
        lines = proc.stdout.splitlines()
        assert all(len(line) <= 80 for line in lines), args
        split = [line for line in lines if re.search(r"[A-Za-z0-9]-$", line)]
        assert split == [], (args, split)
    text = run_traceml("run", "--help", env={"COLUMNS": "80"}).stdout
    assert "--nproc-per-node 2 for two ranks" in " ".join(text.split())
    assert "\u2011" not in text  # the stand-in hyphen never reaches the terminal


TYPE_DESCRIPTOR = re.compile(r"<(?:str|int|float|bool|Path|path|file|dir|datetime|list\[[^\]]*\]|[a-z]+ range)>")
"""Typer's default help labels (``<str>``, ``<list[str]>``): Python types, not what to type."""


def _every_command() -> list[tuple[str, ...]]:
    from traceml_ai.cli.main import COMMANDS, load_command

    out: list[tuple[str, ...]] = []
    for name in COMMANDS:
        subs = getattr(load_command(name), "commands", {})
        out += [(name, sub) for sub in subs] if subs else [(name,)]
    return out


def test_every_command_says_what_its_options_take_in_words() -> None:
    # Issue 14 review: `traceml run --help` showed `--name <str>`, `--tag <list[str]>`, `SCRIPT <str>`.
    for command in _every_command():
        proc = run_traceml(*command, "--help", env={"COLUMNS": "100"})
        assert proc.returncode == 0, (command, proc.stderr)
        assert not TYPE_DESCRIPTOR.search(proc.stdout), (command, TYPE_DESCRIPTOR.findall(proc.stdout))
    proc = run_traceml("run", "--help", env={"COLUMNS": "100"})
    shown = " ".join(proc.stdout.split())
    for words in ("SCRIPT The training script", "--name NAME", "--tag TAG", "--logs-dir DIR", "--interval SECONDS",
                  "--master-addr HOST", "--master-port PORT", "--nproc-per-node N", "--mode summary|cli|quiet"):
        assert words in shown, words
    ui = " ".join(run_traceml("ui", "--help", env={"COLUMNS": "100"}).stdout.split())
    assert "--port PORT" in ui and "--host HOST" in ui and "--cache-dir DIR" in ui


def test_usage_lines_write_arguments_as_click_does() -> None:
    """Issue 14: usage read `[[ROOT]...]...`, `{PATH...}...` and `{RUN}` (a metavar wrapped again)."""
    expected = {
        ("runs", "ls"): "traceml runs ls [OPTIONS] [ROOT]...",
        ("runs", "show"): "traceml runs show [OPTIONS] RUN",
        ("ui",): "traceml ui [OPTIONS] [ROOT]...",
        ("plot",): "traceml plot [OPTIONS] RUN...",
        ("run",): "traceml run [OPTIONS] SCRIPT [ARGS]...",
        ("compare",): "traceml compare [OPTIONS] RUN_A RUN_B",
        ("query", "runs"): "traceml query runs [OPTIONS] PATH...",
    }
    for command in _every_command():
        proc = run_traceml(*command, "--help", env={"COLUMNS": "100"})
        usage = proc.stdout.splitlines()[0]
        assert not re.search(r"[\[{]{2}|[{}]|\.\.\.[\]}]", usage), (command, usage)
        if command in expected:
            assert usage == "Usage: " + expected[command], (command, usage)
    missing = run_traceml("query", "runs")
    assert missing.returncode == 2 and "Missing argument 'PATH'." in missing.stderr


def test_unknown_command_is_usage_error() -> None:
    proc = run_traceml("rnus")
    assert proc.returncode == 2
    assert "rnus" in proc.stderr


VIEWER_FIRST_TABLE = """
import json, sys
from traceml_ai.runs.store import RunStore
from traceml_ai.ui.cache import CacheFolder
from traceml_ai.ui.service import Viewer
root, cache = sys.argv[1], sys.argv[2]
viewer = Viewer(RunStore([root]), CacheFolder(cache, roots=[root]))
viewer.start()
rows = len(viewer.table_payload()["keys"])
print(json.dumps({"rows": rows, "modules": sorted(sys.modules)}))
"""


def test_the_viewers_first_table_from_its_run_database_loads_no_chart_or_catalog_code(tmp_path: Path) -> None:
    """Issue 16's warm start: the first table answer from runs.sqlite must not wait for numpy, the
    PNG renderer or the catalog package; they load on the first chart, export or catalog refresh."""
    root = tmp_path / "traceml" / "runs"
    generate(root, runs=27, seed=0)
    cache = tmp_path / "cache"
    cache.mkdir()  # (an existing cache folder gets a run database at any size; see ui.warm.DB_MIN_RUNS)
    assert run_traceml("runs", "ls", str(root), env={"TRACEML_CACHE_DIR": str(cache)}).returncode == 0
    assert (cache / "runs.sqlite").is_file()  # the listing wrote the run database the viewer starts from
    proc = subprocess.run([sys.executable, "-c", VIEWER_FIRST_TABLE, str(root), str(cache)], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["rows"] == 27
    modules = set(report["modules"])
    assert not {"numpy", "matplotlib", "jsonschema"} & {m.split(".")[0] for m in modules}
    assert not {m for m in modules if m.startswith(("traceml_ai.catalog", "traceml_ai.ui.png",
                                                     "traceml_ai.runs.analysis"))}


@pytest.mark.parametrize("command", ["ui", "plot"])
def test_the_cache_dir_help_names_the_folder_the_command_uses(tmp_path: Path, command: str) -> None:
    # Issue 14 review: the help said ".cache beside the first root", an older TraceML's place.
    from traceml_ai.ui.cache_paths import default_cache_dir

    done = run_traceml(command, "--help", env={"COLUMNS": "300"})
    assert done.returncode == 0
    line = next(x for x in done.stdout.splitlines() if "--cache-dir" in x)
    assert "traceml/.cache for the root traceml/runs" in line and "beside the first" not in line
    root = tmp_path / "traceml" / "runs"
    assert default_cache_dir([root], None) == str(tmp_path / "traceml" / ".cache")
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    assert default_cache_dir([tmp_path / "elsewhere"], None).startswith(os.path.join(home, "traceml", "elsewhere-"))
