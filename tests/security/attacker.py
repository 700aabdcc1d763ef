"""A second local user's attempt to forge telemetry (issue 12 point 1), run as ``nobody`` with the
system's Python and the standard library only, as such a user could.

    python3 attacker.py AGGREGATOR_PID PORT RUN_DIR

It collects everything it can read about the job (the aggregator's command line, the run folder's
files), tries to read the environments that hold the job secret, then connects with the session id
and sends a hello, 700 forged step rows and a fake stderr line. Prints one JSON object: what it
read and what the aggregator answered.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import sys
import time
from typing import Any


def pack(value: Any) -> bytes:
    """A minimal msgpack encoder (dict, list, str, int >= 0, float, bool, None)."""
    if value is None:
        return b"\xc0"
    if value is True:
        return b"\xc3"
    if value is False:
        return b"\xc2"
    if isinstance(value, int):
        return b"\xcf" + struct.pack(">Q", value)
    if isinstance(value, float):
        return b"\xcb" + struct.pack(">d", value)
    if isinstance(value, str):
        data = value.encode()
        return b"\xdb" + struct.pack(">I", len(data)) + data
    if isinstance(value, list):
        return b"\xdd" + struct.pack(">I", len(value)) + b"".join(pack(v) for v in value)
    if isinstance(value, dict):
        return b"\xdf" + struct.pack(">I", len(value)) + b"".join(pack(k) + pack(v) for k, v in value.items())
    raise TypeError(type(value))


def frame(value: Any) -> bytes:
    body = pack(value)
    return struct.pack(">I", len(body)) + body


def read_answer(sock: socket.socket) -> Any:
    """The first frame's raw bytes as text (enough to see welcome / refused and the reason)."""
    sock.settimeout(5)
    data = b""
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
            if len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]:
                break
    except OSError:
        pass
    return data[4:].decode("latin-1")


def main() -> None:
    pid, port, run_dir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    seen: dict[str, Any] = {"uid": os.getuid()}
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = f.read().split(b"\0")
    seen["cmdline"] = [a.decode() for a in argv]
    session = seen["cmdline"][seen["cmdline"].index("--session-id") + 1]
    seen["session_from_cmdline"] = session
    readable = {}
    for name in ("run.json", "aggregator/manifest.json"):
        try:
            with open(os.path.join(run_dir, name)) as f:
                readable[name] = f.read()
        except OSError as exc:
            readable[name] = f"unreadable: {exc}"
    seen["files"] = readable
    environ = {}
    for other in [pid, *[int(p) for p in os.listdir("/proc") if p.isdigit()]]:
        try:
            with open(f"/proc/{other}/environ", "rb") as f:
                if b"TRACEML_JOB_SECRET" in f.read():
                    environ[str(other)] = "read the secret"
        except OSError:
            pass
    seen["environ_with_secret_read"] = environ
    answers = []
    for proof in ("0" * 64, session, ""):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        read_answer(sock)  # the aggregator's challenge; without the secret there is no way to sign it
        hello = {"control": "hello", "protocol": 2, "session_id": session, "global_rank": 0, "world_size": 1,
                 "nonce": "ab" * 16, "proof": proof}
        sock.sendall(frame(hello))
        now = time.time_ns()
        meta = {"session_id": session, "global_rank": 0, "local_rank": 0, "world_size": 1, "node_rank": 0,
                "hostname": "forged", "pid": 1, "sampler": "capture"}
        events = {p: {"cpu": {"is_gpu": False, "duration_ms": 900.0, "cpu_ms": 900.0, "gpu_ms": None, "n_calls": 1}}
                  for p in ("optimizer_step",)}
        rows = [{"seq": s, "timestamp_unix_ns": now + s, "step": s, "events": events} for s in range(700)]
        lines = [{"seq": 0, "timestamp_unix_ns": now, "stream": "stderr", "line": "FORGED stderr line"}]
        try:
            sock.sendall(frame({"meta": meta, "tables": {"step_time": rows, "stdout_stderr": lines}}))
        except OSError as exc:
            answers.append(f"send failed: {exc}")
        answers.append(read_answer(sock))
        sock.close()
    seen["answers"] = answers
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
