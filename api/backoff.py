"""Exponential backoff, shared with the workers: it lives in ``worker.backoff``."""

from __future__ import annotations

from worker.backoff import Backoff

__all__ = ["Backoff"]
