"""Plan every scenario in files and folders: one record per plan, errors kept, never lost.

A bad file or scenario becomes a record with status ``invalid`` (or ``error`` for a bug in
planner) and its message; the other scenarios are still planned. Work is spread over processes
when there is more than a little of it. Nothing here prints: progress goes through a callback.
"""

from __future__ import annotations

import datetime as dt
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from planner.catalog.prices import DEFAULT_MAX_AGE_DAYS
from planner.core.errors import MAX_LINE_CHARS, InputError, clip, excerpt, shown
from planner.core.pools import (
    MIN_SCENARIOS_FOR_PROCESSES,
    default_workers,
    ignore_interrupts,
    stopped_on_interrupt,
)
from planner.core.textfiles import is_dir
from planner.search.answer import absolute_model_path

SCENARIO_SUFFIXES = (".yaml", ".yml")
COLUMNS = [
    "file", "scenario", "status", "rank", "gpu", "gpus", "generation_gpus", "nodes", "dp", "tp", "pp",
    "cp", "sp", "zero", "offload", "micro_batch", "grad_accum", "global_batch", "seq_len", "method", "precision",
    "checkpointing", "attention", "memory_bytes", "usable_bytes", "headroom_bytes", "time_s",
    "cost_usd", "hourly_usd", "tokens_per_s", "price_date", "price_stale", "relaxations", "error",
    "seconds", "memory_components",
]
PLANNED = ("optimal", "feasible")


@dataclass(frozen=True)
class Item:
    """One scenario to plan, or a file that could not be read (``problems``)."""

    file: str
    source: str
    name: str
    raw: dict[str, Any] | None
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class PriceOptions:
    files: tuple[str, ...] = ()
    date: str | None = None
    max_age_days: float = DEFAULT_MAX_AGE_DAYS
    as_of: str | None = None  # ISO date; default today


def collect_files(paths: Iterable[str | Path]) -> tuple[list[Path], list[str], list[str]]:
    """Scenario files under the given files and folders (folders searched recursively, sorted).

    Every path given that is not a folder is a file to read, whatever it is, so a named pipe, a
    broken link or an unreadable file becomes a record saying why. In folders, every entry named
    ``*.yaml``/``*.yml`` that is not a folder is taken the same way; links to folders are not
    followed (noted in the third list), and a folder that cannot be listed is taken as a file to
    read, so it gets a record too. The second list: paths given that do not exist."""
    files: list[Path] = []
    problems: list[str] = []
    notes: list[str] = []
    for p in map(Path, paths):
        if is_dir(p):  # a link given by name is followed
            found, more = _search(p)
            files.extend(found)
            notes.extend(more)
        elif os.path.lexists(p):
            files.append(p)
        else:
            problems.append(f"{p}: no such file or folder")
    return list(dict.fromkeys(files)), problems, notes


def _search(root: Path) -> tuple[list[Path], list[str]]:
    found: list[Path] = []
    notes: list[str] = []

    def unreadable(exc: OSError) -> None:
        found.append(Path(exc.filename) if exc.filename else root)

    for folder, dirs, names in os.walk(root, onerror=unreadable, followlinks=False):
        base = Path(folder)
        for d in list(dirs):
            if (base / d).is_symlink():
                dirs.remove(d)
                notes.append(f"{base / d}: a link to a folder, not followed")
        dirs.sort()
        found.extend(base / n for n in names if Path(n).suffix in SCENARIO_SUFFIXES)
    return sorted(found), notes


def _read(path: Path) -> Any:
    from planner.core.textfiles import load_yaml

    return load_yaml(path)


def is_portfolio(path: Path) -> bool:
    """A procurement portfolio (top-level ``jobs:``) is not a scenario file: ``planner procure``."""
    try:
        data = _read(path)
    except InputError:
        return False
    return isinstance(data, dict) and "jobs" in data


def _absolute_model_path(raw: dict[str, Any], base: Path) -> dict[str, Any]:
    try:
        return absolute_model_path(raw, base)
    except (OSError, ValueError):  # a model name no file system takes as a path: resolve says so
        return raw


def _name(raw: dict[str, Any], source: str) -> str:
    name = raw.get("name", source)
    return name if isinstance(name, str) else excerpt(name)


def read_items(files: Iterable[Path]) -> tuple[list[Item], list[str]]:
    """Every scenario of every file; a file that cannot be read is one ``invalid`` item."""
    from planner.scenario.files import scenarios_from_data

    items, skipped = [], []
    for path in files:
        try:
            if is_dir(path):  # a folder os.walk could not list
                try:
                    os.listdir(path)
                    why = "could not be searched"
                except OSError as exc:
                    why = f"cannot be searched: {exc.strerror or exc}"
                raise InputError([f"{path}: a folder that {why}"])
            data = _read(path)
            if isinstance(data, dict) and "jobs" in data:
                skipped.append(f"{path}: a portfolio (run `planner procure {path}`)")
                continue
            raws = scenarios_from_data(data, path)
        except InputError as exc:
            items.append(Item(str(path), str(path), path.stem, None, tuple(exc.problems)))
            continue
        for i, raw in enumerate(raws):
            source = str(path) if len(raws) == 1 else f"{path}[{i}]"
            items.append(Item(str(path), source, _name(raw, source), _absolute_model_path(raw, path.parent)))
    return items, skipped


# ------------------------------------------------------------------------------------------------
# One scenario -> records (runs in a worker process)


def _price_context(opts: PriceOptions):
    if not opts.files:
        return nullcontext()
    from planner import catalog
    from planner.catalog.prices import apply_to_catalog, load_price_table

    return catalog.gpus_overlaid(apply_to_catalog(load_price_table(opts.files, date=opts.date)))


def _as_of(opts: PriceOptions) -> dt.date:
    return dt.date.fromisoformat(opts.as_of) if opts.as_of else dt.date.today()


def plan_item(item: Item, top: int, opts: PriceOptions) -> list[dict[str, Any]]:
    """The records of one scenario: its best ``top`` plans, or one record saying why none."""
    from planner import catalog
    from planner.catalog.prices import catalog_price_date, is_stale_date
    from planner.search.answer import plan_raw

    t0 = time.perf_counter()
    base = {"file": item.file, "scenario": item.name}
    if item.raw is None:
        return [{**base, "status": "invalid", "error": "; ".join(shown(item.problems)), "seconds": 0.0}]
    try:
        raw = {**item.raw, "top": top}
        result = plan_raw(raw, source=item.source, base_dir=Path(item.file).parent)
    except InputError as exc:
        return [{**base, "status": "invalid", "error": "; ".join(shown(exc.problems)),
                 "seconds": time.perf_counter() - t0}]
    except Exception as exc:  # noqa: BLE001 - one broken scenario must not lose the others
        return [{**base, "status": "error", "error": clip(f"internal error: {type(exc).__name__}: {exc}", MAX_LINE_CHARS),
                 "seconds": time.perf_counter() - t0}]
    seconds = time.perf_counter() - t0
    if not result.plans and result.status == "unknown":
        return [{**base, "status": "unknown", "seconds": seconds,
                 "error": "no plan found within the time limit (not proven infeasible; raise time_limit_s)"}]
    if not result.plans:
        ex = result.explanation or {}
        rejected = sorted((ex.get("rejected") or {}).items(), key=lambda kv: -kv[1])[:3]
        why = ex.get("binding") or "; ".join(f"{k} ({v:,})" for k, v in rejected) or "no plan satisfies the constraints"
        if ex.get("suggestions"):
            why += "; would fit with " + ex["suggestions"][0]
        return [{**base, "status": result.status, "error": f"no feasible plan: {why}", "seconds": seconds}]
    records = []
    for p in result.plans[:top]:
        gpu = catalog.get_gpu(p.gpu)
        date = catalog_price_date(gpu)
        stale = None if p.hourly_usd is None else is_stale_date(date, _as_of(opts), opts.max_age_days)
        row = p.row()
        records.append({
            **base, "status": result.status,
            **{k: v for k, v in row.items() if k not in ("stack", "verdict", "relaxations")},
            "price_date": None if date is None else date.isoformat(), "price_stale": stale,
            "relaxations": row["relaxations"], "seconds": seconds,
            "memory_components": json.dumps(p.memory.components),
        })
    return records


def _error_records(item: Item, why: str) -> list[dict[str, Any]]:
    return [{"file": item.file, "scenario": item.name, "status": "error",
             "error": clip(f"internal error: {why}", MAX_LINE_CHARS), "seconds": 0.0}]


_WORKER_CONTEXT = None


def _init_worker(opts: PriceOptions) -> None:
    """Each worker enters the price overlay once, for its whole life."""
    global _WORKER_CONTEXT
    ignore_interrupts()
    _WORKER_CONTEXT = _price_context(opts)
    _WORKER_CONTEXT.__enter__()


def _run_in_worker(index: int, item: Item, top: int, opts: PriceOptions) -> tuple[int, list[dict[str, Any]]]:
    return index, plan_item(item, top, opts)


@contextmanager
def _main_not_rerun() -> Iterator[None]:
    """While worker processes start, hide the caller's ``__main__`` from them.

    A spawned worker re-runs the parent's main script (or module) before it unpickles its task,
    so a plain script calling :func:`planner.batch` at top level would start the batch again in
    every worker (Python refuses: "An attempt has been made to start a new process before the
    current process has finished its bootstrapping phase"). The workers need nothing from
    ``__main__``: their function lives in this module. Without ``__file__`` and ``__spec__`` on
    ``__main__``, multiprocessing prepares no main module for them."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if main is not None and hasattr(main, k)}
    try:
        for k in saved:
            if k == "__file__":
                delattr(main, k)
            else:
                setattr(main, k, None)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def run_items(items: list[Item], *, top: int = 1, workers: int | None = None, prices: PriceOptions = PriceOptions(),
              progress: Callable[[int, int], None] | None = None) -> list[dict[str, Any]]:
    """Plan every item; records in input order. ``progress(done, total)`` after each scenario."""
    workers = default_workers() if workers is None else max(1, workers)
    results: list[list[dict[str, Any]] | None] = [None] * len(items)
    todo = list(range(len(items)))
    if workers == 1 or len(items) < MIN_SCENARIOS_FOR_PROCESSES:
        with _price_context(prices):
            for done, i in enumerate(todo, start=1):
                results[i] = plan_item(items[i], top, prices)
                if progress:
                    progress(done, len(items))
    else:
        ctx = multiprocessing.get_context("spawn")  # no fork after OR-Tools has started threads
        done = 0
        for attempt in range(2):  # a worker that dies breaks the pool: the unfinished run once more
            todo = [i for i in todo if results[i] is None]
            if not todo:
                break
            with _main_not_rerun(), ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx,
                                                        initializer=_init_worker, initargs=(prices,)) as pool:
                futures = {pool.submit(_run_in_worker, i, items[i], top, prices): i for i in todo}
                with stopped_on_interrupt(pool):
                    for fut in as_completed(futures):
                        i = futures[fut]
                        try:
                            results[i] = fut.result()[1]
                        except BrokenProcessPool:
                            if attempt == 0:
                                continue
                            results[i] = _error_records(items[i], "a worker process died")
                        except Exception as exc:  # noqa: BLE001 - the others' results are kept
                            results[i] = _error_records(items[i], f"{type(exc).__name__}: {exc}")
                        done += 1
                        if progress:
                            progress(done, len(items))
    return [r for rec in results for r in (rec or [])]


def to_frame(records: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame.from_records(records, columns=COLUMNS)
    for col in ("rank", "gpus", "nodes", "dp", "tp", "pp", "cp", "zero", "micro_batch", "grad_accum",
                "global_batch", "seq_len", "memory_bytes", "usable_bytes", "headroom_bytes"):
        frame[col] = frame[col].astype("Int64")
    for col in ("sp", "price_stale"):
        frame[col] = frame[col].astype("boolean")
    return frame


@dataclass
class BatchRun:
    frame: pd.DataFrame
    files: list[Path]
    skipped: list[str]
    problems: list[str]  # paths that do not exist
    seconds: float

    @property
    def scenarios(self) -> pd.DataFrame:
        """One row per scenario (its best plan, or its error)."""
        f = self.frame
        return f[(f["rank"].isna()) | (f["rank"] == 1)]

    def counts(self) -> dict[str, int]:
        s = self.scenarios["status"].value_counts()
        return {k: int(v) for k, v in s.items()}

    @property
    def exit_code(self) -> int:
        """0 every scenario planned; 1 some infeasible or invalid; 2 nothing could be read."""
        read = self.scenarios
        if read.empty or (read["status"] == "invalid").all():
            return 2
        return 0 if read["status"].isin(PLANNED).all() else 1


#: The most scenario files and scenarios one batch takes, checked before any is planned: far
#: above any real sweep (at about a second a plan, 100,000 scenarios keep two cores busy for
#: half a day), and a bound on what a mistaken folder (``planner batch /``) can set going.
MAX_BATCH_FILES = 100_000
MAX_BATCH_SCENARIOS = 100_000


def run_batch(paths: Iterable[str | Path], *, top: int = 1, workers: int | None = None,
              prices: PriceOptions = PriceOptions(),
              progress: Callable[[int, int], None] | None = None) -> BatchRun:
    t0 = time.perf_counter()
    paths = list(paths)
    files, problems, notes = collect_files(paths)
    if len(files) > MAX_BATCH_FILES:
        raise InputError([(f"paths: {len(files):,} scenario files is more than the {MAX_BATCH_FILES:,} a batch "
                          "takes; give fewer folders")])
    items, skipped = read_items(files)
    if len(items) > MAX_BATCH_SCENARIOS:
        raise InputError([(f"paths: {len(items):,} scenarios is more than the {MAX_BATCH_SCENARIOS:,} a batch "
                          "takes; split them over several batches")])
    skipped += notes
    missing = [Item(str(p), str(p), Path(p).stem, None, (f"{p}: no such file or folder",))
               for p in map(Path, paths) if not os.path.lexists(p)]
    records = run_items(items + missing, top=top, workers=workers, prices=prices, progress=progress)
    return BatchRun(to_frame(records), files, skipped, problems, time.perf_counter() - t0)
