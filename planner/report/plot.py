"""Pictures: per-GPU memory of plans against the usable capacity, and a fleet's schedule.

matplotlib with the Agg backend (files only, no display needed); imported only when a plot is
asked for. Memory in GB (10^9 bytes), as the tables print it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

GB = 1e9
#: Component order, bottom to top; any other component follows in its own order.
COMPONENT_ORDER = ("weights", "gradients", "optimizer_states", "master_weights", "adapter_states", "reference_weights",
                   "activations", "kv_cache", "logits", "buffers", "overhead")


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def memory_bars(labels: list[str], components: list[dict[str, int]], usable_bytes: list[int | None],
                path: str | Path, title: str = "Memory per GPU") -> Path:
    """Stacked bars (one per plan, one segment per component) and each GPU's usable line."""
    from planner.report.files import atomic_write

    plt = _plt()
    names = [c for c in COMPONENT_ORDER if any(c in comp for comp in components)]
    names += sorted({k for comp in components for k in comp} - set(names))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.7 * len(labels) + 3), 4.8))
    x = range(len(labels))
    bottom = [0.0] * len(labels)
    cmap = plt.get_cmap("tab10")
    for i, name in enumerate(names):
        heights = [comp.get(name, 0) / GB for comp in components]
        ax.bar(x, heights, bottom=bottom, label=name.replace("_", " "), color=cmap(i % 10), width=0.6)
        bottom = [b + h for b, h in zip(bottom, heights)]
    for xi, usable in zip(x, usable_bytes):
        if usable:
            ax.hlines(usable / GB, xi - 0.4, xi + 0.4, colors="black", linestyles="--", linewidth=1.5)
    ax.plot([], [], "k--", label="usable capacity")
    ax.set_xticks(list(x))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("GB per GPU")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    out = atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return out


def plot_batch_memory(scenarios: pd.DataFrame, path: str | Path) -> Path:
    """The best plan of each scenario of a batch (rows without a plan are left out)."""
    rows = scenarios[scenarios["memory_components"].notna()]
    labels = [f"{r.scenario}\n{r.gpu}×{r.gpus}" for r in rows.itertuples()]
    comps = [json.loads(c) for c in rows["memory_components"]]
    usable = [int(u) for u in rows["usable_bytes"]]
    return memory_bars(labels, comps, usable, path)


def assign_gpus(slots: list[dict[str, Any]]) -> list[tuple[dict[str, Any], list[int]]]:
    """GPU indices for each slot of one lane: a contiguous block where one is free at its start,
    else any free GPUs (a capacity-feasible schedule always has enough)."""
    free_at: list[float] = []
    out = []
    for s in sorted(slots, key=lambda s: (s["start_hours"], s["job"])):
        n, t = int(s["gpus"]), s["start_hours"] + 1e-9
        free = [i for i, f in enumerate(free_at) if f <= t]
        block = next((list(range(i, i + n)) for i in range(len(free_at) - n + 1)
                      if all(free_at[k] <= t for k in range(i, i + n))), None)
        if block is None:
            block = free[:n]
            block += list(range(len(free_at), len(free_at) + n - len(block)))
        for i in block:
            if i >= len(free_at):
                free_at.extend([0.0] * (i + 1 - len(free_at)))
            free_at[i] = s["end_hours"]
        out.append((s, sorted(block)))
    return out


def _runs_of(indices: list[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 5, 6] -> [(0, 3), (5, 2)]: contiguous (first, length) pieces."""
    pieces: list[tuple[int, int]] = []
    for i in indices:
        if pieces and pieces[-1][0] + pieces[-1][1] == i:
            pieces[-1] = (pieces[-1][0], pieces[-1][1] + 1)
        else:
            pieces.append((i, 1))
    return pieces


def plot_schedule(slots: list[dict[str, Any]], horizon_hours: float, path: str | Path,
                  title: str = "Fleet schedule") -> Path:
    """One lane per GPU group, one row per GPU in it; a run is a bar over the GPUs it uses,
    from its start to its end, labelled with its job."""
    from planner.report.files import atomic_write

    plt = _plt()
    lanes: dict[str, list[dict[str, Any]]] = {}
    for s in slots:
        lanes.setdefault(s["lane"], []).append(s)
    placed = {lane: assign_gpus(items) for lane, items in lanes.items()}
    sizes = {lane: 1 + max(max(b) for _, b in items) for lane, items in placed.items()}
    total = sum(sizes.values())
    fig, ax = plt.subplots(figsize=(11, 1.6 + min(10.0, 0.12 * total + 0.5 * len(lanes))))
    cmap = plt.get_cmap("tab20")
    jobs = sorted({s["job"] for s in slots})
    color = {j: cmap(i % 20) for i, j in enumerate(jobs)}
    y, ticks = 0.0, []
    for lane in sorted(placed):
        for s, block in placed[lane]:
            width = s["end_hours"] - s["start_hours"]
            for first, n in _runs_of(block):
                ax.barh(y + first + n / 2, width, left=s["start_hours"], height=n * 0.92, color=color[s["job"]],
                        edgecolor="black", linewidth=0.4)
            if width > 0.04 * horizon_hours:
                first, n = _runs_of(block)[0]
                ax.text(s["start_hours"] + 0.005 * horizon_hours, y + first + n / 2, f"{s['job']} ({s['gpus']})",
                        va="center", fontsize=6, clip_on=True)
        ticks.append((y + sizes[lane] / 2, f"{lane}\n{sizes[lane]} GPUs"))
        y += sizes[lane] + 1
        ax.axhline(y - 0.5, color="grey", linewidth=0.5)
    ax.set_yticks([t for t, _ in ticks])
    ax.set_yticklabels([name for _, name in ticks], fontsize=8)
    ax.set_ylim(y - 0.5, 0)
    ax.set_xlim(0, horizon_hours)
    ax.set_xlabel("hours from the start of the horizon")
    handles = [plt.Rectangle((0, 0), 1, 1, color=color[j]) for j in jobs]
    ax.legend(handles, jobs, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.set_title(title)
    fig.tight_layout()
    out = atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=110))
    plt.close(fig)
    return out
