"""The tiny ops a GPU backend's probe runs against numpy before it says yes: a matmul and the
device half of envelope sampling (`candidates.top_candidates`). Anything wrong or raising is a
reason, never a crash: the probe fails closed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from infer.engine.backends.candidates import RowBias, top_candidates


def check_array_module(xp: Any, to_host: Callable[[Any], np.ndarray], label: str) -> str | None:
    """None when `xp` multiplies a tiny matrix within float32 rounding of numpy and picks the same
    sampling candidates as numpy (bias, NaN and -inf rows included); else why not."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((3, 32)).astype(np.float32)
    b = rng.standard_normal((32, 5)).astype(np.float32)
    logits = rng.standard_normal((3, 50)).astype(np.float32)
    logits[1, :] = -np.inf
    logits[1, 7] = 2.0
    logits[2, 3] = np.nan
    bias = RowBias(np.array([0, 0]), np.array([4, 9]), np.array([5.0, -np.inf], dtype=np.float32))
    try:
        product = np.asarray(to_host(xp.array(a) @ xp.array(b)), dtype=np.float32)
        got = top_candidates(xp, xp.array(logits), bias, 6, to_host)
    except Exception as exc:
        return f"tiny op failed: {type(exc).__name__}: {exc}"
    if not np.allclose(product, a @ b, rtol=1e-4, atol=1e-4):
        return f"tiny op failed: {label} matmul differs from numpy"
    want = top_candidates(np, logits, bias, 6)
    same = (
        np.array_equal(got.unsafe, want.unsafe)
        and np.array_equal(got.values[~want.unsafe], want.values[~want.unsafe])
        and np.array_equal(np.sort(got.ids[0]), np.sort(want.ids[0]))
    )
    return None if same else f"tiny sampling op failed: {label} candidates differ from numpy"
