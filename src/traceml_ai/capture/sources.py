"""What the capture session's sampler thread collects rows from (DESIGN §1, §3.1).

A *row source* produces the rows of one stream. The capture session calls ``collect`` on its
background thread every ``interval`` seconds (and once more at shutdown) and sends whatever came
back in one envelope per tick. Sources never raise into the session: a failed read is a row with
None in that field, and a source that raises anyway is counted and disabled by the session.
"""

from __future__ import annotations

from typing import Any, Protocol


class RowSource(Protocol):
    """Produces the rows of ``stream`` since the last call.

    ``collect(seq, now_ns)`` returns row dicts with the keys of DESIGN §3.1 for that stream;
    ``seq`` is the session's tick counter (the same for every source in one tick) and ``now_ns``
    the tick's time in ns since the Unix epoch. It runs on the sampler thread, never the
    training thread, and must not block for long.

    A source that can lose rows (a bounded hand-off queue, work that fits no row) may also define
    ``lost_rows() -> int``: the rows of its stream it lost so far. The session reports the sum per
    stream on stderr and in ``rank_finished`` (``lost_rows``), which the aggregator writes into
    ``finalization_warning.json`` (DESIGN §3.2: losses are never silent).
    """

    stream: str

    def collect(self, seq: int, now_ns: int) -> list[dict[str, Any]]: ...
