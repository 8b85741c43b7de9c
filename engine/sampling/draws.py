"""Seeded, position-pure randomness: the uniforms of step ``position`` depend only on (seed, position).

Re-exported by :mod:`infer.engine.sampling`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["PositionRng", "draw_uniforms", "to_unit"]


def draw_uniforms(seed: int, position: int, n: int) -> np.ndarray:
    """The ``n`` uniforms in [0, 1) of step ``position``: a pure function of (seed, position).

    ``raw = numpy.random.Philox(key=seed, counter=position << 64).random_raw(n)`` (Philox4x64-10;
    numpy increments the 256-bit counter before each block of four words), then
    ``u = (raw >> 11) * 2**-53``. ``u[0]`` is the final draw, ``u[1 + i]`` the coin of the i-th
    ``xtc`` stage in the chain. Any backend can reproduce this by calling it on the host.
    """
    raw = np.random.Philox(key=seed, counter=position << 64).random_raw(n)
    return to_unit(raw)


def to_unit(raw: np.ndarray) -> np.ndarray:
    """Raw 64-bit words to uniforms in [0, 1): the top 53 bits times 2**-53."""
    return (raw >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


class PositionRng:
    """:func:`draw_uniforms` for one seed, reusing one Philox (setting its state is ~6x cheaper)."""

    def __init__(self, seed: int) -> None:
        self._bg = np.random.Philox(key=seed)
        self._key = self._bg.state["state"]["key"].copy()

    def uniforms(self, position: int, n: int) -> np.ndarray:
        """``draw_uniforms(seed, position, n)``."""
        self._bg.state = {
            "bit_generator": "Philox",
            "state": {"counter": np.array([0, position, 0, 0], dtype=np.uint64), "key": self._key},
            "buffer": np.zeros(4, dtype=np.uint64),
            "buffer_pos": 4,
            "has_uint32": 0,
            "uinteger": 0,
        }
        return to_unit(self._bg.random_raw(n))
