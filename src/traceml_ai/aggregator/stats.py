"""What the aggregator counts while it ingests: per rank and per job (DESIGN §3.2 "losses are never silent").

Plain dataclasses, filled by :mod:`traceml_ai.aggregator.server` and read by
:mod:`traceml_ai.aggregator.finalize`. All counts are of frames or rows, never bytes or time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

# How many loss messages are kept per kind: enough to see what went wrong, bounded for a long run.
MAX_MESSAGES = 20
# Characters kept of one message: a peer's bytes quoted in a reason never make a report large.
MAX_MESSAGE_CHARS = 300


def keep_message(messages: list[str], message: str) -> None:
    """Append ``message`` (one line, at most :data:`MAX_MESSAGE_CHARS`) unless :data:`MAX_MESSAGES`
    are already kept."""
    if len(messages) < MAX_MESSAGES:
        line = " ".join(message[:4 * MAX_MESSAGE_CHARS].split())
        if len(line) > MAX_MESSAGE_CHARS:
            line = line[:MAX_MESSAGE_CHARS - 1] + "…"
        messages.append(line)


@dataclass
class RankStats:
    """Counts for one rank (``global_rank`` None: connections that never named their rank).

    ``hellos``: accepted hellos (more than one means the rank reconnected);
    ``batches``: admitted payload frames; ``rows``: table rows projected from them;
    ``rejected_frames``: frames refused (wrong session or protocol, undecodable, unexpected control);
    ``rejected_batches``: the payload frames among those; ``finished``: a ``rank_finished`` frame
    came, with the rank's own ``sent_batches``, ``dropped_batches`` and ``dropped_output_lines`` (the
    stdout/stderr lines its output capture lost; None until then or from an older rank) and
    ``lost_rows`` ({stream: rows} its row sources dropped before sending) and ``step_counts``
    ({counter: n} steps left without a row by design, e.g. ``discarded_steps``; empty when the
    rank traced no step or is older) and ``unencodable_rows`` ({stream: rows} it left out of their
    batches: a value msgpack cannot encode, such as an integer beyond 64 bits).
    """

    global_rank: int | None
    hostname: str | None = None
    hellos: int = 0
    batches: int = 0
    rows: int = 0
    rejected_frames: int = 0
    rejected_batches: int = 0
    finished: bool = False
    sent_batches: int | None = None
    dropped_batches: int | None = None
    dropped_output_lines: int | None = None
    lost_rows: dict[str, int] = field(default_factory=dict)
    step_counts: dict[str, int] = field(default_factory=dict)
    unencodable_rows: dict[str, int] = field(default_factory=dict)

    @property
    def undelivered_batches(self) -> int:
        """Batches the rank says it sent that never arrived admitted or rejected (0 when unknown)."""
        if self.sent_batches is None:
            return 0
        return max(0, self.sent_batches - self.batches - self.rejected_batches)


@dataclass
class IngestStats:
    """Counts for the whole job: per-rank :class:`RankStats` plus losses not tied to one rank.

    ``rejected_frames`` is the job total (the per-rank counts plus connections refused before
    they named a rank); ``projection_skipped`` the 000 seed's ``skipped`` units summed over every
    admitted payload; ``unknown_streams`` rows per stream name no projection knows;
    ``sink_errors`` payload sinks (exporter seam) that raised; ``refused_connections`` connections
    closed before a valid hello (wrong or missing job-secret proof, replayed or oversized hello, too
    many waiting connections), with ``refusal_reasons``; ``dropped_connections`` connections of
    admitted ranks closed by the aggregator (a frame over the size limit).
    """

    ranks: dict[int | None, RankStats] = field(default_factory=dict)
    connections: int = 0
    rejected_frames: int = 0
    rejection_reasons: list[str] = field(default_factory=list)
    projection_skipped: int = 0
    projection_failures: list[str] = field(default_factory=list)
    unknown_streams: dict[str, int] = field(default_factory=dict)
    sink_errors: int = 0
    sink_messages: list[str] = field(default_factory=list)
    refused_connections: int = 0
    refusal_reasons: list[str] = field(default_factory=list)
    dropped_connections: int = 0
    # The event loop (hellos) and the writer thread (frames) both count; these two are shared.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def rank(self, global_rank: int | None) -> RankStats:
        """The :class:`RankStats` of ``global_rank``, created on first use."""
        found = self.ranks.get(global_rank)
        if found is None:
            with self._lock:
                found = self.ranks.setdefault(global_rank, RankStats(global_rank))
        return found

    def reject(self, global_rank: int | None, reason: str, *, batch: bool = False, known: bool = True) -> None:
        """Count one rejected frame (``known``: the connection named its rank, so it counts per rank)."""
        stats = self.rank(global_rank) if known else None
        with self._lock:
            self.rejected_frames += 1
            keep_message(self.rejection_reasons, reason)
            if stats is not None:
                stats.rejected_frames += 1
                if batch:
                    stats.rejected_batches += 1

    def refuse(self, reason: str) -> None:
        """Count one connection refused before it proved it belongs to the job (never per rank: an
        unauthenticated peer's claims are not recorded as a rank)."""
        with self._lock:
            self.refused_connections += 1
            keep_message(self.refusal_reasons, reason)

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.ranks.values())

    @property
    def batches(self) -> int:
        return sum(r.batches for r in self.ranks.values())
