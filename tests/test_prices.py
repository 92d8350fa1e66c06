"""Price import: SkyPilot catalog CSVs, planner price lists, dates and staleness, kinds kept apart."""

from __future__ import annotations

import datetime as dt

import pytest
from conftest import FIXTURES

import planner
from planner import catalog
from planner.catalog.prices import apply_to_catalog, from_catalog, load_price_table, read_prices
from planner.core.errors import InputError

SKY = FIXTURES / "prices" / "skypilot-vms.csv"
TEAM = FIXTURES / "prices" / "team-prices.csv"


def test_skypilot_names_map_through_aliases_and_prices_are_per_gpu():
    t = read_prices(SKY, date="2026-11-20")
    # SkyPilot's A100 is the 40 GB card; A100-80GB the 80 GB one.
    # p4d.24xlarge: $32.7726 per instance-hour for 8 GPUs (the fixture's row) -> 4.096575 per GPU-hour;
    # the cheaper of two regions is kept.
    assert t.usd("a100-sxm-40gb", "on_demand") == pytest.approx(32.7726 / 8)
    assert t.get("a100-sxm-40gb", "on_demand").region == "us-east-1"
    assert t.usd("a100-sxm-80gb", "on_demand") == pytest.approx(40.9657 / 8)
    assert t.usd("a100-sxm-80gb", "spot") == pytest.approx(12.2897 / 8)
    assert t.usd("a10g", "on_demand") == pytest.approx(1.006)
    assert t.get("a10g", "purchase") is None  # a rental list has no purchase prices
    assert t.skipped == {"unknown accelerator Trainium": 1, "no GPU": 1, "fractional GPU": 1}
    assert {p.date for p in t.prices.values()} == {dt.date(2026, 11, 20)}


def test_skypilot_csv_without_a_date_takes_the_files_own(tmp_path):
    path = tmp_path / "vms.csv"
    path.write_text(SKY.read_text())
    t = read_prices(path)
    assert t.get("a10g", "on_demand").date == dt.date.fromtimestamp(path.stat().st_mtime)


def test_stale_prices_are_flagged_by_age():
    t = read_prices(TEAM)
    as_of = dt.date(2026, 11, 29)
    stale = {(p.gpu, p.kind) for p in t.stale(as_of, max_age_days=180)}
    assert stale == {("a100-sxm-80gb", "spot")}  # dated 2025-01-15: 683 days old
    assert {(p.gpu, p.kind) for p in t.stale(as_of, max_age_days=30)} == {
        ("a100-sxm-80gb", "spot"), ("h100-sxm-80gb", "purchase")}  # 2026-10-01: 59 days


def test_kinds_stay_distinct_and_later_files_win():
    base = from_catalog()
    t = load_price_table([TEAM])
    assert t.usd("h100-sxm-80gb", "on_demand") == 2.10 and t.usd("h100-sxm-80gb", "purchase") == 24000
    # The spot price the file does not give is still the catalog's (catalog: 6.57, S1).
    assert t.usd("h100-sxm-80gb", "spot") == base.usd("h100-sxm-80gb", "spot") == 6.57


def test_bad_price_rows_name_the_field(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text("gpu,kind,price_usd,date\nh100,rental,2,2026-01-01\nnope,spot,-1,yesterday\n")
    with pytest.raises(InputError) as exc:
        read_prices(path)
    lines = exc.value.problems
    assert any("[0].kind" in m for m in lines)
    assert any("[1].gpu" in m for m in lines) and any("[1].price_usd" in m for m in lines)
    assert any("[1].date" in m for m in lines)


def test_not_a_skypilot_file(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("AcceleratorName,Price\nA100,1\n")
    with pytest.raises(InputError, match="missing column"):
        read_prices(path)


def test_imported_prices_change_the_plan_cost_in_proportion():
    """The same plan at $2.10 instead of the catalog's $3.99 costs 2.10/3.99 as much."""
    scenario = {"profile": "seed", "model": "llama-3.1-8b", "top": 1,
                    "workload": {"method": "lora", "tokens": 1e8, "seq_len": 2048},
                    "layout": {"gpu": "h100", "gpus": 8}}
    before = planner.plan(scenario).plans[0]
    with catalog.gpus_overlaid(apply_to_catalog(load_price_table([TEAM]))):
        after = planner.plan(scenario).plans[0]
    assert after.time_s == pytest.approx(before.time_s)
    assert after.cost_usd == pytest.approx(before.cost_usd * 2.10 / 3.99)
    assert catalog.get_gpu("h100").price_on_demand_usd_per_hour == 3.99  # the overlay is gone


SKY_HEADER = "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\n"


@pytest.mark.parametrize("rows, reason", [
    ("p5.48xlarge,H100,0,192,2048,98.32,,us-east-1,us-east-1a\n", "AcceleratorCount '0'"),
    ("p5.48xlarge,H100,-1,192,2048,98.32,,us-east-1,us-east-1a\n", "AcceleratorCount '-1'"),
    ("p5.48xlarge,H100,abc,192,2048,98.32,,us-east-1,us-east-1a\n", "AcceleratorCount 'abc'"),
    ("p5.48xlarge,H100,8,192,2048,inf,,us-east-1,us-east-1a\n", "Price 'inf' is no price"),
    ("", "no usable GPU price"),
])
def test_a_price_file_that_yields_no_price_is_an_error_that_says_why(tmp_path, rows, reason):
    """A SkyPilot file whose GPU rows are all unusable (a zero, negative or non-numeric GPU count,
    a price of inf) or that holds no rows at all gave an empty table, and the catalog's prices
    were used without a word."""
    path = tmp_path / "vms.csv"
    path.write_text(SKY_HEADER + rows)
    with pytest.raises(InputError) as exc:
        read_prices(path)
    assert len(exc.value.problems) == 1 and "no usable GPU price" in exc.value.problems[0]
    assert reason in exc.value.problems[0]


def test_unusable_rows_beside_good_ones_are_counted_not_fatal(tmp_path):
    """A real SkyPilot catalog holds CPU instances and rows without a spot price: those are passed
    over and counted; the good rows price the GPUs."""
    path = tmp_path / "vms.csv"
    path.write_text(SKY_HEADER + "p5.48xlarge,H100,8,192,2048,98.32,,us-east-1,us-east-1a\n"
                    "m5.large,,,2,8,0.096,,us-east-1,us-east-1a\n"
                    "p5.bad,H100,abc,192,2048,98.32,,us-east-1,us-east-1a\n")
    table = read_prices(path)
    assert table.usd("h100-sxm-80gb", "on_demand") == pytest.approx(98.32 / 8)
    assert table.skipped["no GPU"] == 1 and sum(table.skipped.values()) == 2


def test_a_binary_price_file_is_one_line_exit_2(tmp_path):
    """``batch --prices BINARY`` was exit 3 (UnicodeDecodeError)."""
    from typer.testing import CliRunner

    from planner.cli.main import app

    prices = tmp_path / "prices.csv"
    prices.write_bytes(bytes(range(200, 256)) * 4)
    with pytest.raises(InputError, match="not a UTF-8 text file"):
        read_prices(prices)
    scenario = tmp_path / "s.yaml"
    scenario.write_text("model: llama-3.1-8b\nworkload: {method: lora}\nlayout: {gpu: h100}\n")
    out = CliRunner().invoke(app, ["batch", str(scenario), "--prices", str(prices), "-o", str(tmp_path / "r.csv")])
    assert out.exit_code == 2 and "not a UTF-8 text file" in out.output


def test_one_stale_rule_for_every_table():
    """Undated, or more than the allowed days old on the day asked: the rule the plan table, the
    batch records, the procurement report and price tables all apply (planner.catalog.prices)."""
    import datetime as dt

    from planner.catalog.prices import DEFAULT_MAX_AGE_DAYS, Price, is_stale_date

    today = dt.date(2026, 12, 4)
    edge = today - dt.timedelta(days=int(DEFAULT_MAX_AGE_DAYS))
    assert not is_stale_date(edge, today) and is_stale_date(edge - dt.timedelta(days=1), today)
    assert is_stale_date(None, today)
    assert not is_stale_date(today - dt.timedelta(days=10), today, 10.0)
    price = Price("h100-sxm-80gb", "on_demand", 2.0, edge - dt.timedelta(days=1), "quote")
    assert price.is_stale(today) == is_stale_date(price.date, today)
