"""The memory plane: long-term memory units extracted from sessions (MetaClaw v0.4's contextual layer).

Skills record *how* to do things; memory records *what happened* and what the user said, so the agent
remembers it weeks later. Units (`units.py`) live in a store (`store.py`: SQLite + FTS5 in the embedded
default, behind a small interface); the `Memory` Ray actor (`actor.py`) ingests completed main turns off
the request path (`ingest.py`: extraction, consolidation, supersession); the Proxy reads in-process
(`retrieval.py`, `injection.py`: hybrid full-text + embedding retrieval, fused by rank, token-budgeted).
This package imports no other plane: the embedder is handed in by the composition root (`cluster/`).
"""
