"""The live monitor: a collector service over the analysis pipeline (see docs/DESIGN.md, "Live monitor").

Modules: ``config`` (thresholds), ``store`` (SQLite / PostgreSQL), ``ingest`` (Arrow IPC batches),
``window`` (sliding-window analysis, chronic scores, hang detection), ``alerts`` (rules, delivery),
``metrics`` (Prometheus), ``auth`` (bearer token), ``service`` (the collector's state and background
analysis), ``app`` (HTTP routes), ``client`` (pushing batches), ``push`` (replaying a trace as if
live), ``cli`` (``laggard monitor``). Importing this package imports nothing heavy.
"""
