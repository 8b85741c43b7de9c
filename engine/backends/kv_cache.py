"""The key/value cache: one slot per running sequence, preallocated by the backend.

It holds storage and slot ownership only: how many positions of a slot are valid is the step
loop's sequence position (the one position counter), which reaches the model through the batch.

The storage dtype is the engine's `kv_cache_dtype`: `f32` (the compute dtype, what the reference
tests and gates use) or `f16` (IEEE halves, half the memory and half the bytes attention reads per
step; the backend rounds on write and widens to float32 on read). A backend offers the dtypes its
`kv_cache_dtypes` lists (one without that attribute stores f32 only); another is refused before
anything is allocated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from infer.engine.backends.arrays import Array
from infer.engine.backends.errors import BackendError

KV_CACHE_DTYPES: dict[str, str] = {"f32": "float32", "f16": "float16"}
"""`kv_cache_dtype` values (llama.cpp's spellings) -> the storage dtype they name."""


class _Allocator(Protocol):
    """The Backend methods the cache needs (named here so the protocol module need not be imported)."""

    def zeros(self, shape: tuple[int, ...]) -> Array:
        """A zero-filled array in the compute dtype (the f32 cache)."""
        ...

    def discard(self, array: Array) -> None:
        """Hand the memory behind `array` (a view of a `zeros` array) back to the system; its
        contents are undefined afterwards (zeros on the CPU)."""
        ...


class KVCacheDtypeError(BackendError):
    """A `kv_cache_dtype` the backend (in its mode) cannot store, or none of KV_CACHE_DTYPES."""


def check_kv_cache_dtype(backend: object, kv_dtype: str) -> None:
    """Raise KVCacheDtypeError (one line) unless `backend` stores a KV cache in `kv_dtype`."""
    if kv_dtype not in KV_CACHE_DTYPES:
        raise KVCacheDtypeError(
            f"kv_cache_dtype must be one of {', '.join(KV_CACHE_DTYPES)}, got {kv_dtype!r}"
        )
    offered: tuple[str, ...] = getattr(backend, "kv_cache_dtypes", ("f32",))
    if kv_dtype not in offered:
        name = getattr(backend, "name", type(backend).__name__)
        raise KVCacheDtypeError(
            f"kv_cache_dtype {kv_dtype} is not available on this {name} backend, which stores the KV "
            f"cache in {', '.join(offered)} only (f16 runs on the cpu backend with cpu_kernels exact or int8)"
        )


@dataclass
class KVCache:
    """Keys and values for every layer and slot: arrays [layers, slots, kv_heads, capacity, head_dim]
    in the compute dtype or the `kv_cache_dtype` asked for (see `allocate`).

    The arrays are allocated once, by the backend. The CPU backend maps anonymous zero pages lazily
    (4 KB pages, transparent huge pages declined), so a slot only costs memory for the positions it
    has written. Only the backend reads or writes them (`write_kv`, `attention`).
    """

    keys: Array
    values: Array
    capacity: int
    """Positions per slot (the context size)."""
    discard: Callable[[Array], None] | None = None
    """Returns a released slot's memory to the system (the backend's `discard`), so resident memory
    follows the sequences in use instead of the most ever held at once."""
    may_rewind: bool = False
    """A later step may restart a sequence before an earlier step's first row (a draft model's
    cache, rewound to what the target kept): `forget_before` then gives nothing back."""
    _free: list[int] = field(init=False)
    _forgotten: dict[int, int] = field(init=False, default_factory=dict)
    """Per held slot: positions before this were given back by `forget_before`."""

    def __post_init__(self) -> None:
        self._free = list(range(self.num_slots - 1, -1, -1))

    @classmethod
    def allocate(
        cls,
        backend: _Allocator,
        layers: int,
        slots: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: str = "f32",
    ) -> KVCache:
        """A cache with `slots` sequences of up to `capacity` positions each, stored in `dtype` (a
        `kv_cache_dtype`: BackendError when the backend does not offer it)."""
        check_kv_cache_dtype(backend, dtype)
        shape = (layers, slots, kv_heads, capacity, head_dim)
        if dtype == "f32":
            keys, values = backend.zeros(shape), backend.zeros(shape)
        else:  # a backend that offers another dtype takes it as zeros' storage dtype
            storage = KV_CACHE_DTYPES[dtype]
            keys, values = backend.zeros(shape, storage), backend.zeros(shape, storage)  # type: ignore[call-arg]
        return cls(keys, values, capacity, getattr(backend, "discard", None))

    @property
    def num_slots(self) -> int:
        """How many sequences the cache can hold at once."""
        return int(self.keys.shape[1])

    @property
    def free_slots(self) -> int:
        """Slots not held by any sequence."""
        return len(self._free)

    def acquire(self) -> int | None:
        """Take the lowest free slot (None when all are held); lowest-first keeps batches dense."""
        if not self._free:
            return None
        return self._free.pop()

    def forget_before(self, layers: Sequence[int], slot: int, position: int, stride: int) -> None:
        """Give back the memory of `slot`'s positions before `position` (rounded down to a multiple
        of `stride`) in `layers`: positions no later row of the sequence will read (a sliding-window
        layer's positions that fell out of every future window). Each position is given back once;
        the mark resets when the slot is released. Contents are undefined afterwards; a backend
        without `discard` keeps them."""
        upto = max(0, position) // stride * stride
        done = self._forgotten.get(slot, 0)
        if self.discard is None or self.may_rewind or upto <= done:
            return
        for layer in layers:
            self.discard(self.keys[layer, slot, :, done:upto])
            self.discard(self.values[layer, slot, :, done:upto])
        self._forgotten[slot] = upto

    def forgotten(self, slot: int) -> int:
        """Positions of `slot` before this were given back by `forget_before` (0: none)."""
        return self._forgotten.get(slot, 0)

    def trim(self, slot: int, length: int) -> None:
        """Give back the memory of `slot`'s positions from `length` on (a kept prefix's tail)."""
        if self.discard is not None and length < self.capacity:
            self.discard(self.keys[:, slot, :, length:])
            self.discard(self.values[:, slot, :, length:])

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        """Copy positions [0, length) of every layer from slot `source` to slot `target` (a kept
        prompt prefix reused by a new sequence); the source's forgotten positions come along."""
        self.keys[:, target, :, :length] = self.keys[:, source, :, :length]
        self.values[:, target, :, :length] = self.values[:, source, :, :length]
        if self.forgotten(source):
            self._forgotten[target] = self.forgotten(source)

    def release(self, slot: int) -> None:
        """Give a slot back at once (finished, cancelled or failed sequence)."""
        if slot in self._free:
            return
        if self.discard is not None:
            self.discard(self.keys[:, slot])
            self.discard(self.values[:, slot])
        self._forgotten.pop(slot, None)
        self._free.append(slot)
        self._free.sort(reverse=True)
