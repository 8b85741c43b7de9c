"""The KV cache's memory budget: admission by the memory a sequence may come to hold.

The cache is one slot of the full context per possible sequence, but its pages are committed only as
positions are written and given back when a slot is released (or trimmed), so resident memory
follows the positions in use. The budget bounds that: a sequence is admitted only when the
positions it may reach (its prompt plus its token limit, within the context) fit beside those the
running sequences and the kept prefixes may reach; otherwise it waits for one to finish, and kept
prefixes are evicted first. So the cache never grows past the budget, however the requests end.
"""

from __future__ import annotations

from dataclasses import dataclass

from infer.engine.backends.kv_cache import KVCache


@dataclass(frozen=True)
class KVBudget:
    """How many bytes of KV the running sequences and kept prefixes may hold (0 = no bound)."""

    budget_bytes: int
    position_bytes: int
    """Bytes one position takes in every layer, keys and values."""
    ctx_size: int

    @classmethod
    def for_cache(cls, cache: KVCache, budget_bytes: int, ctx_size: int) -> KVBudget:
        """The budget over `cache`'s layout."""
        layers, _, kv_heads, _, head_dim = cache.keys.shape
        itemsize = int(getattr(cache.keys.dtype, "itemsize", 4))
        return cls(budget_bytes, 2 * layers * kv_heads * head_dim * itemsize, ctx_size)

    @property
    def bounded(self) -> bool:
        """A budget was set."""
        return self.budget_bytes > 0

    def positions(self, prompt: int, max_tokens: int | None) -> int:
        """The most positions a sequence may hold: its prompt and token limit, within the context."""
        limit = self.ctx_size if max_tokens is None else prompt + max_tokens
        return min(limit, self.ctx_size)

    def bytes_for(self, positions: int) -> int:
        """Bytes `positions` positions take."""
        return positions * self.position_bytes

    def fits(self, held_positions: int, more: int) -> bool:
        """Whether `more` positions fit beside `held_positions` ones."""
        return not self.bounded or self.bytes_for(held_positions + more) <= self.budget_bytes

    @property
    def max_positions(self) -> int:
        """Positions the whole budget holds."""
        return self.budget_bytes // self.position_bytes if self.bounded else 0
