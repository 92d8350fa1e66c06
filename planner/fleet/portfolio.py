"""Portfolio files for ``planner procure``: jobs with windows, the horizon, prices, costs of owning.

A portfolio is a YAML mapping (schema: :class:`Portfolio`, ``planner schema --portfolio``)::

    name: team-h1
    start_date: 2027-01-04          # optional: lets windows be dates
    horizon_days: 120               # or horizon_hours
    lifetime_months: 36             # purchases amortised linearly over this
    defaults: {profile: seed}       # merged under every job's scenario
    jobs:
      - name: sft-70b
        count: 3                    # three runs of this job
        scenario: {model: llama-3.1-70b, workload: {method: qlora, tokens: 2e8}}
        earliest_start_hours: 0     # or earliest_start_date
        deadline_date: 2027-03-01   # or deadline_hours (default: the horizon's end)

Windows are in hours from the start of the horizon, or dates (which need ``start_date``).
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator

from planner.core.errors import InputError, format_validation_error
from planner.core.values import Count, PosFloat, StrictModel, parse_number

#: Hours in an average month (365.25 · 24 / 12), for lifetimes given in months.
HOURS_PER_MONTH = 730.5
DEFAULT_LIFETIME_MONTHS = 36.0
#: Electricity while a GPU computes, per GPU, including its share of the server and cooling:
#: 1.0 kW (DGX H100: 10.2 kW max for 8 GPUs ≈ 1.3 kW each; the GPU alone 700 W [recalled: NVIDIA
#: DGX H100 datasheet]) × PUE 1.4 (Uptime Institute survey 2023: fleet average 1.58, new sites
#: 1.2–1.4 [recalled]) × $0.10/kWh (US industrial average ≈ $0.08–0.09/kWh, EIA 2024 [recalled]).
#: A guess for data-centre cards; set ``power_usd_per_gpu_hour`` per type for others.
DEFAULT_POWER_USD_PER_GPU_HOUR = 1.0 * 1.4 * 0.10
#: Hosting an owned GPU whether busy or not: colocation at ≈ $150/kW-month (US wholesale
#: colocation rates 2024, CBRE data-centre reports [recalled]) for 1.0 kW per GPU, over 730.5 h.
DEFAULT_HOSTING_USD_PER_GPU_HOUR = 150.0 * 1.0 / HOURS_PER_MONTH

PerGpu = float | dict[str, float]

#: Bounds on a portfolio's size, checked before any work (the model's arrays grow with them):
#: a horizon of ten years (beyond any GPU's useful life; lifetimes default to 36 months), at
#: most 100,000 time slots over it (an hour's slots over ten years: 87,660), at most 1,000 runs
#: in all (the 80-job benchmark has 160), and purchase units of at most 100,000 GPUs.
MAX_HORIZON_HOURS = 10 * 365.25 * 24
MAX_TIME_SLOTS = 100_000
MAX_RUNS = 1_000
MAX_PURCHASE_UNIT = 100_000


def _date(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            raise ValueError(f"not a date (YYYY-MM-DD): {value!r}") from None
    return value


Date = Annotated[dt.date, BeforeValidator(_date)]
Hours = Annotated[float, BeforeValidator(parse_number), Field(ge=0, allow_inf_nan=False)]


class PriceFile(StrictModel):
    """A price file (SkyPilot catalog CSV, planner price list, or catalog-shaped YAML)."""

    path: str
    format: Literal["auto", "skypilot", "csv", "yaml"] = "auto"
    date: Date | None = None  # dates a SkyPilot CSV (default: the file's own date)


class Job(StrictModel):
    name: str
    scenario: dict[str, Any] | str  # a mapping, or a scenario file holding one scenario
    count: Count = 1
    earliest_start_hours: Hours | None = None
    earliest_start_date: Date | None = None
    deadline_hours: Hours | None = None
    deadline_date: Date | None = None

    @model_validator(mode="after")
    def _one_of_each(self) -> Job:
        if self.earliest_start_hours is not None and self.earliest_start_date is not None:
            raise ValueError("give earliest_start_hours or earliest_start_date, not both")
        if self.deadline_hours is not None and self.deadline_date is not None:
            raise ValueError("give deadline_hours or deadline_date, not both")
        return self


class Portfolio(StrictModel):
    name: str = "portfolio"
    start_date: Date | None = None
    horizon_hours: PosFloat | None = None
    horizon_days: PosFloat | None = None
    lifetime_months: PosFloat = DEFAULT_LIFETIME_MONTHS
    gpu_types: list[str] | None = None  # None: every type in the catalog
    buy: bool = True
    rent: list[Literal["on_demand", "spot"]] = Field(default_factory=lambda: ["on_demand"])
    prices: list[PriceFile] = Field(default_factory=list)
    max_price_age_days: PosFloat = 180.0
    power_usd_per_gpu_hour: PerGpu = DEFAULT_POWER_USD_PER_GPU_HOUR
    hosting_usd_per_gpu_hour: PerGpu = DEFAULT_HOSTING_USD_PER_GPU_HOUR
    purchase_unit_gpus: dict[str, Annotated[int, BeforeValidator(parse_number),
                                            Field(ge=1, le=MAX_PURCHASE_UNIT)]] = Field(default_factory=dict)
    max_gpus_per_job: Annotated[int, BeforeValidator(parse_number), Field(ge=1, le=100_000)] = 1024
    time_limit_s: PosFloat = 30.0
    time_unit_hours: PosFloat = 1.0
    defaults: dict[str, Any] = Field(default_factory=dict)
    jobs: Annotated[list[Job], Field(min_length=1)]

    @field_validator("power_usd_per_gpu_hour", "hosting_usd_per_gpu_hour")
    @classmethod
    def _non_negative(cls, value: PerGpu) -> PerGpu:
        items = value.items() if isinstance(value, dict) else [(None, value)]
        bad = [f"{k}: {v:g}" if k is not None else f"{v:g}" for k, v in items
               if not (float(v) >= 0 and math.isfinite(float(v)))]
        if bad:
            raise ValueError(f"must be a finite number ≥ 0 USD per GPU-hour (got {', '.join(bad)})")
        return value

    @model_validator(mode="after")
    def _horizon(self) -> Portfolio:
        if (self.horizon_hours is None) == (self.horizon_days is None):
            raise ValueError("give horizon_hours or horizon_days (one of them)")
        field = "horizon_hours" if self.horizon_hours is not None else "horizon_days"
        if self.horizon_h > MAX_HORIZON_HOURS:
            raise ValueError(f"{field}: at most {MAX_HORIZON_HOURS / 24:,.0f} days (ten years)")
        if self.time_unit_hours > self.horizon_h:
            raise ValueError(f"time_unit_hours: {self.time_unit_hours:g} h is longer than the horizon "
                             f"({self.horizon_h:g} h): at most the horizon, one slot")
        if self.horizon_h / self.time_unit_hours > MAX_TIME_SLOTS:
            raise ValueError(f"time_unit_hours: {self.time_unit_hours:g} cuts the horizon into more than "
                             f"{MAX_TIME_SLOTS:,} slots (at least {self.horizon_h / MAX_TIME_SLOTS:.3g} h)")
        runs = sum(j.count for j in self.jobs)
        if runs > MAX_RUNS:
            raise ValueError(f"jobs: {runs:,} runs in all (counts summed); at most {MAX_RUNS:,}")
        return self

    @property
    def horizon_h(self) -> float:
        return self.horizon_hours if self.horizon_hours is not None else self.horizon_days * 24.0


@dataclass(frozen=True)
class JobRun:
    """One job of the portfolio, resolved: its scenario mapping and its window in hours."""

    name: str
    raw: dict[str, Any]
    source: str
    base_dir: Path
    count: int
    release_hours: float
    deadline_hours: float


def _hours(p: Portfolio, hours: float | None, date: dt.date | None, default: float, where: str,
           problems: list[str]) -> float:
    if date is not None:
        if p.start_date is None:
            problems.append(f"{where}: a date needs the portfolio's start_date")
            return default
        return (date - p.start_date).days * 24.0
    return default if hours is None else float(hours)


def _date_problems(data: dict[str, Any], path: Path) -> list[str]:
    """Job dates before the portfolio's ``start_date`` (read from the raw mapping, so that they are
    reported with the schema's own problems)."""
    def date(v: Any) -> dt.date | None:
        if isinstance(v, dt.datetime):
            return v.date()
        if isinstance(v, dt.date):
            return v
        try:
            return dt.date.fromisoformat(str(v).strip()) if v is not None else None
        except ValueError:
            return None

    start = date(data.get("start_date"))
    jobs = data.get("jobs")
    if start is None or not isinstance(jobs, list):
        return []
    out = []
    for i, job in enumerate(jobs):
        if not isinstance(job, dict):
            continue
        for key in ("deadline_date", "earliest_start_date"):
            d = date(job.get(key))
            if d is not None and d < start:
                out.append(f"{path}: jobs[{i}].{key}: {d} is before the portfolio's start_date {start}")
    return out


def _gpu_name_problems(p: Portfolio, path: Path) -> list[str]:
    from planner import catalog

    out = []
    fields = {"gpu_types": p.gpu_types or [], "purchase_unit_gpus": list(p.purchase_unit_gpus),
              "power_usd_per_gpu_hour": list(p.power_usd_per_gpu_hour) if isinstance(p.power_usd_per_gpu_hour, dict) else [],
              "hosting_usd_per_gpu_hour": list(p.hosting_usd_per_gpu_hour) if isinstance(p.hosting_usd_per_gpu_hour, dict) else []}
    for name, gpus in fields.items():
        for g in gpus:
            try:
                catalog.get_gpu(g)
            except catalog.UnknownName as exc:
                out.append(f"{path}: {name}.{g}: {exc}")
    return out


def load_portfolio(path: str | Path, data: Any = None) -> tuple[Portfolio, list[JobRun]]:
    """Read and check a portfolio file (or ``data``, its mapping, named ``path`` in messages);
    every problem at once, one line each."""
    from planner.core.textfiles import load_yaml
    from planner.scenario.files import deep_merge, read_scenario_file
    from planner.search.answer import absolute_model_path

    path = Path(path)
    if data is None:
        data = load_yaml(path)
    if not isinstance(data, dict):
        raise InputError([f"{path}: a portfolio is a mapping with jobs: [...]"])
    early = _date_problems(data, path)
    try:
        p = Portfolio.model_validate(data)
    except ValidationError as exc:
        raise InputError([f"{path}: {line}" for line in format_validation_error(exc, Portfolio)] + early) from None
    problems: list[str] = list(early) + _gpu_name_problems(p, path)
    runs = []
    horizon = p.horizon_h
    for i, job in enumerate(p.jobs):
        where = f"{path}: jobs[{i}]"
        if isinstance(job.scenario, str):
            file = (path.parent / job.scenario)
            try:
                raws = read_scenario_file(file)
            except InputError as exc:
                problems.extend(f"{where}.scenario: {m}" for m in exc.problems)
                continue
            if len(raws) != 1:
                problems.append(f"{where}.scenario: {file} holds {len(raws)} scenarios; give one")
                continue
            raw, base = raws[0], file.parent
        else:
            raw, base = job.scenario, path.parent
        raw = absolute_model_path(deep_merge(deep_merge(p.defaults, raw), {"name": job.name}), base)
        release = _hours(p, job.earliest_start_hours, job.earliest_start_date, 0.0, f"{where}.earliest_start",
                         problems)
        deadline = _hours(p, job.deadline_hours, job.deadline_date, horizon, f"{where}.deadline", problems)
        if deadline > horizon + 1e-9:
            problems.append(f"{where}.deadline: {deadline:g} h is past the horizon ({horizon:g} h)")
        if release >= deadline and not any(m.startswith(f"{where}.") and "start_date" in m for m in early):
            problems.append(f"{where}: earliest start {release:g} h is not before the deadline {deadline:g} h")
        runs.append(JobRun(job.name, raw, f"{where} ({job.name})", base, job.count, release, min(deadline, horizon)))
    names = [j.name for j in p.jobs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        problems.append(f"{path}: jobs: duplicate names {', '.join(dupes)}")
    if problems:
        raise InputError(problems)
    return p, runs


def per_gpu(value: PerGpu, gpu_id: str, default: float) -> float:
    """A cost given once for every type, or per type (catalog names; others get ``default``)."""
    if isinstance(value, dict):
        from planner import catalog

        for name, v in value.items():
            if catalog.get_gpu(name).id == gpu_id:
                return float(v)
        return default
    return float(value)
