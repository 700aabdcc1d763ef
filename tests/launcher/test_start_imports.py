"""``traceml run`` starts the training without importing the export, finalize or capture-session
modules in the launcher (issue 14, item 1), and still checks the export settings it was given."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traceml_ai.aggregator.export import streams
from traceml_ai.launcher import launch

PROBE = """
import json, sys
from traceml_ai.launcher import launch
launch.check_export(None, launch.DEFAULT_EXPORT_STREAMS)
launch.job_secret_for(launch.LaunchOptions(script="x.py"), "s")
print(json.dumps(sorted(sys.modules)))
"""


def test_the_launchers_default_streams_are_the_aggregators() -> None:
    assert launch.DEFAULT_EXPORT_STREAMS == streams.DEFAULT_EXPORT_STREAMS
    assert launch.LaunchOptions(script="x.py").export_streams == streams.DEFAULT_EXPORT_STREAMS


def test_the_launcher_loads_no_export_finalize_or_sampler_module_before_the_training(tmp_path: object) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
                          env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    loaded = set(json.loads(proc.stdout))
    heavy = {"traceml_ai.aggregator.export", "traceml_ai.aggregator.finalize", "traceml_ai.capture.session", "psutil",
             "msgspec", "sqlite3"}
    assert not loaded & heavy, sorted(loaded & heavy)


@pytest.mark.parametrize(("exporter", "export_streams", "needle"), [
    (None, "step_time,bogus", "bogus"),
    ("not a form", "step_time", "not a form"),
])
def test_given_export_settings_are_still_checked(exporter: str | None, export_streams: str, needle: str) -> None:
    with pytest.raises(launch.LaunchUsageError, match=needle):
        launch.check_export(exporter, export_streams)


RUN_PROBE = """
import json, subprocess, sys
seen = {}
real_init = subprocess.Popen.__init__
def init(self, args, *a, **k):
    if "traceml_ai.capture.bootstrap" in args:  # the moment the training starts
        seen["loaded"] = sorted(sys.modules)
    real_init(self, args, *a, **k)
subprocess.Popen.__init__ = init
sys.argv = ["traceml", "run", "--mode", "quiet", "--logs-dir", sys.argv[1], sys.argv[2]]
from traceml_ai.cli.main import main
try:
    main()
except SystemExit:
    pass
print(json.dumps(seen["loaded"]))
"""


def test_traceml_run_starts_the_training_before_it_loads_rich_or_pydantic(tmp_path: Path) -> None:
    # Rich comes with the first thing printed (after the training started); pydantic only for a
    # setting value that needs checking (--logs-dir is text).
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    proc = subprocess.run([sys.executable, "-c", RUN_PROBE, str(tmp_path / "runs"), str(script)], capture_output=True,
                          text=True, timeout=240, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    loaded = {m.split(".")[0] for m in json.loads(proc.stdout.splitlines()[-1])}
    assert not loaded & {"rich", "pydantic", "pydantic_core", "yaml", "msgspec", "psutil"}, sorted(loaded)
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert (run_dir / "aggregator" / "final_summary.json").exists()
