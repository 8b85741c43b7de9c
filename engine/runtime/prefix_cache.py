"""Automatic prefix caching over the slot cache: a finished sequence's prompt keeps its KV, and a new
request that starts with the same tokens skips computing them.

What is kept is whole prefill chunks of the prompt only (positions [0, k * chunk_size)), the same
chunks a fresh prefill computes with the same rows at the same positions (chunk boundaries are
multiples of chunk_size from the start of every prompt), so a reused position holds what
recomputing it would give and reuse never changes a token. Generated tokens are not kept: they were
computed one row at a time, not as a chunk.

A kept prefix lives in a slot no sequence holds (its pages past the prefix are given back). A new
sequence whose prompt shares the longest kept prefix, at least one chunk and not its whole prompt
(one token must be computed for its logits), gets the prefix copied into a free slot; when no slot
is free it takes the kept slot itself. Kept slots are evicted least recently used when a sequence
needs a slot and none is free, so caching never makes a request wait.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from infer.engine.backends.kv_cache import KVCache


@dataclass
class PrefixCache:
    """Kept prompt prefixes by slot (see the module docstring); the scheduler's slot source."""

    cache: KVCache
    chunk_size: int
    """The scheduler's prefill chunk: prefixes are kept and reused in whole chunks."""
    sliding_window: int | None = None
    """The model's sliding window, if its cache forgets old positions of windowed layers: a prefix
    is reused only where the positions the next row reads were kept."""
    hits: int = 0
    """Requests that reused a kept prefix."""
    reused_tokens: int = 0
    """Prompt tokens not computed thanks to kept prefixes."""
    _kept: OrderedDict[int, tuple[int, ...]] = field(default_factory=OrderedDict)
    """Slot -> the prompt tokens whose KV it holds, least recently used first."""

    @property
    def kept_slots(self) -> int:
        """Slots holding a kept prefix (not held by any sequence)."""
        return len(self._kept)

    def keep(self, slot: int, prompt: tuple[int, ...], computed: int) -> bool:
        """Keep the whole prompt chunks among the first `computed` positions of a released `slot`;
        False (nothing kept, the caller releases the slot) when there is not one whole chunk."""
        length = min(computed, len(prompt)) // self.chunk_size * self.chunk_size
        if length == 0:
            return False
        self.cache.trim(slot, length)
        self._kept[slot] = prompt[:length]
        self._kept.move_to_end(slot)
        return True

    def acquire(self, prompt: tuple[int, ...]) -> tuple[int | None, int]:
        """A slot for a new sequence with `prompt` and how many of its first tokens that slot already
        holds: a free slot with the longest kept prefix copied in, or a kept slot taken over, or a
        plain free slot (0), or an evicted kept slot (0); (None, 0) when every slot is held."""
        source, length = self._best(prompt)
        slot = self.cache.acquire()
        if slot is None and source is not None:
            del self._kept[source]  # no free slot: the kept slot itself becomes the sequence's
            self._count(length)
            return source, length
        if slot is None:
            if not self._kept:
                return None, 0
            evicted, _ = self._kept.popitem(last=False)
            self.cache.release(evicted)
            slot = self.cache.acquire()
            return slot, 0
        if source is None:
            return slot, 0
        self.cache.copy_prefix(source, slot, length)
        self._kept.move_to_end(source)
        self._count(length)
        return slot, length

    @property
    def kept_positions(self) -> int:
        """Positions the kept prefixes hold (what they count against a memory budget)."""
        return sum(len(kept) for kept in self._kept.values())

    def evict_oldest(self) -> None:
        """Give the least recently used kept slot back (nothing when none is kept)."""
        if self._kept:
            slot, _ = self._kept.popitem(last=False)
            self.cache.release(slot)

    def clear(self) -> None:
        """Give every kept slot back."""
        while self._kept:
            slot, _ = self._kept.popitem()
            self.cache.release(slot)

    def _count(self, length: int) -> None:
        self.hits += 1
        self.reused_tokens += length

    def _best(self, prompt: tuple[int, ...]) -> tuple[int | None, int]:
        """The kept slot sharing the most whole chunks with `prompt` (at most len(prompt) - 1 tokens)."""
        best, best_length = None, 0
        limit = (len(prompt) - 1) // self.chunk_size * self.chunk_size
        for slot, kept in self._kept.items():
            length = 0
            while length + self.chunk_size <= min(limit, len(kept)) and (
                kept[length : length + self.chunk_size] == prompt[length : length + self.chunk_size]
            ):
                length += self.chunk_size
            if length > best_length and self._readable(slot, length):
                best, best_length = slot, length
        return best, best_length

    def _readable(self, slot: int, length: int) -> bool:
        """Every position the row at `length` reads is still in the slot (a windowed model's cache
        gives back positions that fell out of the window)."""
        forgotten = self.cache.forgotten(slot)
        if forgotten == 0:
            return True
        return self.sliding_window is not None and forgotten <= length + 1 - self.sliding_window
