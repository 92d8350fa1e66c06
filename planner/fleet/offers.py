"""What each GPU type costs to own or rent for a portfolio (:class:`Offer`): the purchase unit (a
whole server for baseboard GPUs, else a card, with a host for every ``gpus_per_node`` cards), its
dated price and how it was made, the rental prices, power and hosting; and the price table they
are read from (the catalog's prices, the dated costs of owning, then the portfolio's price files).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from planner import catalog
from planner.catalog.prices import Price, PriceTable, load_price_table, read_prices
from planner.fleet.ownership import Ownership, load_ownership
from planner.fleet.portfolio import (
    DEFAULT_HOSTING_USD_PER_GPU_HOUR,
    DEFAULT_POWER_USD_PER_GPU_HOUR,
    Portfolio,
    per_gpu,
)


@dataclass(frozen=True)
class Offer:
    """What one GPU type costs to own or rent."""

    gpu: str
    unit_gpus: int  # GPUs per purchase unit: a whole server (baseboard) or one card
    purchase: Price | None  # per card (None: cannot be bought)
    unit_usd: float | None  # one purchase unit
    unit_note: str  # how unit_usd was made, with dates and sources
    unit_date: dt.date | None
    units_per_host: int  # 0: the unit is a whole server
    host_usd: float
    host_note: str
    rent: dict[str, Price]
    power_usd_per_gpu_hour: float
    hosting_usd_per_gpu_hour: float

    def unit_owned_usd(self, horizon_hours: float, lifetime_hours: float) -> float:
        """Owning one unit over the horizon: amortised price plus hosting of its GPUs."""
        return (self.unit_usd * min(1.0, horizon_hours / lifetime_hours)
                + self.hosting_usd_per_gpu_hour * self.unit_gpus * horizon_hours)

    def host_owned_usd(self, horizon_hours: float, lifetime_hours: float) -> float:
        return self.host_usd * min(1.0, horizon_hours / lifetime_hours)


def purchase_unit(gpu_id: str, p: Portfolio) -> int:
    """GPUs per purchase: the portfolio's figure, else a whole node for cards that come on an
    NVLink baseboard (SXM/OAM: HGX and MI300X platforms ship 8 at a time), else one card."""
    for name, n in p.purchase_unit_gpus.items():
        if catalog.get_gpu(name).id == gpu_id:
            return n
    g = catalog.get_gpu(gpu_id)
    return g.gpus_per_node if (g.whole_node_only or g.nvlink_domain > 1) else 1


def _unit_price(gid: str, unit: int, card: Price, from_user: bool, own: Ownership) -> tuple[float, str, dt.date | None]:
    """A purchase unit's price: a whole server for baseboard GPUs, else one card."""
    if unit == 1:
        return card.usd, f"card: {card.source}", card.date
    host = own.baseboard_host
    server = own.servers.get(gid)
    if server is not None and server.gpus == unit and not from_user:
        if server.usd is not None:
            return float(server.usd), f"whole server ({server.date}): {server.source}", server.date
        if server.baseboard_usd is not None:
            return (float(server.baseboard_usd) + host.usd,
                    f"baseboard ({server.date}): {server.source}; + host ${host.usd:,.0f} ({host.date}): {host.source}",
                    server.date)
    return (unit * card.usd + host.usd,
            f"{unit} × card ({card.date}): {card.source}; + host ${host.usd:,.0f} ({host.date}): {host.source}",
            card.date)


def build_offers(p: Portfolio, table: PriceTable, user_purchase: frozenset[str] = frozenset(),
                 own: Ownership | None = None) -> dict[str, Offer]:
    own = own or load_ownership()
    ids = [catalog.get_gpu(n).id for n in p.gpu_types] if p.gpu_types else [g.id for g in catalog.gpus()]
    offers = {}
    slot = own.pcie_host_per_slot
    for gid in ids:
        rent = {k: table.get(gid, k) for k in p.rent if table.get(gid, k) is not None}
        card = table.get(gid, "purchase") if p.buy else None
        unit = purchase_unit(gid, p)
        unit_usd = note = date = None
        per_host, host_usd, host_note = 0, 0.0, ""
        if card is not None:
            unit_usd, note, date = _unit_price(gid, unit, card, gid in user_purchase, own)
            if unit == 1:
                per_host = catalog.get_gpu(gid).gpus_per_node
                host_usd = per_host * slot.usd
                host_note = f"host for {per_host} cards at ${slot.usd:,.2f} a slot ({slot.date}): {slot.source}"
        offers[gid] = Offer(gid, unit, card, unit_usd, note or "", date, per_host, host_usd, host_note, rent,
                            per_gpu(p.power_usd_per_gpu_hour, gid, DEFAULT_POWER_USD_PER_GPU_HOUR),
                            per_gpu(p.hosting_usd_per_gpu_hour, gid, DEFAULT_HOSTING_USD_PER_GPU_HOUR))
    return offers


def priced_types(p: Portfolio, table: PriceTable) -> list[str]:
    """The portfolio's GPU types that can be bought or rented at some price (others cannot be used)."""
    ids = [catalog.get_gpu(n).id for n in p.gpu_types] if p.gpu_types else [g.id for g in catalog.gpus()]
    kinds = list(p.rent) + (["purchase"] if p.buy else [])
    return [g for g in ids if any(table.get(g, k) is not None for k in kinds)]


def load_tables(path: str | Path, p: Portfolio) -> tuple[PriceTable, frozenset[str]]:
    """The catalog's prices, the dated costs of owning, then the portfolio's price files; and the
    GPU types whose purchase price a price file gives."""
    base = Path(path).parent
    table = load_price_table().overlay(load_ownership().card_prices())
    user: set[str] = set()
    for f in p.prices:
        extra = read_prices(base / f.path, fmt=f.format, date=f.date)
        user |= {g for (g, k) in extra.prices if k == "purchase"}
        table = table.overlay(extra)
    return table, frozenset(user)
