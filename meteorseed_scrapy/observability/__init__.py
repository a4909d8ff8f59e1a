"""Tracing (task ids on every log line, JSON logs) and an optional Prometheus endpoint."""
