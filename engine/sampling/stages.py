"""The individual sampler stages, as pure functions on a candidate set (numpy).

A candidate set is a pair ``(ids, logits)``: ``ids`` are int64 token ids, ``logits`` their current
(finite) logits. A stage returns a new pair and never mutates its inputs. Every stage keeps at least
one candidate; stages that take ``min_keep`` keep at least ``min_keep`` where llama.cpp does.

Candidate ids are always kept in ascending order (the full vocabulary starts as ``arange``).

Semantics follow llama.cpp's CPU samplers (``src/llama-sampler.cpp``), with two deliberate
differences that make results reproducible on any backend:

* tokens at ``-inf`` are never candidates (llama.cpp keeps them in the array with p = 0);
* wherever llama.cpp sorts, ties are broken by token id: the order is "logit descending, then token
  id ascending" (llama.cpp's sort is not stable, so its tie order is unspecified).

Vocabulary-sized work uses ``np.argpartition`` on a pre-filtered pool, never a full sort, except
where a stage's kept set is itself huge: top-p and typical-p first try the best 256 then 2048
tokens, and only sort the whole candidate set when the nucleus is larger than that.
"""

from __future__ import annotations

import math

import numpy as np

from infer.engine.sampling.params import MIN_TEMPERATURE

Cands = tuple[np.ndarray, np.ndarray]

# llama.cpp clamps the DRY exponent so that base**exp stays a finite float32 (log(FLT_MAX)).
_FLOAT_MAX_LOG = 88.7228391
# mirostat v1 estimates the Zipf exponent from the m most probable tokens (llama.cpp uses 100).
MIROSTAT_M = 100


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities of a candidate set, in the logits' dtype; the normaliser is summed in float64.

    Normalised in place: a vocabulary-sized float64 temporary costs more than the whole stage.
    """
    e = np.exp(logits - logits.max())
    e *= e.dtype.type(1.0 / e.sum(dtype=np.float64))
    return e


def logsumexp(logits: np.ndarray) -> float:
    """log(sum(exp(logits))); exp in the logits' dtype, the sum in float64."""
    m = logits.max()
    return float(m) + math.log(float(np.exp(logits - m).sum(dtype=np.float64)))


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    """Log-probabilities (float64) of a candidate set; finite wherever the logit is finite."""
    return logits.astype(np.float64) - logsumexp(logits)


def entropy(logits: np.ndarray) -> float:
    """Entropy (nats) of the softmax of ``logits``."""
    shifted = logits - logits.max()
    e = np.exp(shifted)
    z = float(e.sum(dtype=np.float64))
    return math.log(z) - float(np.sum(e * shifted, dtype=np.float64)) / z


def order_desc(ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """Indices sorting candidates by logit descending, ties by token id ascending."""
    return np.lexsort((ids, -logits))


def top_indices(ids: np.ndarray, logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best candidates (logit descending, ties by lowest token id), unordered.

    Avoids a full partition of a large vocabulary: the k-th best of a strided subset is a lower
    bound of the k-th best overall, so only the (small) pool at or above it is partitioned.
    """
    n = logits.shape[0]
    if k >= n:
        return np.arange(n)
    stride = n // (16 * k) if k > 0 else 1
    if n > 4096 and stride >= 2:
        stride = min(stride, 64)
        sub = logits[::stride]
        bound = np.partition(sub, sub.shape[0] - k)[sub.shape[0] - k]
        pool = np.flatnonzero(logits >= bound)
    else:
        pool = np.arange(n)
    vals = logits[pool]
    kth = np.partition(vals, vals.shape[0] - k)[vals.shape[0] - k]
    above = pool[vals > kth]
    ties = pool[vals == kth]
    ties = ties[: k - above.shape[0]]  # pool is ascending, and so are ids: lowest ids first
    return np.concatenate((above, ties))


def _take(ids: np.ndarray, logits: np.ndarray, sel: np.ndarray) -> Cands:
    """The candidates at indices ``sel``, kept in ascending index (hence token id) order."""
    if sel.shape[0] <= 512:
        sel = np.sort(sel)
    else:
        mask = np.zeros(ids.shape[0], dtype=bool)
        mask[sel] = True
        sel = np.flatnonzero(mask)
    return ids[sel], logits[sel]


def _best_prefix(ids: np.ndarray, logits: np.ndarray, k: int, kth: float) -> np.ndarray:
    """Indices of the k best candidates given the k-th best logit value ``kth``."""
    above = np.flatnonzero(logits > kth)
    ties = np.flatnonzero(logits == kth)[: k - above.shape[0]]  # ids ascending: lowest ids first
    return np.concatenate((above, ties))


def positions_of(ids: np.ndarray, tokens: np.ndarray, identity: bool) -> tuple[np.ndarray, np.ndarray]:
    """(positions in ``ids``, indices into ``tokens``) of the tokens that are candidates."""
    if identity:
        ok = (tokens >= 0) & (tokens < ids.shape[0])
        return tokens[ok], np.flatnonzero(ok)
    pos = np.minimum(np.searchsorted(ids, tokens), ids.shape[0] - 1)  # ids are ascending
    ok = ids[pos] == tokens
    return pos[ok], np.flatnonzero(ok)


# --------------------------------------------------------------------------- logit modifiers


def penalties(
    c: Cands,
    tokens: np.ndarray,
    counts: np.ndarray,
    repeat: float,
    freq: float,
    present: float,
    identity: bool,
) -> Cands:
    """Repetition / frequency / presence penalties (llama.cpp ``penalties``).

    For each candidate seen ``count > 0`` times in the window: a logit <= 0 is multiplied by
    ``repeat``, a positive one divided by it; then ``count * freq + present`` is subtracted.
    """
    ids, logits = c
    if tokens.shape[0] == 0:
        return c
    pos, which = positions_of(ids, tokens, identity)
    if pos.shape[0] == 0:
        return c
    out = logits.copy()
    v = out[pos].astype(np.float64)
    v = np.where(v <= 0, v * repeat, v / repeat)
    v -= counts[which] * freq + present
    out[pos] = v
    return ids, out


def dry_penalties(
    window: np.ndarray,
    breaker: np.ndarray | None,
    multiplier: float,
    base: float,
    allowed_length: int,
) -> tuple[np.ndarray, np.ndarray]:
    """DRY ("don't repeat yourself") penalties for the next token, from the token window.

    Returns ``(token_ids, penalty)``. A token that would extend a repetition of the window's suffix
    that already occurred earlier, of length ``n >= allowed_length``, gets
    ``multiplier * base ** (n - allowed_length)`` (exponent clamped as llama.cpp does).
    The repetition length is capped at the distance to the most recent sequence-breaker token
    (``breaker`` is a bool mask over the vocabulary), and breaker tokens are never penalised.
    """
    empty = (np.zeros(0, np.int64), np.zeros(0, np.float64))
    n_win = window.shape[0]
    if n_win <= allowed_length:
        return empty
    rep_limit = n_win
    if breaker is not None:
        hits = np.flatnonzero(breaker[window])
        if hits.shape[0]:
            rep_limit = n_win - 1 - int(hits[-1])
    if rep_limit < allowed_length:
        return empty
    lengths = np.minimum(_suffix_matches(window), rep_limit)
    hit = np.flatnonzero(lengths >= allowed_length)
    if hit.shape[0] == 0:
        return empty
    nxt = window[hit + 1]
    uniq, inv = np.unique(nxt, return_inverse=True)
    best = np.zeros(uniq.shape[0], dtype=np.int64)
    np.maximum.at(best, inv, lengths[hit])
    if breaker is not None:
        keep = ~breaker[uniq]
        uniq, best = uniq[keep], best[keep]
    exp = (best - allowed_length).astype(np.float64)
    if base > 1.000001:
        exp = np.minimum(exp, float(int(_FLOAT_MAX_LOG / math.log(base))))
    return uniq, multiplier * np.power(base, exp)


def _suffix_matches(window: np.ndarray) -> np.ndarray:
    """``m[e]`` (e < len - 1): length of the longest common suffix of ``window[:e+1]`` and ``window``.

    Vectorised extension of all candidate ends at once; when repeats run long (a degenerate loop,
    where that is quadratic) it switches to the linear Z-algorithm on the reversed window.
    """
    last = window.shape[0] - 1
    lengths = np.zeros(last, dtype=np.int64)
    active = np.flatnonzero(window[:last] == window[last])
    d = 0
    while active.shape[0]:
        if d == 48:
            return _suffix_matches_z(window)
        lengths[active] = d + 1
        d += 1
        active = active[active >= d]
        active = active[window[active - d] == window[last - d]]
    return lengths


def _suffix_matches_z(window: np.ndarray) -> np.ndarray:
    """:func:`_suffix_matches` by the Z-algorithm: z[k] = lcp(r, r[k:]) for r the reversed window."""
    r = window[::-1].tolist()
    n = len(r)
    z = [0] * n
    left = right = 0
    for k in range(1, n):
        zk = min(right - k, z[k - left]) if k < right else 0
        while k + zk < n and r[zk] == r[k + zk]:
            zk += 1
        z[k] = zk
        if k + zk > right:
            left, right = k, k + zk
    # shift k compares the suffix ending at e = n - 1 - k with the whole window's suffix
    return np.asarray(z[:0:-1], dtype=np.int64)


def subtract(c: Cands, tokens: np.ndarray, amounts: np.ndarray, identity: bool) -> Cands:
    """Subtract ``amounts`` from the logits of ``tokens`` (those that are candidates)."""
    ids, logits = c
    if tokens.shape[0] == 0:
        return c
    pos, which = positions_of(ids, tokens, identity)
    if pos.shape[0] == 0:
        return c
    out = logits.copy()
    out[pos] = out[pos].astype(np.float64) - amounts[which]
    return ids, out


# --------------------------------------------------------------------------- truncation stages


def top_k(c: Cands, k: int) -> Cands:
    """Keep the k best candidates; ``k <= 0`` or ``k >= len`` keeps all (llama.cpp ``top_k``)."""
    ids, logits = c
    if k <= 0 or k >= ids.shape[0]:
        return c
    return _take(ids, logits, top_indices(ids, logits, k))


def top_p(c: Cands, p: float, min_keep: int) -> Cands:
    """Nucleus: the smallest prefix (best first) whose probability reaches ``p`` (llama.cpp ``top_p``).

    The prefix has at least ``min_keep`` tokens; ``p >= 1`` keeps all.
    """
    ids, logits = c
    n = ids.shape[0]
    if p >= 1.0 or n <= 1:
        return c
    probs = softmax(logits)
    if n <= 4096:
        order = order_desc(ids, logits)
        cum = np.cumsum(probs[order], dtype=np.float64)
        i = max(int(np.searchsorted(cum, p, side="left")), min_keep - 1)
        return c if i >= n - 1 else _take(ids, logits, order[: i + 1])
    for width in (256, 2048):
        # partial sort first, as llama.cpp does: the nucleus is usually small
        sel = top_indices(ids, logits, width)
        sel = sel[order_desc(ids[sel], logits[sel])]
        cum = np.cumsum(probs[sel], dtype=np.float64)
        i = max(int(np.searchsorted(cum, p, side="left")), min_keep - 1)
        if i < width:
            return _take(ids, logits, sel[: i + 1])
    # sort the values only: probability order is logit order, so the kept set is
    # "logit > v, then ties at v by lowest id" for the cut-off value v
    desc = np.sort(logits)[::-1]
    cum = np.cumsum(np.exp(desc - desc[0]), dtype=np.float64)
    i = max(int(np.searchsorted(cum, p * cum[-1], side="left")), min_keep - 1)
    if i >= n - 1:
        return c
    return _take(ids, logits, _best_prefix(ids, logits, i + 1, desc[i]))


def min_p(c: Cands, p: float, min_keep: int) -> Cands:
    """Keep candidates with ``prob >= p * max_prob`` (at least ``min_keep``) (llama.cpp ``min_p``)."""
    ids, logits = c
    if p <= 0.0 or ids.shape[0] <= 1:
        return c
    threshold = float(logits.max()) + math.log(p)
    keep = np.flatnonzero(logits >= threshold)
    if keep.shape[0] >= max(min_keep, 1):
        if keep.shape[0] == ids.shape[0]:
            return c
        return _take(ids, logits, keep)
    return _take(ids, logits, top_indices(ids, logits, min(min_keep, ids.shape[0])))


def typical(c: Cands, p: float, min_keep: int) -> Cands:
    """Locally typical sampling (llama.cpp ``typ_p``).

    Candidates are ranked by ``|-log p - H|`` (H the entropy); the smallest prefix whose
    probability exceeds ``p`` (strictly) is kept, at least ``min_keep`` tokens.
    """
    ids, logits = c
    n = ids.shape[0]
    if p >= 1.0 or n <= 1:
        return c
    logp = log_softmax64(logits)
    probs = softmax(logits)
    h = -float(np.sum(probs * logp))  # no BLAS: its threads stall on busy hosts
    score = np.abs(-logp - h)
    for width in (256, 2048):
        if width >= n // 2:
            break
        # the most typical `width` tokens first (most distributions have a small typical set)
        sel = top_indices(ids, -score, width)
        sel = sel[np.lexsort((ids[sel], score[sel]))]
        cum = np.cumsum(probs[sel], dtype=np.float64)
        i = max(int(np.searchsorted(cum, p, side="right")), min_keep - 1)
        if i < width:
            return _take(ids, logits, sel[: i + 1])
    order = np.lexsort((ids, score))
    cum = np.cumsum(probs[order], dtype=np.float64)
    i = max(int(np.searchsorted(cum, p, side="right")), min_keep - 1)
    if i >= n - 1:
        return c
    return _take(ids, logits, order[: i + 1])


def top_n_sigma(c: Cands, n_sigma: float) -> Cands:
    """Keep logits >= max - n_sigma * std(logits) (llama.cpp ``top_n_sigma``); ``n_sigma <= 0`` is off."""
    ids, logits = c
    if n_sigma <= 0.0 or ids.shape[0] <= 1:
        return c
    x = logits.astype(np.float64)
    cutoff = x.max() - n_sigma * float(x.std())
    keep = np.flatnonzero(x >= cutoff)
    if keep.shape[0] == ids.shape[0]:
        return c
    return _take(ids, logits, keep)


def xtc(c: Cands, probability: float, threshold: float, min_keep: int, u: float) -> Cands:
    """Exclude Top Choices (llama.cpp ``xtc``).

    With chance ``probability`` (this step's uniform ``u <= probability``), every candidate with
    ``prob >= threshold`` except the least probable of them is removed, provided at least two
    qualify and ``min_keep`` candidates remain. ``threshold > 0.5`` disables the stage.
    """
    ids, logits = c
    if probability <= 0.0 or threshold > 0.5 or ids.shape[0] < 2 or u > probability:
        return c
    probs = softmax(logits)
    qual = np.flatnonzero(probs >= threshold)
    nq = qual.shape[0]
    if nq < 2 or ids.shape[0] - (nq - 1) < min_keep:
        return c
    last = qual[order_desc(ids[qual], logits[qual])[-1]]
    keep = probs < threshold
    keep[last] = True
    return _take(ids, logits, np.flatnonzero(keep))


def temperature(c: Cands, temp: float, dyn_range: float = 0.0, dyn_exponent: float = 1.0) -> Cands:
    """Temperature, with optional entropy-based dynamic temperature (llama.cpp ``temp_ext``).

    With ``dyn_range > 0`` the temperature is ``t_min + (t_max - t_min) * (H / log n) ** exponent``
    with ``t_min = max(0, temp - range)``, ``t_max = temp + range``, H the entropy of the
    candidates. A temperature below :data:`MIN_TEMPERATURE` (0 included) keeps only the best
    candidate: dividing by it could overflow float32, and it describes the argmax anyway.
    """
    ids, logits = c
    if dyn_range > 0.0:
        n = ids.shape[0]
        if n <= 1:
            return c
        t_min = max(0.0, temp - dyn_range)
        t_max = temp + dyn_range
        temp = t_min + (t_max - t_min) * (entropy(logits) / math.log(n)) ** dyn_exponent
    if temp < MIN_TEMPERATURE:
        best = top_indices(ids, logits, 1)
        return _take(ids, logits, best)
    if temp == 1.0:
        return c
    return ids, logits / logits.dtype.type(temp)


def mirostat_v1(c: Cands, mu: float, n_vocab: int) -> Cands:
    """Mirostat 1.0 truncation (llama.cpp ``mirostat``): top-k with k from the estimated Zipf exponent."""
    ids, logits = c
    n = ids.shape[0]
    if n <= 1:
        return c
    top = top_indices(ids, logits, min(MIROSTAT_M, n))
    top = top[order_desc(ids[top], logits[top])]
    x = logits[top].astype(np.float64)
    m = min(MIROSTAT_M - 1, n - 1)
    i = np.arange(m, dtype=np.float64)
    t = np.log((i + 2.0) / (i + 1.0))
    b = x[:m] - x[1 : m + 1]  # log(p_i / p_{i+1})
    with np.errstate(all="ignore"):
        # numpy scalars, not Python floats: an overflow gives inf (then k = n), never OverflowError
        s_hat = np.float64(np.sum(t * b) / np.sum(t * t))
        eps = s_hat - 1.0
        k = (eps * np.float64(2.0) ** mu / (1.0 - np.float64(n_vocab) ** (-eps))) ** (1.0 / s_hat)
    k_int = n if not np.isfinite(k) else int(min(max(k, 1.0), float(n)))
    return top_k(c, k_int)


def mirostat_v2(c: Cands, mu: float) -> Cands:
    """Mirostat 2.0 truncation (llama.cpp ``mirostat-v2``): keep tokens with surprise ``-log2 p <= mu``."""
    ids, logits = c
    if ids.shape[0] <= 1:
        return c
    # sorted by probability, surprise -log2 p grows: the kept prefix is {-log2 p <= mu},
    # i.e. {logit >= logsumexp - mu * ln 2}
    keep = np.flatnonzero(logits >= logsumexp(logits) - mu * math.log(2.0))
    if keep.shape[0] == 0:
        keep = top_indices(ids, logits, 1)
    if keep.shape[0] == ids.shape[0]:
        return c
    return _take(ids, logits, keep)
