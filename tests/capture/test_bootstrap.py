"""``python -m traceml_ai.capture.bootstrap SCRIPT ARGS`` behaves like ``python SCRIPT ARGS`` (real subprocesses)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.capture.frame_server import TEST_SECRET, FrameServer

BOOTSTRAP = [sys.executable, "-m", "traceml_ai.capture.bootstrap"]

OUTPUT_SCRIPT = textwrap.dedent("""
    import sys, time
    print("hello from stdout")
    print("warning: to stderr", file=sys.stderr)
    sys.stdout.write("a partial ")
    sys.stdout.flush()
    time.sleep(0.3)  # a few sampler ticks in between
    sys.stdout.write("line, completed\\n")
    print("ünïcödé ✓ 漢字")
    print()
    for i in range(3):
        sys.stderr.write(f"\\rprogress {i}/3")
    sys.stderr.write("\\n")
    print("args:", sys.argv[1:])
    sys.stdout.write("no newline at the end")
""")

IDENTITY_SCRIPT = textwrap.dedent("""
    import os, sys
    print(__name__, __file__, sys.argv, sys.path[0], os.getcwd())
    print(type(__builtins__).__name__, __spec__, __package__)
    import pickle
    class Point:
        pass
    print(type(pickle.loads(pickle.dumps(Point()))).__name__)
""")


@pytest.fixture
def server() -> Iterator[FrameServer]:
    srv = FrameServer()
    yield srv
    srv.stop()


def capture_env(server_address: tuple[str, int] | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_")}
    if server_address is not None:
        env.update(TRACEML_SESSION_ID="sess-test", TRACEML_JOB_SECRET=TEST_SECRET,
                   TRACEML_AGGREGATOR=f"{server_address[0]}:{server_address[1]}",
                   TRACEML_INTERVAL="0.05")
    env.update(extra)
    return env


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, timeout=240)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_output_is_byte_identical_and_lines_reach_the_aggregator(server: FrameServer, tmp_path: Path) -> None:
    script = write(tmp_path, "train.py", OUTPUT_SCRIPT)
    plain = run([sys.executable, "train.py", "--lr", "0.1"], capture_env(None), tmp_path)
    captured = run([*BOOTSTRAP, "train.py", "--lr", "0.1"], capture_env(server.address), tmp_path)
    assert script.exists()
    assert captured.returncode == plain.returncode == 0
    assert captured.stdout == plain.stdout
    assert captured.stderr == plain.stderr
    assert server.wait_for(lambda: len(server.finished) == 1)
    rows = server.rows("stdout_stderr")
    got = [(r["stream"], r["line"]) for r in rows]
    assert got == [
        ("stdout", "hello from stdout"),
        ("stderr", "warning: to stderr"),
        ("stdout", "a partial line, completed"),
        ("stdout", "ünïcödé ✓ 漢字"),
        ("stderr", "progress 2/3"),
        ("stdout", "args: ['--lr', '0.1']"),
        ("stdout", "no newline at the end"),
    ]
    assert all(isinstance(r["timestamp_unix_ns"], int) for r in rows)
    finished = server.finished[0]
    assert finished["dropped_batches"] == 0 and finished["sent_batches"] == len(server.payloads)


def test_script_sees_what_python_gives_it(server: FrameServer, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    write(tmp_path / "sub", "ident.py", IDENTITY_SCRIPT)
    os.symlink(tmp_path / "sub" / "ident.py", tmp_path / "link.py")
    for script in ("sub/ident.py", "link.py"):
        plain = run([sys.executable, script, "x", "--y"], capture_env(None), tmp_path)
        captured = run([*BOOTSTRAP, script, "x", "--y"], capture_env(server.address), tmp_path)
        assert plain.returncode == 0, plain.stderr
        assert captured.stdout == plain.stdout and captured.stderr == plain.stderr


@pytest.mark.parametrize(("body", "code"), [
    ("print('done')", 0),
    ("import sys\nsys.exit(3)", 3),
    ("import sys\nsys.exit('fatal: bad config')", 1),
    ("def f():\n    raise ValueError('broken batch')\nf()", 1),
])
def test_exit_status_and_stderr_match_python(server: FrameServer, tmp_path: Path, body: str, code: int) -> None:
    write(tmp_path, "job.py", body + "\n")
    plain = run([sys.executable, "job.py"], capture_env(None), tmp_path)
    captured = run([*BOOTSTRAP, "job.py"], capture_env(server.address), tmp_path)
    assert plain.returncode == captured.returncode == code
    assert captured.stdout == plain.stdout
    assert captured.stderr == plain.stderr  # the traceback shows the script's frames only
    assert server.wait_for(lambda: len(server.finished) == 1)
    if code == 1 and "raise" in body:
        lines = [r["line"] for r in server.rows("stdout_stderr") if r["stream"] == "stderr"]
        assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: broken batch"


def test_keyboard_interrupt_ends_by_sigint_like_python(server: FrameServer, tmp_path: Path) -> None:
    write(tmp_path, "ctrlc.py", "raise KeyboardInterrupt\n")
    plain = run([sys.executable, "ctrlc.py"], capture_env(None), tmp_path)
    captured = run([*BOOTSTRAP, "ctrlc.py"], capture_env(server.address), tmp_path)
    assert plain.returncode == captured.returncode == -signal.SIGINT
    assert captured.stderr == plain.stderr
    assert server.wait_for(lambda: len(server.finished) == 1)  # the session still closed cleanly


def test_keyboard_interrupt_under_the_launcher_is_one_line(server: FrameServer, tmp_path: Path) -> None:
    write(tmp_path, "ctrlc.py", "def train():\n    raise KeyboardInterrupt\ntrain()\n")
    captured = run([*BOOTSTRAP, "ctrlc.py"], capture_env(server.address, TRACEML_CAPTURE="run", RANK="1"), tmp_path)
    assert captured.returncode == -signal.SIGINT  # still ended by SIGINT, as torchrun expects
    assert captured.stderr.decode() == "[TraceML] rank 1 stopped by Ctrl+C (KeyboardInterrupt)\n"
    assert server.wait_for(lambda: len(server.finished) == 1)


def test_missing_script_is_python_s_error(tmp_path: Path) -> None:
    plain = run([sys.executable, "nope.py"], capture_env(None), tmp_path)
    captured = run([*BOOTSTRAP, "nope.py"], capture_env(None), tmp_path)
    assert plain.returncode == captured.returncode == 2
    assert captured.stderr == plain.stderr


def test_unreachable_aggregator_leaves_the_script_alone(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()
    write(tmp_path, "job.py", "import sys\nprint('trained')\nsys.exit(3)\n")
    plain = run([sys.executable, "job.py"], capture_env(None), tmp_path)
    captured = run([*BOOTSTRAP, "job.py"], capture_env(dead), tmp_path)
    assert captured.returncode == plain.returncode == 3
    assert captured.stdout == plain.stdout
    # the only addition: one line that says the telemetry was not delivered
    extra = captured.stderr.decode().splitlines()
    assert len(extra) == 1 and extra[0].startswith("[TraceML]") and "not delivered" in extra[0]


@pytest.mark.parametrize("env_extra", [{"TRACEML_DISABLE": "1"}, {"TRACEML_INTERVAL": "soon"}])
def test_disabled_or_bad_config_runs_the_script_without_capture(
        server: FrameServer, tmp_path: Path, env_extra: dict[str, str]) -> None:
    write(tmp_path, "job.py", "print('trained')\n")
    captured = run([*BOOTSTRAP, "job.py"], capture_env(server.address, **env_extra), tmp_path)
    assert captured.returncode == 0 and captured.stdout == b"trained\n"
    if "TRACEML_INTERVAL" in env_extra:
        assert captured.stderr.decode().startswith("[TraceML] telemetry capture is off: TRACEML_INTERVAL")
    else:
        assert captured.stderr == b""
    assert server.accepted == 0


def test_a_zip_archive_or_folder_with_main_runs_as_python_runs_it(tmp_path: Path) -> None:
    import zipfile

    main = "import sys\nprint('main of', sys.argv[0].rsplit('/', 1)[-1], sys.argv[1:])\n"
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "__main__.py").write_text(main)
    with zipfile.ZipFile(tmp_path / "app.pyz", "w") as archive:
        archive.writestr("__main__.py", main)
    (tmp_path / "archive.py").write_bytes((tmp_path / "app.pyz").read_bytes())  # a zip named .py is a zip too
    # the end-of-archive signature in a script's text: zipfile is asked, and says it is no zip
    (tmp_path / "plain.py").write_bytes(b"print(len('PK\x05\x06'))\n")
    for target in ("app", "app.pyz", "archive.py", "plain.py"):
        plain = run([sys.executable, target, "x"], capture_env(None), tmp_path)
        captured = run([*BOOTSTRAP, target, "x"], capture_env(None), tmp_path)
        assert plain.returncode == captured.returncode == 0, (target, captured.stderr)
        assert captured.stdout == plain.stdout, target
