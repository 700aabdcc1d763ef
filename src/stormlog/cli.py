"""``stormlog``: the catalog's compatibility command. Not yet available (the catalog issue builds it)."""

from __future__ import annotations

import sys


def main() -> None:
    """Console-script entry point: says the command is not available yet and exits 1."""
    if len(sys.argv) > 1 and sys.argv[1] in ("-h", "--help"):
        print("usage: stormlog query runs|attachments PATH... (not yet available in this version)")
        raise SystemExit(0)
    print("stormlog: not yet available in this version of traceml-ai (run envelopes arrive with the catalog)",
          file=sys.stderr)
    raise SystemExit(1)
