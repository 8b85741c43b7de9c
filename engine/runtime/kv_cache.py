"""The KV cache the step loop hands out slots of; it lives with the backends, which own its storage."""

from __future__ import annotations

from infer.engine.backends.kv_cache import KVCache

__all__ = ["KVCache"]
