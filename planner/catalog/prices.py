"""GPU prices people already keep: SkyPilot catalog CSVs, our own price lists, the catalog.

Three kinds of price, never mixed: ``on_demand`` and ``spot`` in USD per GPU-hour, ``purchase``
in USD per card. Every price carries its date and source; a price older than ``max_age_days``
(or undated) is *stale* and flagged wherever it is used.

Accepted files (the format is recognised from the columns, or given):

* **SkyPilot catalog CSV** (``sky/catalog`` ``vms.csv``): ``InstanceType, AcceleratorName,
  AcceleratorCount, Price, SpotPrice, Region``. ``Price`` is per *instance*-hour: divided by the
  accelerator count. The file carries no date: give one, else the file's modification date.
  Names map through the GPU catalog's aliases (SkyPilot's ``A100`` is the 40 GB card,
  ``A100-80GB`` the 80 GB one); rows without a GPU, with a fractional GPU or an unknown
  accelerator are skipped and counted by reason.
* **A planner price list** (CSV or YAML list): ``gpu, kind, price_usd, date, source`` and
  optionally ``region``.
* **A catalog-shaped YAML** (``gpus:`` with ``id`` and any of the catalog's ``price_*`` fields).

Several rows for one GPU and kind (regions, providers): the cheapest is kept. A later file
replaces an earlier one's price for the same GPU and kind (the catalog comes first).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from planner import catalog
from planner.core.errors import InputError
from planner.core.textfiles import parse_yaml, read_text_bounded

PriceKind = Literal["on_demand", "spot", "purchase"]
PRICE_KINDS: tuple[str, ...] = ("on_demand", "spot", "purchase")
#: A price older than this is flagged stale (a half-year: cloud GPU prices moved by up to 45 %
#: within months in 2025, catalog-facts §8, "AWS cut P4/P5 prices up to 45 %").
DEFAULT_MAX_AGE_DAYS = 180.0
#: The largest price file read: 64 MiB (SkyPilot's whole-cloud vms.csv catalogs run to a few MB).
MAX_PRICE_FILE_BYTES = 64 << 20
SKYPILOT_COLUMNS = ("InstanceType", "AcceleratorName", "AcceleratorCount", "Price", "SpotPrice", "Region")
#: The catalog's fields for each kind of price.
CATALOG_FIELDS = {"on_demand": "price_on_demand_usd_per_hour", "spot": "price_spot_usd_per_hour",
                  "purchase": "price_purchase_usd"}


@dataclass(frozen=True)
class Price:
    gpu: str  # catalog id
    kind: str  # on_demand | spot | purchase
    usd: float  # per GPU-hour (on_demand, spot) or per card (purchase)
    date: dt.date | None
    source: str
    region: str | None = None

    def age_days(self, as_of: dt.date) -> float | None:
        return None if self.date is None else float((as_of - self.date).days)

    def is_stale(self, as_of: dt.date, max_age_days: float = DEFAULT_MAX_AGE_DAYS) -> bool:
        return is_stale_date(self.date, as_of, max_age_days)


def is_stale_date(date: dt.date | None, as_of: dt.date, max_age_days: float = DEFAULT_MAX_AGE_DAYS) -> bool:
    """The stale-price rule, the one every table and record applies: undated, or older than
    ``max_age_days`` on ``as_of``."""
    return date is None or (as_of - date).days > max_age_days


def catalog_price_date(gpu) -> dt.date | None:
    """The date of a catalog GPU's on-demand price (``price_retrieved``), or None."""
    return parse_date(gpu.price_retrieved, "price_retrieved") if gpu.price_retrieved else None


@dataclass
class PriceTable:
    """The price of each (GPU id, kind), with what was skipped on the way in."""

    prices: dict[tuple[str, str], Price] = field(default_factory=dict)
    skipped: Counter = field(default_factory=Counter)

    def get(self, gpu: str, kind: str) -> Price | None:
        return self.prices.get((gpu, kind))

    def usd(self, gpu: str, kind: str) -> float | None:
        p = self.get(gpu, kind)
        return None if p is None else p.usd

    def add(self, price: Price) -> None:
        """Keep the cheapest price per GPU and kind within one source."""
        old = self.prices.get((price.gpu, price.kind))
        if old is None or price.usd < old.usd:
            self.prices[(price.gpu, price.kind)] = price

    def overlay(self, other: PriceTable) -> PriceTable:
        """``other``'s prices replace this table's for the same GPU and kind."""
        out = PriceTable(dict(self.prices), self.skipped + other.skipped)
        out.prices.update(other.prices)
        return out

    def stale(self, as_of: dt.date, max_age_days: float = DEFAULT_MAX_AGE_DAYS) -> list[Price]:
        return [p for p in self.prices.values() if p.is_stale(as_of, max_age_days)]

    def rows(self, as_of: dt.date, max_age_days: float = DEFAULT_MAX_AGE_DAYS) -> list[dict[str, Any]]:
        return [{"gpu": p.gpu, "kind": p.kind, "usd": p.usd, "date": None if p.date is None else p.date.isoformat(),
                 "age_days": p.age_days(as_of), "stale": p.is_stale(as_of, max_age_days), "source": p.source,
                 "region": p.region} for p in sorted(self.prices.values(), key=lambda p: (p.gpu, p.kind))]


def parse_date(value: Any, where: str) -> dt.date | None:
    """``2026-10-19``, ``2026-10`` (the first of the month), a YAML date, or None."""
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    text = str(value).strip()
    for fmt in ("%Y-%m-%d", "%Y-%m"):
        try:
            return dt.datetime.strptime(text, fmt).date()
        except ValueError:
            pass
    raise InputError([f"{where}: not a date (YYYY-MM-DD): {value!r}"])


def _catalog_date(text: str | None) -> dt.date | None:
    try:
        return parse_date(text, "price_retrieved")
    except InputError:
        return None


def from_catalog() -> PriceTable:
    """The GPU catalog's own prices, dated by each entry's ``price_retrieved``."""
    table = PriceTable()
    for g in catalog.gpus():
        for kind, name in CATALOG_FIELDS.items():
            usd = getattr(g, name)
            if usd is not None:
                source = getattr(g, name.replace("_usd_per_hour", "_source").replace("_usd", "_source")) or "catalog"
                table.add(Price(g.id, kind, float(usd), _catalog_date(g.price_retrieved), f"catalog: {source}"))
    return table


def _gpu_id(name: str) -> str | None:
    try:
        return catalog.get_gpu(name).id
    except catalog.UnknownName:
        return None


def _number(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def read_skypilot_csv(text: str, *, date: dt.date | None, source: str) -> PriceTable:
    """SkyPilot ``vms.csv`` rows -> per-GPU on-demand and spot prices."""
    table = PriceTable()
    reader = csv.DictReader(io.StringIO(text))
    missing = [c for c in SKYPILOT_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise InputError([f"{source}: not a SkyPilot catalog CSV: missing column(s) {', '.join(missing)}"])
    for row in reader:
        name = (row.get("AcceleratorName") or "").strip()
        count = _number(row.get("AcceleratorCount"))
        if not name:
            table.skipped["no GPU"] += 1
            continue
        if count is None or count <= 0:
            table.skipped[f"AcceleratorCount {str(row.get('AcceleratorCount'))[:20]!r} is no GPU count"] += 1
            continue
        if count < 1 or count != int(count):
            table.skipped["fractional GPU"] += 1
            continue
        gpu = _gpu_id(name)
        if gpu is None:
            table.skipped[f"unknown accelerator {name}"] += 1
            continue
        where = f"{source}: {row.get('InstanceType', '?')}"
        for kind, column in (("on_demand", "Price"), ("spot", "SpotPrice")):
            usd = _number(row.get(column))
            if usd is not None and usd > 0:
                table.add(Price(gpu, kind, usd / count, date, where, (row.get("Region") or None)))
            elif (row.get(column) or "").strip():  # blank is "not offered"; anything else is wrong
                table.skipped[f"{column} {str(row.get(column))[:20]!r} is no price"] += 1
    return table


def _price_list(rows: Iterable[dict[str, Any]], source: str) -> PriceTable:
    table = PriceTable()
    problems = []
    for i, row in enumerate(rows):
        where = f"{source}: [{i}]"
        if not isinstance(row, dict):
            problems.append(f"{where}: a price must be a mapping")
            continue
        gpu = _gpu_id(str(row.get("gpu", "")))
        kind = str(row.get("kind", "")).strip()
        usd = _number(row.get("price_usd"))
        if gpu is None:
            problems.append(f"{where}.gpu: unknown GPU {row.get('gpu')!r}")
        if kind not in PRICE_KINDS:
            problems.append(f"{where}.kind: must be one of {', '.join(PRICE_KINDS)} (got {kind!r})")
        if usd is None or usd <= 0:
            problems.append(f"{where}.price_usd: must be a positive number (got {row.get('price_usd')!r})")
        try:
            date = parse_date(row.get("date"), f"{where}.date")
        except InputError as exc:
            problems.extend(exc.problems)
            continue
        if gpu and kind in PRICE_KINDS and usd:
            table.add(Price(gpu, kind, usd, date, str(row.get("source") or source), row.get("region") or None))
    if problems:
        raise InputError(problems)
    return table


def _catalog_yaml(rows: list[Any], source: str) -> PriceTable:
    table = PriceTable()
    problems = []
    for i, row in enumerate(rows):
        gpu = _gpu_id(str(row.get("id", ""))) if isinstance(row, dict) else None
        if gpu is None:
            problems.append(f"{source}: gpus[{i}].id: unknown GPU {row.get('id') if isinstance(row, dict) else row!r}")
            continue
        try:
            date = parse_date(row.get("price_retrieved"), f"{source}: gpus[{i}].price_retrieved")
        except InputError as exc:
            problems.extend(exc.problems)
            continue
        for kind, name in CATALOG_FIELDS.items():
            usd = _number(row.get(name))
            if usd is not None and usd > 0:
                table.add(Price(gpu, kind, usd, date, source))
    if problems:
        raise InputError(problems)
    return table


def read_prices(path: str | Path, *, fmt: str = "auto", date: Any = None) -> PriceTable:
    """One price file. ``date`` dates a SkyPilot CSV (default: the file's modification date)."""
    path = Path(path)
    text = read_text_bounded(path, limit=MAX_PRICE_FILE_BYTES)
    given = parse_date(date, "price date")
    if fmt == "auto":
        first = text.lstrip().splitlines()[0] if text.strip() else ""
        fmt = "skypilot" if "AcceleratorName" in first else ("csv" if path.suffix == ".csv" else "yaml")
    if fmt == "skypilot":
        when = given or dt.date.fromtimestamp(path.stat().st_mtime)
        table = read_skypilot_csv(text, date=when, source=str(path))
    elif fmt == "csv":
        table = _price_list(csv.DictReader(io.StringIO(text)), str(path))
    else:
        data = parse_yaml(text, str(path))
        if isinstance(data, dict) and isinstance(data.get("gpus"), list):
            table = _catalog_yaml(data["gpus"], str(path))
        elif isinstance(data, dict) and isinstance(data.get("prices"), list):
            table = _price_list(data["prices"], str(path))
        elif isinstance(data, list):
            table = _price_list(data, str(path))
        else:
            raise InputError([f"{path}: expected a price list (prices: [...]) or a catalog (gpus: [...])"])
    if given is not None:
        table.prices = {k: (p if p.date else replace(p, date=given)) for k, p in table.prices.items()}
    if not table.prices:
        why = "; ".join(f"{n} rows: {reason}" for reason, n in table.skipped.most_common(3))
        raise InputError([f"{path}: no usable GPU price in the file" + (f" ({why})" if why else "")])
    return table


def load_price_table(paths: Iterable[str | Path] = (), *, date: Any = None) -> PriceTable:
    """The catalog's prices with each file laid over them in order."""
    table = from_catalog()
    for path in paths:
        table = table.overlay(read_prices(path, date=date))
    return table


def apply_to_catalog(table: PriceTable):
    """GPU specs with the table's prices (for ``planner plan``'s cost model)."""
    out = []
    for g in catalog.gpus():
        update: dict[str, Any] = {}
        for kind, name in CATALOG_FIELDS.items():
            p = table.get(g.id, kind)
            update[name] = None if p is None else p.usd
        od = table.get(g.id, "on_demand")
        if od is not None:
            update["price_retrieved"] = None if od.date is None else od.date.isoformat()
            update["price_on_demand_source"] = od.source
        out.append(g.model_copy(update=update))
    return out
