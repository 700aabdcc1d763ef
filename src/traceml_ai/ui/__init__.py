"""The local web viewer (``traceml ui``): a Starlette app over the run store (DESIGN §4)."""
