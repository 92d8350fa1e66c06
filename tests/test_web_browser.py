"""The page in a real browser: the distribution's Chromium (``apt-get install chromium``), driven by
Playwright, against the app served by uvicorn on loopback. Clicks through the three tabs, checks
the numbers on the page against the library's for the same scenario, the URL that reopens an
answer, the keyboard and a phone-width screen, and saves screenshots (``WEB_SCREENSHOTS=DIR`` to
keep them; else the test's temporary folder)."""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("PLANNER_REQUIRE_BROWSER"):  # CI: a missing browser fails
    raise RuntimeError("PLANNER_REQUIRE_BROWSER is set and no chromium is on PATH")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")
sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def server():
    import uvicorn

    from planner.web.app import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(create_app(), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    for _ in range(200):
        if srv.started:
            break
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    out = Path(os.environ.get("WEB_SCREENSHOTS") or tmp_path_factory.mktemp("screens"))
    out.mkdir(parents=True, exist_ok=True)
    return out


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    external = []
    pg.on("request", lambda r: external.append(r.url) if not r.url.startswith(server) and not r.url.startswith(("data:", "blob:")) else None)
    pg.goto(server + "/")
    pg.wait_for_selector("body[data-ready='1']")
    yield pg
    assert external == [], external  # everything the page loads comes from the app
    context.close()


def _fill(pg, form: str, values: dict) -> None:
    for name, value in values.items():
        field = pg.locator(f"#{form} [name={name}]")
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(str(value))


def test_will_it_fit_shows_the_library_estimate(page, shots):
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve

    _fill(page, "fit-form", {"model": "llama-3.1-8b", "method": "lora", "seq_len": 4096, "micro_batch": 2,
                             "gpu": "h100-sxm-80gb", "gpus": 1})
    page.click("#fit-form button[type=submit]")
    page.wait_for_selector("#fit-total")
    want = estimate_resolved(resolve({"model": "llama-3.1-8b", "workload": {"method": "lora", "seq_len": 4096,
                                      "micro_batch": 2}, "layout": {"gpu": "h100-sxm-80gb", "gpus": 1}}))
    assert int(page.get_attribute("#fit-total", "data-bytes")) == want.total_bytes
    assert int(page.get_attribute("#fit-usable", "data-bytes")) == want.usable_bytes
    assert page.get_attribute("[data-verdict]", "data-verdict") == want.verdict
    assert page.locator("#fit-result svg rect").count() == len(want.components)
    page.screenshot(path=str(shots / "fit.png"), full_page=True)
    # The URL holds the inputs: opening it again answers the same.
    url = page.url
    assert "model=llama-3.1-8b" in url and "micro_batch=2" in url
    page.goto("about:blank")
    page.goto(url)
    page.wait_for_selector("#fit-total")
    assert int(page.get_attribute("#fit-total", "data-bytes")) == want.total_bytes


def test_does_not_fit_shows_the_documents_order(page, shots):
    _fill(page, "fit-form", {"model": "llama-3.1-70b", "method": "full", "seq_len": 4096, "micro_batch": 1,
                             "gpu": "h100-sxm-80gb", "gpus": 1})
    page.click("#fit-form button[type=submit]")
    page.wait_for_selector("text=What would make it fit", timeout=60_000)
    assert page.get_attribute("[data-verdict]", "data-verdict") == "does_not_fit"
    page.screenshot(path=str(shots / "fit-does-not-fit.png"), full_page=True)


def _plan_on_page(page, model: str, method: str, tokens: float, objective: str):
    """Plan a model on the page's plan tab (4,096 tokens, top 3): the table's rows, and the
    library's own plans of the same request."""
    from planner.search.answer import plan_raw

    page.click("#tab-plan")
    _fill(page, "plan-form", {"model": model, "method": method, "seq_len": 4096, "tokens": f"{tokens:g}",
                              "objective": objective, "top": 3})
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector("#plan-table", timeout=60_000)
    want = plan_raw({"name": "web", "model": model, "workload": {"method": method, "seq_len": 4096, "tokens": tokens},
                     "objective": objective, "top": 3}, source="request")
    rows = page.locator("#plan-table tbody tr")
    assert rows.count() == len(want.plans)
    return rows, want


def test_plan_tab_ranks_the_library_plans(page, shots):
    rows, want = _plan_on_page(page, "llama-3.1-70b", "qlora", 2e8, "cost")
    first = rows.nth(0).locator("td")
    assert first.nth(2).inner_text() == f"{want.plans[0].gpus}× {want.plans[0].gpu}"
    assert first.nth(13).inner_text().startswith(f"${want.plans[0].cost_usd:,.0f}")
    assert page.locator("[data-status]").inner_text() == want.status
    with page.expect_download() as got:  # the best plan's launch configs
        first.locator("a.bundle").click()
    assert got.value.suggested_filename == "plan-1-launch.zip"
    page.screenshot(path=str(shots / "plan.png"), full_page=True)


def test_a_moe_plan_shows_its_expert_parallelism(page):
    """The plan table's degrees carry expert parallelism where a plan has it: a MoE model
    planned on the page shows each plan's dp·tp·pp with its ep, as the library planned it."""
    rows, want = _plan_on_page(page, "olmoe-1b-7b", "full", 1e8, "time")
    assert any(p.ep > 1 for p in want.plans)  # the request's plans do use expert parallelism
    for i, p in enumerate(want.plans):
        shown = f"{p.dp}·{p.tp}·{p.pp}" + (f" cp{p.cp}" if p.cp > 1 else "") + (f" ep{p.ep}" if p.ep > 1 else "")
        assert rows.nth(i).locator("td").nth(3).inner_text() == shown


def test_procure_tab_answers_the_example(page, shots):
    page.click("#tab-procure")
    page.click("#procure-form button[type=submit]")
    page.wait_for_selector("#procure-result [data-status]", timeout=120_000)
    assert page.locator("#procure-result [data-status]").inner_text() in ("optimal", "feasible", "timeout")
    assert page.locator("#procure-result svg rect").count() >= 1  # each run's slot
    page.screenshot(path=str(shots / "procure.png"), full_page=True)


def test_keyboard_and_phone_width(page, browser, server, shots):
    page.focus("#tab-fit")
    page.keyboard.press("ArrowRight")
    assert page.get_attribute("#tab-plan", "aria-selected") == "true" and page.is_visible("#plan-form")
    phone = browser.new_context(viewport={"width": 390, "height": 844})
    pg = phone.new_page()
    pg.goto(server + "/")
    pg.wait_for_selector("body[data-ready='1']")
    pg.click("#fit-form button[type=submit]")
    pg.wait_for_selector("#fit-total")
    assert pg.evaluate("document.documentElement.scrollWidth") <= 390  # nothing wider than the screen
    pg.screenshot(path=str(shots / "phone.png"), full_page=True)
    phone.close()


def test_pasted_config_json(page):
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve

    path = ROOT / "scenarios" / "configs" / "llama-3.1-8b" / "config.json"
    _fill(page, "fit-form", {"method": "qlora", "seq_len": 2048, "micro_batch": 1, "gpu": "l4", "gpus": 1})
    page.click("#fit-form summary")
    page.fill("#fit-form [name=config]", path.read_text())
    page.click("#fit-form button[type=submit]")
    page.wait_for_selector("#fit-total")
    want = estimate_resolved(resolve({"model": str(path), "workload": {"method": "qlora", "seq_len": 2048,
                                      "micro_batch": 1}, "layout": {"gpu": "l4", "gpus": 1}}))
    assert int(page.get_attribute("#fit-total", "data-bytes")) == want.total_bytes
    assert "config" not in page.url  # the URL keeps the short inputs only


def test_dpo_on_the_page(page):
    """The Training choice reaches the estimate: a DPO pair is the library's DPO estimate."""
    from planner.memory.estimate import estimate_resolved
    from planner.scenario.resolve import resolve

    _fill(page, "fit-form", {"model": "llama-3.1-8b", "method": "full", "algorithm": "dpo", "seq_len": 2048,
                             "micro_batch": 1, "gpu": "h100-sxm-80gb", "gpus": 8})
    page.click("#fit-form button[type=submit]")
    page.wait_for_selector("#fit-total")
    want = estimate_resolved(resolve({"model": "llama-3.1-8b", "workload": {"method": "full", "algorithm": "dpo",
                                      "seq_len": 2048, "micro_batch": 1}, "layout": {"gpu": "h100-sxm-80gb", "gpus": 8}}))
    assert int(page.get_attribute("#fit-total", "data-bytes")) == want.total_bytes
    assert "reference_weights" in page.inner_text("#fit-result")


def test_grpo_on_the_page(page):
    """GRPO on the plan tab: the library's plans, each saying where its completions are generated."""
    from planner.search.answer import plan_raw

    page.click("#tab-plan")
    _fill(page, "plan-form", {"model": "qwen2.5-7b", "method": "lora", "algorithm": "grpo", "seq_len": 1536,
                              "tokens": "1e8", "objective": "cost", "top": 3})
    page.click("#plan-form button[type=submit]")
    page.wait_for_selector("#plan-table", timeout=60_000)
    want = plan_raw({"name": "web", "model": "qwen2.5-7b", "workload": {"method": "lora", "algorithm": "grpo",
                     "seq_len": 1536, "tokens": 1e8}, "objective": "cost", "top": 3}, source="request")
    rows = page.locator("#plan-table tbody tr")
    assert rows.count() == len(want.plans)
    assert rows.nth(0).locator("td").nth(2).inner_text().startswith(f"{want.plans[0].gpus}× {want.plans[0].gpu}")
    assert want.plans[0].generation in page.inner_text("#generation")
