"""The compiled accelerator of ingest (numba): plain JSON lines scanned into typed columns with
their canonical JSON (``jsonlines``), and the record hash both paths share (``rechash``). The SQL
validator is the reference; tests hold this to it line for line."""
