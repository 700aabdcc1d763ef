"""Command-line start-up benchmark (issue 14, item 1): how long a ``traceml`` command takes before
it does anything, as a ratio to ``python -c pass`` measured in the same interleaved rounds (so a
busy machine slows both sides alike).

Prints the median wall time of each command and its ratio (and the same for the CPU time the
process used, user + system, which a loaded machine inflates less):

- ``import traceml_ai`` (target ≤ 2.5×)
- ``traceml --help`` (target ≤ 8×)
- ``traceml runs ls ROOT`` over 27 fake runs (target ≤ 12×)
- ``traceml run`` start: from the launch to the first line of a trivial training script, minus
  the same for ``python script.py`` (target ≤ 0.5 s added)
- ``traceml ui`` stop (item 11): seconds from Ctrl+C (SIGINT) to the process's exit while a page's
  event stream is open (target ≤ 1 s)

and the load average before and after, since the figures mean little without it.

    .venv/bin/python benchmarks/bench_cli_start.py [--rounds 15] [--run-rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGETS = {"import traceml_ai": 2.5, "traceml --help": 8.0, "traceml runs ls (27 runs)": 12.0}
RUN_TARGET_S = 0.5
UI_EXIT_TARGET_S = 1.0

SCRIPT = "import sys, time\nopen(sys.argv[1], 'w').write(repr(time.time()))\n"


def traceml_command() -> list[str]:
    """The ``traceml`` console script of this interpreter's environment (what a user runs)."""
    script = Path(sys.executable).with_name("traceml")
    if script.exists():
        return [str(script)]
    found = shutil.which("traceml")
    return [found] if found else [sys.executable, "-m", "traceml_ai"]


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the process: user + system) of one run of ``cmd``."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    proc.stderr.close()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {stderr.decode()[-500:]}")
    return elapsed, usage.ru_utime + usage.ru_stime


def first_line_delay(cmd: list[str], stamp: Path, env: dict[str, str], cwd: Path) -> float:
    """Seconds from starting ``cmd`` to the training script's first line (it writes time.time())."""
    stamp.unlink(missing_ok=True)
    t0 = time.time()
    proc = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
    if proc.returncode != 0 or not stamp.exists():
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return float(stamp.read_text()) - t0


def viewer_exit_delay(traceml: list[str], root: Path, env: dict[str, str]) -> float:
    """Seconds from SIGINT to the exit of ``traceml ui ROOT`` holding one open event stream (as a
    page does: its ``EventSource`` never ends by itself)."""
    import http.cookiejar
    import re
    import signal
    import urllib.request

    proc = subprocess.Popen([*traceml, "ui", str(root), "--port", "0", "--no-browser"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    url = next((m.group() for line in proc.stdout if (m := re.search(r"http://\S+token=\S+", line))), None)
    if url is None:
        raise SystemExit("traceml ui printed no URL")
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    opener.open(url, timeout=30).read()  # the token becomes the cookie
    stream = opener.open(url.split("/?")[0] + "/api/events", timeout=30)
    stream.read(1)  # the stream is open and has spoken
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    elapsed = time.perf_counter() - t0
    stream.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds of the quick commands")
    parser.add_argument("--run-rounds", type=int, default=5, help="rounds of traceml run vs python")
    args = parser.parse_args()

    from traceml_ai.runs.fake import generate

    traceml = traceml_command()
    # PYTHONDONTWRITEBYTECODE off: the warm-up writes the bytecode of the editable sources, as
    # pip writes it at install, so the rounds measure a start, not a compile.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEML_") and k != "PYTHONDONTWRITEBYTECODE"}
    env["COLUMNS"] = "120"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="traceml-bench-cli-") as tmp:
        work = Path(tmp)
        root = work / "traceml" / "runs"
        generate(root, runs=27, seed=0)
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "import traceml_ai": [sys.executable, "-c", "import traceml_ai"],
            "traceml --help": [*traceml, "--help"],
            "traceml runs ls (27 runs)": [*traceml, "runs", "ls", str(root)],
        }
        for cmd in cases.values():  # warm the page cache and the bytecode
            timed(cmd, env)
        times: dict[str, list[float]] = {name: [] for name in cases}
        cpu: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, cmd in cases.items():
                wall, used = timed(cmd, env)
                times[name].append(wall)
                cpu[name].append(used)

        script = work / "first_line.py"
        script.write_text(SCRIPT)
        stamp = work / "stamp.txt"
        logs = work / "launched"
        plain = [sys.executable, str(script), str(stamp)]
        launched = [*traceml, "run", "--mode", "quiet", "--logs-dir", str(logs), str(script), str(stamp)]
        first_line_delay(launched, stamp, env, work)  # warm
        plain_s: list[float] = []
        launched_s: list[float] = []
        for _ in range(args.run_rounds):
            plain_s.append(first_line_delay(plain, stamp, env, work))
            launched_s.append(first_line_delay(launched, stamp, env, work))
        ui_exit_s = [viewer_exit_delay(traceml, root, env) for _ in range(args.run_rounds)]
    load_after = os.getloadavg()

    base = statistics.median(times["python -c pass"])
    base_cpu = statistics.median(cpu["python -c pass"])
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} CPUs); "
          f"{args.rounds} interleaved rounds")
    print(f"{'command':28} {'median ms':>10} {'ratio':>7} {'target':>7}      {'CPU ms':>7} {'CPU ratio':>9}")
    for name, values in times.items():
        ratio = statistics.median(values) / base
        target = TARGETS.get(name)
        mark = "" if target is None else ("ok" if ratio <= target else "OVER")
        used = statistics.median(cpu[name])
        print(f"{name:28} {statistics.median(values) * 1000:10.1f} {ratio:6.1f}x "
              f"{'' if target is None else f'{target:.1f}x':>7} {mark:4} {used * 1000:7.1f} {used / base_cpu:8.1f}x")
    added = statistics.median(launched_s) - statistics.median(plain_s)
    print(f"traceml run: first line after {statistics.median(launched_s) * 1000:.0f} ms vs python "
          f"{statistics.median(plain_s) * 1000:.0f} ms: {added * 1000:+.0f} ms added "
          f"(target <= {RUN_TARGET_S * 1000:.0f} ms) {'ok' if added <= RUN_TARGET_S else 'OVER'}")
    stop = statistics.median(ui_exit_s)
    print(f"traceml ui: exits {stop:.2f} s after Ctrl+C with an open event stream (max {max(ui_exit_s):.2f} s; "
          f"target <= {UI_EXIT_TARGET_S:.0f} s) {'ok' if stop <= UI_EXIT_TARGET_S else 'OVER'}")


if __name__ == "__main__":
    main()
