"""Hooks for tests and diagnostics, kept off the public KVCR class: they
look inside an instance's state and promise nothing across releases."""
from __future__ import annotations

from typing import Optional

from .api import KVCR


def stored_hint(kv: KVCR, request_id: str) -> Optional[tuple]:
    """(source endpoint, sorted unique block hashes, failed) of the router
    hint `kv` keeps for request_id, or None (libkvcr's kvcr/testing.h)."""
    return kv._native.hint(request_id)
