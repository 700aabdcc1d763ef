"""Scale figures of issue 16, printed (never asserted): cold scan, warm start, no-change poll CPU,
table sort/filter/group/search and RSS at 1k / 10k / 100k runs, and the ratio of the two largest.

Run: ``.venv/bin/python benchmarks/bench_scale.py --sizes 1000,10000`` (the same as
``traceml bench --scale --sizes 1000,10000``). The runs are generated once into ``--cache``
(default ``$XDG_CACHE_HOME/traceml-bench-scale``); 100,000 runs take minutes and ~4 GB. What each
figure measures: :mod:`traceml_ai.cli.bench_scale`.
"""

from __future__ import annotations

import sys

from traceml_ai.cli.main import main

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "bench", "--scale", *sys.argv[1:]]
    main()
