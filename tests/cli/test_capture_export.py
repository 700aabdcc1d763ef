"""``traceml run`` / ``serve`` / ``watch`` and the export settings (000 seed, "Stream selection" and
"Custom exporters"): checked before launch, exit 2 with the aggregator's own message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_ai.examples import TRAIN_DIGITS

SUPPORTED = "supported names: step_time, step_memory, process, system, all"


def traceml(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceml_ai", *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, env={**os.environ, **(env or {})})


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--export-streams", "gpu"], {}, f"export_streams 'gpu' has unknown name 'gpu'; {SUPPORTED}"),
    (["--export-streams", " , "], {}, f"export_streams ' , ' names no stream; {SUPPORTED}"),
    ([], {"TRACEML_EXPORT_STREAMS": "step_time,logs"}, f"has unknown name 'logs'; {SUPPORTED}"),
    (["--exporter", "exporters/mine.py"], {}, "exporter 'exporters/mine.py' is not jsonl, otlp or module:factory"),
    ([], {"TRACEML_EXPORTER": "my_exporters"}, "exporter 'my_exporters' is not jsonl, otlp or module:factory"),
])
@pytest.mark.parametrize("command", ["run", "serve"])
def test_a_bad_export_setting_stops_run_and_serve_before_launch_with_exit_2(
    tmp_path: Path, command: str, args: list[str], env: dict[str, str], message: str,
) -> None:
    script = [str(TRAIN_DIGITS)] if command == "run" else []
    proc = traceml(tmp_path, command, "--logs-dir", "runs", *args, *script, env=env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists()  # nothing was launched


def test_the_setting_from_traceml_yaml_is_checked_and_named_in_the_same_way(tmp_path: Path) -> None:
    (tmp_path / "traceml.yaml").write_text("exporter: not-a-module:make\n")
    proc = traceml(tmp_path, "serve", "--logs-dir", "runs")
    assert proc.returncode == 2 and "exporter 'not-a-module:make' is not jsonl, otlp or module:factory" in proc.stderr


def test_only_the_aggregator_imports_the_exporter_module_never_the_launcher_or_the_training(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "marker.py").write_text(
        "import os, sys\n"
        f"with open({str(tmp_path / 'imports.txt')!r}, 'a') as f:\n"
        "    f.write(sys.argv[0] + '\\n')\n"
        "class E:\n"
        "    def open(self): pass\n"
        "    def write(self, records): pass\n"
        "    def flush(self): pass\n"
        "    def close(self, *, dropped_batches=0): pass\n"
        "def make(context):\n"
        "    return E()\n"
    )
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    proc = traceml(tmp_path, "run", "--logs-dir", "runs", "--mode", "quiet", "--exporter", "marker:make", str(script),
                   env={"PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    (importer,) = (tmp_path / "imports.txt").read_text().splitlines()
    assert importer.endswith(os.path.join("traceml_ai", "aggregator", "__main__.py"))


def test_watch_has_no_exporter_and_ignores_the_setting(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    proc = traceml(tmp_path, "watch", "--logs-dir", "runs", "--mode", "quiet", str(script),
                   env={"TRACEML_EXPORTER": "jsonl", "TRACEML_EXPORT_STREAMS": "all"})
    assert proc.returncode == 0, proc.stderr
    assert list((tmp_path / "runs").glob("*/aggregator/telemetry.sqlite"))
    assert not list((tmp_path / "runs").glob("*/aggregator/export"))


def test_traceml_options_after_the_script_go_to_the_script_with_a_note(tmp_path: Path) -> None:
    """`traceml run train.py --exporter jsonl` passes --exporter to the script (as python would); the
    user is told, since nothing is exported."""
    (tmp_path / "t.py").write_text("import sys\nprint('args', sys.argv[1:])\n")
    proc = traceml(tmp_path, "run", "--mode", "quiet", "t.py", "--exporter", "jsonl")
    assert proc.returncode == 0, proc.stderr
    assert "args ['--exporter', 'jsonl']" in proc.stdout
    assert "note: --exporter after the script went to the script" in proc.stderr
