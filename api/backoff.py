"""Exponential backoff, shared with the workers: it lives in ``worker.contract.runtime.backoff``."""

from __future__ import annotations

from worker.contract.runtime.backoff import Backoff

__all__ = ["Backoff"]
