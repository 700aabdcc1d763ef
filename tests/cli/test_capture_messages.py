"""What `traceml run` / `watch` tell the user when the command line is wrong or nothing could be
judged (issue 14 items 2, 3, 4), run as real commands."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_traceml
from traceml_ai.diagnose.summary import Summary
from traceml_ai.diagnose.summary import verdict as summary_verdict


def verdict(doc: dict[str, Any]) -> tuple[str, str]:
    """The verdict of a final_summary.json document as the commands read it (the typed reader)."""
    return summary_verdict(Summary.from_dict(doc))

ARGPARSE_SCRIPT = """
import argparse
parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=1)
parser.parse_args()
print("trained")
"""


def test_a_mistyped_option_is_named_with_the_closest_one(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('trained')\n")
    proc = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), "--nproc-per-nod", "2", "train.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: unknown option --nproc-per-nod (did you mean --nproc-per-node?)"
    assert "no such training script" not in proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing started
    proc = run_traceml("watch", "--intervall=2", "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and "unknown option --intervall (did you mean --interval?)" in proc.stderr


def test_dash_m_runs_a_module_like_python_does(tmp_path: Path) -> None:
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import sys\nprint('module ran with', sys.argv[1:])\n")
    proc = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), "-m", "mypkg.train", "--epochs", "2", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "module ran with ['--epochs', '2']" in proc.stdout
    (run,) = (tmp_path / "runs").iterdir()
    meta = json.loads((run / "run.json").read_text())
    assert meta["name"] == "train" and meta["status"] == "completed"
    assert meta["command"][1:] == ["-m", "mypkg.train", "--epochs", "2"]
    proc = run_traceml("run", "-m", cwd=tmp_path)
    assert proc.returncode == 2 and "-m needs a module name" in proc.stderr


def test_a_module_that_cannot_be_found_is_one_line_before_any_run_folder(tmp_path: Path) -> None:
    # Issue 14 review: `traceml run -m pkg.nosuch` left a failed run folder, where a missing script
    # is one line and no folder.
    pkg = tmp_path / "mypkg"
    (pkg / "inner").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "inner" / "train.py").write_text("print('inner ran')\n")  # mypkg.inner: a namespace package
    runs = tmp_path / "runs"
    cases = {
        "pkg.nosuch": "error: no such training module: pkg.nosuch (no module named 'pkg' in the current folder "
                      "or on the Python path)",
        "mypkg.nosuch": "error: no such training module: mypkg.nosuch (no module named 'mypkg.nosuch'",
        "mypkg.inner.nosuch": "error: no such training module: mypkg.inner.nosuch",
        "mypkg": "error: mypkg is a package without __main__.py",
    }
    for module, said in cases.items():
        for command in (("run",), ("watch",), ("run", "--disable-traceml")):
            proc = run_traceml(*command, "--logs-dir", str(runs), "-m", module, "--epochs", "1", cwd=tmp_path)
            assert proc.returncode == 1, (command, module, proc.stderr)  # as for a missing script
            assert proc.stderr.startswith(said) and proc.stderr.count("\n") == 1, (command, module, proc.stderr)
            assert "Traceback" not in proc.stderr and proc.stdout == ""
            assert not runs.exists()
    proc = run_traceml("run", "--logs-dir", str(runs), "-m", "mypkg.inner.train", cwd=tmp_path)
    assert proc.returncode == 0 and "inner ran" in proc.stdout, proc.stderr
    missing = run_traceml("run", "--logs-dir", str(runs), "nosuch.py", cwd=tmp_path)
    assert missing.returncode == 1 and missing.stderr == "error: no such training script: nosuch.py\n"


def test_traceml_options_after_the_script_are_explained_when_the_script_fails(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(ARGPARSE_SCRIPT)
    proc = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), "train.py", "--epochs", "1",
                       "--nproc-per-node", "2", cwd=tmp_path)
    assert proc.returncode == 2  # the script's own exit code (argparse)
    assert "unrecognized arguments: --nproc-per-node 2" in proc.stderr
    expected = f"traceml run --logs-dir {tmp_path / 'runs'} --nproc-per-node 2 train.py --epochs 1"
    assert "--nproc-per-node, which is TraceML's" in proc.stderr and expected in proc.stderr.replace("\n", " ")
    assert "no bottleneck found" not in proc.stdout
    # Given before the script too (review: the suggestion named it twice): once, with the later value.
    proc = run_traceml("run", "--nproc-per-node", "1", "--logs-dir", str(tmp_path / "runs"), "train.py", "--epochs",
                       "1", "--nproc-per-node", "2", cwd=tmp_path)
    said = proc.stderr.replace("\n", " ")
    assert proc.returncode == 2 and "put TraceML's options before the script" in said, proc.stderr
    assert f"traceml run --logs-dir {tmp_path / 'runs'} --nproc-per-node 2 train.py --epochs 1" in said, said


def test_shared_options_after_the_script_are_explained_when_its_parser_refused_them(tmp_path: Path) -> None:
    # --name and --tag are options of many scripts too: moved only because argparse named them.
    (tmp_path / "train.py").write_text(ARGPARSE_SCRIPT)
    proc = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), "train.py", "--epochs", "1",
                       "--name", "baseline", "--tag=cv", cwd=tmp_path)
    assert proc.returncode == 2
    assert "unrecognized arguments: --name baseline --tag=cv" in proc.stderr
    expected = f"traceml run --logs-dir {tmp_path / 'runs'} --name baseline --tag=cv train.py --epochs 1"
    assert "--name, --tag, which are TraceML's" in proc.stderr and expected in proc.stderr.replace("\n", " ")
    # A script that takes --name itself and fails for another reason gets no such note.
    (tmp_path / "own.py").write_text("import argparse, sys\np = argparse.ArgumentParser()\n"
                                     "p.add_argument('--name')\np.parse_args()\nsys.exit(3)\n")
    proc = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), "own.py", "--name", "x", cwd=tmp_path)
    assert proc.returncode == 3 and "which is TraceML's" not in proc.stderr


def test_a_run_without_steps_is_not_judged_never_green(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('trained without trace_step')\n")
    proc = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "diagnosis: not judged: no training step was timed" in proc.stdout
    assert "no bottleneck found" not in proc.stdout
    (run,) = (tmp_path / "runs").iterdir()
    shown = run_traceml("summary", str(run))
    assert shown.returncode == 0, shown.stderr
    assert "not judged: no training step was timed" in shown.stdout and "no bottleneck found" not in shown.stdout
    table = run_traceml("runs", "ls", str(tmp_path / "runs"), "--csv", "--columns", "name,perf.verdict")
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[1:] == ["train,not_judged"]  # the run table never calls it healthy

    watched = run_traceml("watch", "--logs-dir", str(tmp_path / "watched"), "train.py", cwd=tmp_path)
    assert watched.returncode == 0, watched.stderr
    assert "diagnosis: not judged: a watch run times no steps" in watched.stdout
    assert "no bottleneck found" not in watched.stdout
    (watch_run,) = (tmp_path / "watched").iterdir()
    shown = run_traceml("summary", str(watch_run))
    assert shown.returncode == 0, shown.stderr
    assert "not judged: a watch run times no steps" in shown.stdout  # the same reason later, not "no trace_step"


def test_a_watch_run_of_a_script_with_trace_step_times_nothing_and_is_not_judged(tmp_path: Path) -> None:
    # Issue 14 review: watch timed the script's trace_step and said "no bottleneck found".
    (tmp_path / "train.py").write_text(
        "import torch, traceml_ai\nmodel = torch.nn.Linear(16, 4)\n"
        "for _ in range(30):\n    with traceml_ai.trace_step(model):\n"
        "        model(torch.randn(8, 16)).sum().backward()\n"
        "    with traceml_ai.trace_region('metrics'):\n        pass\nprint('trained')\n")
    proc = run_traceml("watch", "--logs-dir", str(tmp_path / "runs"), "--interval", "0.2", "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "trained" in proc.stdout
    assert "diagnosis: not judged: a watch run times no steps" in proc.stdout
    assert "no bottleneck found" not in proc.stdout
    assert proc.stderr.count("traceml watch times no steps: trace_step and trace_region are ignored") == 1
    (run,) = (tmp_path / "runs").iterdir()
    shown = run_traceml("summary", str(run))
    assert shown.returncode == 0, shown.stderr
    assert "not judged: a watch run times no steps" in shown.stdout and "no bottleneck found" not in shown.stdout
    assert "0 seen" in shown.stdout  # nothing was timed
    # --json carries the verdict the text shows.
    as_json = run_traceml("summary", str(run), "--json")
    assert as_json.returncode == 0, as_json.stderr
    doc = json.loads(as_json.stdout)
    assert doc["steps"]["seen"] == 0
    assert doc["verdict"]["kind"] == "not_judged"
    assert doc["verdict"]["text"].startswith("not judged: a watch run times no steps")


def test_summary_json_of_a_run_without_steps_says_not_judged(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('trained without trace_step')\n")
    proc = run_traceml("run", "--mode", "quiet", "--logs-dir", str(tmp_path / "runs"), "train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (run,) = (tmp_path / "runs").iterdir()
    text = run_traceml("summary", str(run))
    doc = json.loads(run_traceml("summary", str(run), "--json").stdout)
    assert doc["verdict"]["kind"] == "not_judged" and doc["verdict"]["text"] in text.stdout
    assert doc["verdict"]["text"].startswith("not judged: no training step was timed")


def test_verdict_is_green_only_when_a_step_rule_judged() -> None:
    base = {"telemetry": {"status": "ok"}, "steps": {"seen": 200}, "findings": [], "abstained": []}
    assert verdict({**base, "rules_checked": ["input_bound", "cpu_pressure"]}) == ("healthy", "no bottleneck found")
    kind, text = verdict({**base, "rules_checked": ["cpu_pressure"],
                          "abstained": [{"rule": "input_bound", "reason": "no dataloader events were recorded"}]})
    assert (kind, text) == ("not_judged", "not judged: no dataloader events were recorded")
    kind, _ = verdict({**base, "rules_checked": [], "findings": [{"kind": "input_bound", "severity": "warning"}]})
    assert kind == "findings"
    assert verdict({**base, "telemetry": {"status": "corrupt"}, "rules_checked": []})[0] == "no_verdict"


def test_a_summary_with_no_step_timed_is_never_green_even_if_a_step_rule_is_listed() -> None:
    """What the launcher printed after its aggregator was SIGKILLed before any step row was
    committed: the summary written from the empty tables listed a step rule as checked."""
    doc = {"telemetry": {"status": "degraded"}, "steps": {"seen": 0}, "findings": [], "abstained": [],
           "rules_checked": ["input_bound", "h2d_bound", "cpu_pressure"]}
    kind, text = verdict(doc)
    assert kind == "not_judged" and text.startswith("not judged: no training step was timed")


def test_a_script_that_fails_before_its_first_step_is_said_to_have_failed(tmp_path: Path) -> None:
    # Issue 14 review: "it ended before its first step" for a script that raised at its start.
    (tmp_path / "train.py").write_text("import sys\nsys.exit(3)\n")
    proc = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), "train.py", cwd=tmp_path)
    assert proc.returncode == 3
    assert "diagnosis: not judged: the script failed (exit code 3) before its first step" in proc.stdout
    assert "ended before its first step" not in proc.stdout and "no bottleneck found" not in proc.stdout
    (run,) = (tmp_path / "runs").iterdir()
    shown = run_traceml("summary", str(run))  # later, the same words
    assert shown.returncode == 0, shown.stderr
    assert "not judged: the script failed (exit code 3) before its first step" in shown.stdout
    doc = json.loads(run_traceml("summary", str(run), "--json").stdout)
    assert doc["verdict"]["text"] == "not judged: the script failed (exit code 3) before its first step"
    (tmp_path / "crash.py").write_text("raise RuntimeError('no data')\n")
    proc = run_traceml("run", "--logs-dir", str(tmp_path / "runs"), "crash.py", cwd=tmp_path)
    assert proc.returncode == 1 and "the script failed (exit code 1) before its first step" in proc.stdout


@pytest.mark.parametrize("command", ["watch", "serve"])
@pytest.mark.parametrize("name", ["", "   ", "a/b", ".."])
def test_every_name_option_refuses_what_traceml_run_refuses(tmp_path: Path, command: str, name: str) -> None:
    """Issue 14: each ``--name`` is checked as ``traceml run --name`` is (writer.check_run_name)."""
    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').write('yes')\n")
    target = [str(script)] if command == "watch" else []
    done = run_traceml(command, "--name", name, "--logs-dir", str(tmp_path / "runs"), *target, cwd=tmp_path,
                       timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip() == (f"error: --name: run name {name!r} must be 1-100 characters, not blank, '.' or "
                                   "'..', without path separators or control characters")
    assert not (tmp_path / "ran").exists() and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("name", ["", "   ", "a/b"])
def test_a_blank_or_bad_run_name_is_refused_before_the_script_starts(tmp_path: Path, name: str) -> None:
    # Issue 14 review: `--name ""` was taken as no name (the script's) and `--name "   "` made a run
    # with a blank name in the table; the logger already refused ''.
    import traceml_ai

    script = tmp_path / "train.py"
    script.write_text("open('ran', 'w').write('yes')\n")
    done = run_traceml("run", "--name", name, "--logs-dir", str(tmp_path / "runs"), str(script), cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "--name" in done.stderr and "must be 1-100 characters" in done.stderr
    assert not (tmp_path / "ran").exists() and not (tmp_path / "runs").exists()
    with pytest.raises(ValueError, match="not blank"):
        traceml_ai.Run(tmp_path / "runs", name)
