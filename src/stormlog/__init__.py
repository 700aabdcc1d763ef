"""Stormlog compatibility face of ``traceml_ai.catalog`` (DESIGN §1). The catalog is not built yet."""
