"""``stormlog.query``: the 004 seed's Python query API, served by :mod:`traceml_ai.catalog`.

Example (the seed's, verbatim)::

    import stormlog.query

    store = stormlog.query.open(["./artifacts"])
    runs = store.list_runs()
    attachments = store.list_run_attachments()
"""

from traceml_ai.catalog import (
    AttachmentRow,
    CatalogStore,
    CatalogWarning,
    RunRow,
    SessionRow,
    add_attachment,
    open_catalog,
    write_envelope,
)

open = open_catalog  # the seed's name: stormlog.query.open(paths)

__all__ = [
    "AttachmentRow",
    "CatalogStore",
    "CatalogWarning",
    "RunRow",
    "SessionRow",
    "add_attachment",
    "open",
    "write_envelope",
]
