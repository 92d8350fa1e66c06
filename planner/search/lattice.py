"""The data-parallel degrees each candidate layout may take, and where it fits in memory.

A layout without its data-parallel degree (a *class*, planner.search.space) may take the degrees of its
lattice: multiples of its expert-parallel degree up to the GPU limit and, with a global batch,
only those dividing global_batch / micro_batch. Memory never rises with the degree from two ranks
up, so the smallest fitting degree is found by bisection; windows of consecutive degrees are the
unit of work the search evaluates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.core.arrays import unique_rows
from planner.scenario import legality
from planner.search.evaluate import GpuTable, grad_accum_of, memory_of, within_card
from planner.search.request import SearchRequest
from planner.search.space import Classes

#: Data-parallel degrees evaluated together as one unit of work.
WINDOW = 64


@dataclass
class Lattice:
    """Each class's allowed data-parallel degrees: ``value(i, j)`` for j < ``count[i]``:
    multiples of the class's expert-parallel degree (``step``) up to the GPU limit, and, with a
    global batch, only those dividing global_batch / micro_batch."""

    count: np.ndarray
    q_index: np.ndarray | None  # row of ``divisors`` (global batch given), else None
    divisors: np.ndarray | None
    step: np.ndarray | None = None  # dp's step per class (None: 1): ep, or its folded share

    def value(self, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        if self.divisors is None:
            return (j + 1) * (1 if self.step is None else self.step[i])
        assert self.q_index is not None  # given with the divisors
        return self.divisors[self.q_index[i], j]


def build_lattice(req: SearchRequest, table: GpuTable, cls: Classes) -> Lattice:
    a = cls.a
    if len(cls) == 0:
        return Lattice(np.zeros(0, dtype=np.int64), None, None)
    mp = a["tp"] * a["pp"] * a["cp"]
    ep, etp = a["ep"], req.rs.layout.etp

    def experts_fit(dp: np.ndarray | int) -> np.ndarray:
        return np.asarray(legality.ep_dp(dp, ep, tp=a["tp"], cp=a["cp"], etp=etp).legal)

    step = legality.expert_dp_step(a["tp"], a["cp"], ep, etp)  # dp's legal values: its multiples
    dmax = table.limit[a["gpu"]] // mp
    if req.dp_pin is None and req.gpus_pin is not None:
        # A pinned GPU count fixes dp for each layout: gpus / (tp·pp·cp), where that divides.
        dp = req.gpus_pin // mp
        ok = (req.gpus_pin % mp == 0) & (dp >= 1) & (dp <= dmax) & experts_fit(dp)
        if req.global_batch:
            ok &= (req.global_batch // a["micro_batch"]) % np.maximum(dp, 1) == 0
        dp = np.maximum(dp, 1)
        return Lattice(ok.astype(np.int64), np.arange(len(cls)), dp[:, None])
    if req.dp_pin is not None:
        ok = (req.dp_pin <= dmax) & experts_fit(req.dp_pin)
        if req.gpus_pin is not None:
            ok &= req.dp_pin * mp == req.gpus_pin
        if req.global_batch:
            ok &= (req.global_batch // a["micro_batch"]) % req.dp_pin == 0
        return Lattice(ok.astype(np.int64), np.zeros(len(cls), dtype=np.int64),
                       np.full((1, 1), req.dp_pin, dtype=np.int64))
    if not req.global_batch:
        return Lattice(np.maximum(dmax // step, 0), None, None, step)
    q = req.global_batch // a["micro_batch"]
    uniq, q_index = unique_rows(np.stack([q, step], axis=1).astype(np.int64))
    q_index = q_index.ravel()
    divs = [[d for d in range(u_ep, int(u_q) + 1, u_ep) if u_q % d == 0] for u_q, u_ep in uniq]
    width = max(1, max(len(d) for d in divs))
    big = np.iinfo(np.int64).max
    mat = np.full((len(uniq), width), big, dtype=np.int64)
    for r, d in enumerate(divs):
        mat[r, : len(d)] = d
    count = (mat[q_index] <= dmax[:, None]).sum(axis=1).astype(np.int64)
    return Lattice(count, q_index, mat)


def memory_fits(req: SearchRequest, table: GpuTable, cls: Classes, idx: np.ndarray, dp: np.ndarray) -> np.ndarray:
    c = {k: v[idx] for k, v in cls.a.items()}
    ga = grad_accum_of(req, c["micro_batch"], dp)
    return within_card(table, c["gpu"], memory_of(req, c, dp, np.maximum(ga, 1))["phases"])


def fitting_start(req: SearchRequest, table: GpuTable, cls: Classes, lat: Lattice,
                  idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Where each class (of ``idx``) fits in memory: ``(start, alone)``.

    ``start`` is the smallest lattice index from which every larger degree fits (``count`` where
    none does), found by bisection: from two data-parallel ranks up, memory never rises with dp
    (ZeRO shards over it, fewer micro-batches stay in flight). Going from one rank to two can
    add memory (a data-parallel communicator, DDP's gradient buckets), so a single rank is tested
    on its own: ``alone`` marks the classes that fit at dp = 1 although dp = 2 does not (then
    dp = 1 is a window of its own)."""
    idx = np.arange(len(cls)) if idx is None else idx
    count = lat.count[idx]
    n = len(idx)
    has = count > 0
    zeros = np.zeros(n, dtype=np.int64)
    one_first = has & (lat.value(idx, zeros) == 1) if n else zeros.astype(bool)
    fits_one = np.zeros(n, dtype=bool)
    if one_first.any():
        fits_one[one_first] = memory_fits(req, table, cls, idx[one_first], np.ones(int(one_first.sum()),
                                                                                   dtype=np.int64))
    base = np.where(one_first, 1, 0)  # where the monotone part of the lattice begins
    lo = base.copy()
    hi = count.copy()  # answer in [lo, hi]; hi = count means "never"
    probe = has & (base < count)
    # Many layouts fit at the smallest degree: test it first, then the largest, then bisect.
    bottom_ok = np.zeros(n, dtype=bool)
    if probe.any():
        bottom_ok[probe] = memory_fits(req, table, cls, idx[probe], lat.value(idx[probe], base[probe]))
    top_ok = bottom_ok.copy()
    rest = probe & ~bottom_ok & (count > base + 1)
    if rest.any():
        top_ok[rest] = memory_fits(req, table, cls, idx[rest], lat.value(idx[rest], count[rest] - 1))
    hi[bottom_ok] = base[bottom_ok]
    lo[rest & top_ok] = base[rest & top_ok] + 1
    hi[rest & top_ok] = count[rest & top_ok] - 1
    active = top_ok & (lo < hi)
    while active.any():
        a = np.flatnonzero(active)
        mid = (lo[a] + hi[a]) // 2
        ok = memory_fits(req, table, cls, idx[a], lat.value(idx[a], mid))
        hi[a[ok]] = mid[ok]
        lo[a[~ok]] = mid[~ok] + 1
        active = top_ok & (lo < hi)
    start = np.where(top_ok, hi, count)
    joined = fits_one & (start == 1)
    start[joined] = 0
    alone = fits_one & (start > 1)
    return start, alone


def fitting_windows(req: SearchRequest, table: GpuTable, cls: Classes, lat: Lattice,
                    idx: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Windows (class, first index, end index) of degrees known to fit, and the classes that fit
    at no allowed degree (a mask over ``idx``)."""
    idx = np.arange(len(cls)) if idx is None else idx
    start, alone = fitting_start(req, table, cls, lat, idx)
    wc, ws, we = degree_windows(Lattice(lat.count[idx], None, None), start)
    lone = np.flatnonzero(alone)
    wc = np.concatenate([wc, lone])
    ws = np.concatenate([ws, np.zeros(len(lone), dtype=np.int64)])
    we = np.concatenate([we, np.ones(len(lone), dtype=np.int64)])
    never = (start >= lat.count[idx]) & ~alone
    return idx[wc], ws, we, never


def degree_windows(lat: Lattice, start: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    n_win = np.maximum(0, -(-(lat.count - start) // WINDOW))
    wc = np.repeat(np.arange(len(start)), n_win)
    k = np.arange(int(n_win.sum())) - np.repeat(np.cumsum(n_win) - n_win, n_win)
    ws = start[wc] + k * WINDOW
    we = np.minimum(ws + WINDOW, lat.count[wc])
    return wc, ws, we
