"""Costs of owning GPUs as a buyer sees them: ``catalogs/ownership.yaml``.

* Baseboard GPUs (SXM, OAM; bought in whole nodes) cost a whole server: its quoted price, or the
  baseboard's price plus :attr:`Ownership.baseboard_host_usd` (CPUs, RAM, NICs, chassis).
* PCIe and consumer cards cost their dated street price each, plus a host server per
  ``gpus_per_node`` cards (:attr:`Ownership.pcie_host_usd_per_slot` a slot).
* Resale: the fraction of the purchase price a GPU fetches after some months, shown against the
  book value left at the horizon's end (the horizon's cost is linear amortisation).

Every figure carries its date and source; nothing here is read at import time.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import yaml

from planner.catalog.prices import Price, PriceTable, parse_date


@dataclass(frozen=True)
class Quote:
    """A dated, sourced price."""

    usd: float
    date: dt.date | None
    source: str


@dataclass(frozen=True)
class ServerQuote:
    gpus: int
    usd: float | None  # a whole server
    baseboard_usd: float | None  # the GPU board alone (a server is this plus the host part)
    date: dt.date | None
    source: str


@dataclass(frozen=True)
class Ownership:
    servers: dict[str, ServerQuote]
    baseboard_host: Quote
    cards: dict[str, Quote]
    pcie_host_per_slot: Quote
    resale_points: tuple[tuple[float, float], ...]
    resale_source: str

    def card_prices(self) -> PriceTable:
        """The dated street prices per card, as a price table (kind ``purchase``)."""
        table = PriceTable()
        for gpu, q in self.cards.items():
            table.add(Price(gpu, "purchase", q.usd, q.date, f"ownership: {q.source}"))
        return table

    def resale_fraction(self, months: float) -> float:
        """Linear between the points, flat after the last."""
        pts = self.resale_points
        if months <= pts[0][0]:
            return pts[0][1]
        for (m0, f0), (m1, f1) in itertools.pairwise(pts):
            if months <= m1:
                return f0 + (f1 - f0) * (months - m0) / (m1 - m0)
        return pts[-1][1]


def _quote(d: dict[str, Any], where: str, key: str = "usd") -> Quote:
    return Quote(float(d[key]), parse_date(d.get("date"), f"{where}.date"), str(d.get("source", "")))


@lru_cache(maxsize=1)
def load_ownership() -> Ownership:
    from planner import catalog
    from planner.catalog.store import catalog_dir

    path = catalog_dir() / "ownership.yaml"
    data = yaml.safe_load(path.read_text())
    servers = {}
    for name, d in (data.get("servers") or {}).items():
        gid = catalog.get_gpu(name).id
        servers[gid] = ServerQuote(int(d["gpus"]), d.get("usd"), d.get("baseboard_usd"),
                                   parse_date(d.get("date"), f"{path}: servers.{name}.date"), str(d["source"]))
    cards = {catalog.get_gpu(name).id: _quote(d, f"{path}: cards.{name}") for name, d in (data.get("cards") or {}).items()}
    resale = data["resale"]
    return Ownership(servers, _quote(data["baseboard_host"], f"{path}: baseboard_host"), cards,
                     _quote(data["pcie_host"], f"{path}: pcie_host", "usd_per_slot"),
                     tuple((float(m), float(f)) for m, f in resale["months_fraction"]), str(resale["source"]))
