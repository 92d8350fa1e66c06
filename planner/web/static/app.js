// planner's page: three forms over the HTTP API (/api/estimate, /api/plan, /api/procure).
// The URL's hash holds the open tab and its inputs, so an answer can be shared and reopened.
"use strict";

const COLORS = ["#2957c8", "#e07b39", "#3a9a5b", "#b54a8f", "#8c6d31", "#5a8fd6", "#c4a000", "#7f7f7f", "#17becf", "#d62728"];
const GB = 1e9;
const $ = (sel, root = document) => root.querySelector(sel);
const el = (tag, attrs = {}, ...kids) => {
  const node = document.createElementNS(attrs.svg ? "http://www.w3.org/2000/svg" : "http://www.w3.org/1999/xhtml", tag);
  for (const [k, v] of Object.entries(attrs)) if (k !== "svg" && v !== undefined && v !== null) node.setAttribute(k, v);
  for (const kid of kids.flat()) node.append(kid instanceof Node ? kid : document.createTextNode(String(kid)));
  return node;
};
const gb = (bytes) => (bytes / GB).toFixed(1) + " GB";
const hours = (s) => (s == null ? "—" : (s / 3600).toFixed(1) + " h");
const usd = (x) => (x == null ? "—" : "$" + x.toLocaleString(undefined, { maximumFractionDigits: 0 }));

// ------------------------------------------------------------------------------------------
// Requests

async function api(path, body, contentType = "application/json") {
  const res = await fetch(path, { method: body === undefined ? "GET" : "POST",
    headers: body === undefined ? {} : { "content-type": contentType },
    body: body === undefined ? undefined : (typeof body === "string" ? body : JSON.stringify(body)) });
  const data = await res.json().catch(() => ({ problems: [`HTTP ${res.status}`] }));
  if (!res.ok) throw new Error((data.problems || [JSON.stringify(data)]).join("\n"));
  return data;
}

async function busy(section, work) {
  const status = $(".status", section);
  const button = $("button[type=submit]", section);
  status.className = "status";
  status.textContent = "Working…";
  button.disabled = true;
  const started = performance.now();
  const tick = setInterval(() => { status.textContent = `Working… ${((performance.now() - started) / 1000).toFixed(0)} s`; }, 1000);
  try {
    await work();
    status.textContent = `Answered in ${((performance.now() - started) / 1000).toFixed(1)} s.`;
  } catch (err) {
    status.className = "status error";
    status.textContent = err.message;
  } finally {
    clearInterval(tick);
    button.disabled = false;
  }
}

// ------------------------------------------------------------------------------------------
// Forms <-> scenarios <-> the URL

function values(form) {
  const out = {};
  for (const [k, v] of new FormData(form).entries()) if (typeof v === "string" && v.trim() !== "") out[k] = v.trim();
  return out;
}

function num(v) { return v === undefined ? undefined : Number(v); }

function fitScenario(v) {
  const layout = { gpu: v.gpu, gpus: num(v.gpus) };
  if (v.checkpointing) layout.checkpointing = v.checkpointing;
  return { name: "web", model: v.model, workload: { method: v.method, algorithm: v.algorithm || "sft", seq_len: num(v.seq_len), micro_batch: num(v.micro_batch) }, layout };
}

function planScenario(v) {
  const sc = { name: "web", model: v.model, workload: { method: v.method, algorithm: v.algorithm || "sft", seq_len: num(v.seq_len) }, objective: v.objective, top: num(v.top) || 5 };
  if (v.tokens) sc.workload.tokens = Number(v.tokens);
  const search = {};
  if (v.gpu_types) search.gpu_types = v.gpu_types.split(",").map((s) => s.trim()).filter(Boolean);
  if (v.max_gpus) search.max_gpus = num(v.max_gpus);
  if (Object.keys(search).length) sc.search = search;
  const cons = {};
  if (v.budget_usd) cons.budget_usd = num(v.budget_usd);
  if (v.deadline_hours) cons.deadline_hours = num(v.deadline_hours);
  if (v.fleet) cons.fleet = Object.fromEntries(v.fleet.split(",").map((p) => p.split("=").map((s) => s.trim())).filter((p) => p.length === 2));
  if (Object.keys(cons).length) sc.constraints = cons;
  return sc;
}

function saveHash(tab, v) {
  const { config, ...short } = v;  // a pasted config.json is too long for a URL
  const params = new URLSearchParams(short);
  history.replaceState(null, "", `#${tab}${params.toString() ? "&" + params : ""}`);
}

function readHash() {
  const text = location.hash.slice(1);
  if (!text) return null;
  const [tab, ...rest] = text.split("&");
  return { tab, values: Object.fromEntries(new URLSearchParams(rest.join("&"))) };
}

function fill(form, v) {
  for (const [k, val] of Object.entries(v)) if (form.elements[k] && form.elements[k].type !== "file") form.elements[k].value = val;
}

function downloads(section, scenario, result, name) {
  const box = el("div", { class: "downloads" });
  const yamlLink = el("a", { href: "#", role: "button" }, "Download scenario (YAML)");
  yamlLink.addEventListener("click", async (e) => {
    e.preventDefault();
    const res = await fetch("/api/scenario.yaml", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(scenario) });
    save(await res.text(), `${name}.yaml`, "application/yaml");
  });
  const jsonLink = el("a", { href: "#", role: "button" }, "Download answer (JSON)");
  jsonLink.addEventListener("click", (e) => { e.preventDefault(); save(JSON.stringify(result, null, 2), `${name}.json`, "application/json"); });
  box.append(yamlLink, jsonLink);
  return box;
}

function save(content, filename, type) {
  const url = URL.createObjectURL(content instanceof Blob ? content : new Blob([content], { type }));
  const a = el("a", { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  URL.revokeObjectURL(url);
}

// ------------------------------------------------------------------------------------------
// Pictures

function memoryBar(components, usable, capacity) {
  const total = Object.values(components).reduce((a, b) => a + b, 0);
  const scale = Math.max(total, capacity) * 1.02;
  const width = 640, height = 46, barH = 24;
  const svg = el("svg", { svg: true, viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img",
    "aria-label": `memory per GPU: ${gb(total)} of ${gb(usable)} usable` });
  let x = 0;
  Object.entries(components).forEach(([name, bytes], i) => {
    const w = (bytes / scale) * width;
    svg.append(el("rect", { svg: true, x, y: 4, width: Math.max(w, 0), height: barH, fill: COLORS[i % COLORS.length] },
      el("title", { svg: true }, `${name}: ${gb(bytes)}`)));
    x += w;
  });
  const ux = (usable / scale) * width;
  svg.append(el("line", { svg: true, x1: ux, x2: ux, y1: 0, y2: barH + 8, stroke: "#b3261e", "stroke-width": 2 }));
  svg.append(el("text", { svg: true, x: Math.min(ux + 4, width - 90), y: barH + 18 }, `usable ${gb(usable)}`));
  const legend = el("div", { class: "legend" }, Object.entries(components).map(([name, bytes], i) =>
    el("span", {}, el("i", { style: `background:${COLORS[i % COLORS.length]}` }), `${name} ${gb(bytes)}`)));
  return el("div", {}, svg, legend);
}

function paretoChart(plans) {
  const pts = plans.filter((p) => p.time_s != null && p.cost_usd != null);
  if (pts.length < 2) return el("div");
  const W = 640, H = 220, m = 44;
  const xs = pts.map((p) => p.time_s / 3600), ys = pts.map((p) => p.cost_usd);
  const [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  const sx = (x) => m + ((x - x0) / ((x1 - x0) || 1)) * (W - 2 * m);
  const sy = (y) => H - m - ((y - y0) / ((y1 - y0) || 1)) * (H - 2 * m);
  const frontier = pts.filter((p) => !pts.some((q) => q !== p && q.time_s <= p.time_s && q.cost_usd <= p.cost_usd && (q.time_s < p.time_s || q.cost_usd < p.cost_usd)));
  const svg = el("svg", { svg: true, viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": "time against cost of the plans" });
  svg.append(el("line", { svg: true, x1: m, x2: W - m, y1: H - m, y2: H - m, stroke: "#999" }), el("line", { svg: true, x1: m, x2: m, y1: m, y2: H - m, stroke: "#999" }));
  svg.append(el("text", { svg: true, x: W / 2, y: H - 10 }, "time (h)"), el("text", { svg: true, x: 4, y: m - 10 }, "cost ($)"));
  svg.append(el("text", { svg: true, x: m, y: H - m + 14 }, x0.toFixed(1)), el("text", { svg: true, x: W - m - 20, y: H - m + 14 }, x1.toFixed(1)));
  svg.append(el("text", { svg: true, x: 2, y: H - m }, usd(y0)), el("text", { svg: true, x: 2, y: m + 4 }, usd(y1)));
  const line = frontier.slice().sort((a, b) => a.time_s - b.time_s).map((p) => `${sx(p.time_s / 3600)},${sy(p.cost_usd)}`).join(" ");
  svg.append(el("polyline", { svg: true, points: line, fill: "none", stroke: "#2957c8", "stroke-dasharray": "4 3" }));
  for (const p of pts) {
    svg.append(el("circle", { svg: true, cx: sx(p.time_s / 3600), cy: sy(p.cost_usd), r: frontier.includes(p) ? 5 : 3.5,
      fill: frontier.includes(p) ? "#2957c8" : "#9aa6bd" }, el("title", { svg: true }, `#${p.rank} ${p.gpus}× ${p.gpu}: ${hours(p.time_s)}, ${usd(p.cost_usd)}`)));
  }
  return el("div", {}, el("h3", {}, "Time against cost (the frontier dashed)"), svg);
}

function timeline(schedule, horizon) {
  const lanes = [...new Set(schedule.map((r) => `${r.gpu} (${r.mode})`))];
  const W = 640, lh = 22, m = 150, H = lanes.length * lh + 30;
  const svg = el("svg", { svg: true, viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "aria-label": "each run's slot" });
  lanes.forEach((lane, i) => svg.append(el("text", { svg: true, x: 2, y: i * lh + 15 }, lane)));
  const sx = (h) => m + (h / horizon) * (W - m - 8);
  const jobs = [...new Set(schedule.map((r) => r.job))];
  for (const r of schedule) {
    const i = lanes.indexOf(`${r.gpu} (${r.mode})`);
    svg.append(el("rect", { svg: true, x: sx(r.start_hours), y: i * lh + 3, width: Math.max(sx(r.end_hours) - sx(r.start_hours), 2), height: lh - 6,
      fill: COLORS[jobs.indexOf(r.job) % COLORS.length], opacity: 0.85 }, el("title", { svg: true }, `${r.job} #${r.run}: ${r.gpus}× ${r.gpu}, ${r.hours.toFixed(0)} h`)));
  }
  svg.append(el("text", { svg: true, x: m, y: H - 4 }, "0 h"), el("text", { svg: true, x: W - 60, y: H - 4 }, `${horizon.toFixed(0)} h`));
  return el("div", {}, el("h3", {}, "Each run's slot"), svg,
    el("div", { class: "legend" }, jobs.map((j, i) => el("span", {}, el("i", { style: `background:${COLORS[i % COLORS.length]}` }), j))));
}

function table(columns, rows) {
  return el("table", {}, el("thead", {}, el("tr", {}, columns.map(([label]) => el("th", { scope: "col" }, label)))),
    el("tbody", {}, rows.map((r) => el("tr", {}, columns.map(([, get]) => el("td", {}, get(r)))))));
}

// ------------------------------------------------------------------------------------------
// The three answers

function renderEstimate(out, est) {
  out.replaceChildren(
    el("p", {}, el("span", { class: `verdict ${est.verdict}`, "data-verdict": est.verdict }, est.verdict.replaceAll("_", " ")), " ",
      el("span", { id: "fit-total", "data-bytes": est.total_bytes }, gb(est.total_bytes)), " per GPU of ",
      el("span", { id: "fit-usable", "data-bytes": est.usable_bytes }, gb(est.usable_bytes)), ` usable (${est.gpus}× ${est.gpu}, capacity ${gb(est.capacity_bytes)}; ${est.fit_rule})`),
    memoryBar(est.components, est.usable_bytes, est.capacity_bytes),
    table([["component", (r) => r[0]], ["per GPU", (r) => gb(r[1])]], Object.entries(est.components)),
    el("p", { class: "warn" }, (est.warnings || []).join(" · ")));
}

function renderLadder(out, result) {
  const ex = result.explanation || {};
  const parts = [el("h3", {}, "What would make it fit")];
  if (ex.binding) parts.push(el("p", {}, ex.binding));
  if (ex.steps) parts.push(table([["step, in the documents' order", (s) => s.step], ["memory per GPU", (s) => gb(s.memory_bytes)],
    ["usable", (s) => gb(s.usable_bytes)], ["fits", (s) => (s.fits ? "yes" : "no")], ["allowed", (s) => (s.allowed ? "yes" : "not asked")]], ex.steps));
  if (result.plans && result.plans.length) {
    const p = result.plans[0];
    parts.push(el("p", {}, `On ${p.gpus}× ${p.gpu}, this fits: micro-batch ${p.micro_batch} × ${p.grad_accum}, checkpointing ${p.checkpointing}, ZeRO ${p.zero}, offload ${p.offload}` +
      (p.relaxations.length ? `; ${p.relaxations.join("; ")}` : "") + ` (${gb(p.memory.total_bytes)} of ${gb(p.memory.usable_bytes)}).`));
  }
  for (const s of ex.suggestions || []) parts.push(el("p", {}, s));
  out.append(...parts);
}


// A plan's degrees: dp·tp·pp, and context and expert parallelism where it has them
// (the experts' own TP where the scenario folds them: "ep8 etp1").
function layoutText(p) {
  return `${p.dp}·${p.tp}·${p.pp}` + (p.cp > 1 ? ` cp${p.cp}` : "") + (p.ep > 1 ? ` ep${p.ep}` : "")
    + (p.etp != null ? ` etp${p.etp}` : "");
}

function renderPlans(out, result) {
  const plans = result.plans || [];
  const head = el("p", {}, el("span", { class: `verdict ${result.status}`, "data-status": result.status }, result.status), ` ${plans.length} plan(s), objective ${result.objective}`);
  if (!plans.length) {
    out.replaceChildren(head);
    renderLadder(out, result);
    return;
  }
  const cols = [["#", (p) => p.rank], ["stack", (p) => p.stack],
    ["GPUs", (p) => `${p.gpus}× ${p.gpu}` + (p.generation_gpus ? ` + ${p.generation_gpus} gen` : "")],
    ["dp·tp·pp", layoutText], ["ZeRO", (p) => p.zero], ["offload", (p) => p.offload],
    ["mb×ga", (p) => `${p.micro_batch}×${p.grad_accum}`], ["ckpt", (p) => p.checkpointing], ["method", (p) => p.method + (p.relaxations.length ? " *" : "")],
    ["memory", (p) => gb(p.memory.total_bytes)], ["headroom", (p) => gb(p.memory.headroom_bytes)], ["verdict", (p) => p.memory.verdict],
    ["time", (p) => `${hours(p.time_s)} (${hours(p.time_s_band?.low)}–${hours(p.time_s_band?.high)})`],
    ["cost", (p) => `${usd(p.cost_usd)} (${usd(p.cost_usd_band?.low)}–${usd(p.cost_usd_band?.high)})`],
    ["$/h", (p) => (p.hourly_usd == null ? "—" : p.hourly_usd.toFixed(2))], ["launch", bundleLink]];
  const t = table(cols, plans);
  t.id = "plan-table";
  const relaxed = plans.filter((p) => p.relaxations.length).map((p) => `#${p.rank}: ${p.relaxations.join("; ")}`);
  const gen = plans[0].generation ? el("p", { id: "generation" }, "GRPO generation: " +
    [...new Set(plans.map((p) => p.generation))].join(" · ")) : "";
  out.replaceChildren(head, t, gen, relaxed.length ? el("p", {}, "* relaxed: " + relaxed.join(" · ")) : "", paretoChart(plans));
}

function bundleLink(p) {
  const a = el("a", { href: "#", role: "button", class: "bundle" }, "configs");
  a.addEventListener("click", async (e) => {
    e.preventDefault();
    const res = await fetch("/api/export", { method: "POST", headers: { "content-type": "application/json" },
      body: JSON.stringify({ scenario: p.pinned_scenario, stack: p.stack }) });
    if (res.ok) save(await res.blob(), `plan-${p.rank}-launch.zip`, "application/zip");
  });
  return a;
}

function renderProcure(out, r) {
  const s = r.summary;
  out.replaceChildren(
    el("p", {}, el("span", { class: `verdict ${r.status}`, "data-status": r.status }, r.status),
      ` total ${usd(s.total_usd)} against ${usd(s.naive_usd)} naive and ${usd(s.rent_all_usd)} renting everything; cash outlay ${usd(s.cash_outlay_usd)}`),
    el("h3", {}, "Fleet to buy"),
    r.fleet.length ? table([["GPU", (f) => f.gpu], ["units", (f) => f.units], ["GPUs", (f) => f.gpus], ["unit $", (f) => usd(f.unit_usd)],
      ["price date", (f) => f.unit_price_date || "—"], ["utilisation", (f) => (100 * f.utilisation).toFixed(0) + " %"]], r.fleet) : el("p", {}, "Nothing to buy: renting is cheaper."),
    timeline(r.schedule, s.horizon_hours),
    el("h3", {}, "Buy against rent"),
    table([["answer", (b) => b.answer], ["total", (b) => usd(b.total_usd)], ["cash outlay", (b) => usd(b.cash_outlay_usd)], ["more than this answer", (b) => usd(b.vs_answer_usd)]], r.buy_vs_rent),
    el("h3", {}, "Schedule"),
    table([["job", (x) => `${x.job} #${x.run}`], ["mode", (x) => x.mode], ["GPUs", (x) => `${x.gpus}× ${x.gpu}`], ["layout", (x) => x.layout], ["start", (x) => x.start_date || `${x.start_hours.toFixed(0)} h`], ["hours", (x) => x.hours.toFixed(0)]], r.schedule),
    s.stale_prices && s.stale_prices.length ? el("p", { class: "warn" }, "Stale prices: " + s.stale_prices.join(", ")) : "");
}

// ------------------------------------------------------------------------------------------
// Wiring

const EXAMPLE_PORTFOLIO = `name: two-jobs
horizon_days: 60
lifetime_months: 36
rent: [on_demand]
defaults:
  profile: seed
  workload: {precision: mixed, seq_len: 4096}
jobs:
  - name: sft-8b-lora
    count: 2
    scenario: {model: llama-3.1-8b, workload: {method: lora, tokens: 2e9}}
    deadline_hours: 720
  - name: sft-70b-qlora
    scenario: {model: llama-3.1-70b, workload: {method: qlora, tokens: 5e8}}
    deadline_hours: 1440
`;

function selectTab(name, focus = false) {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    const on = tab.getAttribute("aria-controls") === name;
    tab.setAttribute("aria-selected", on);
    tab.tabIndex = on ? 0 : -1;
    $(`#${tab.getAttribute("aria-controls")}`).hidden = !on;
    if (on && focus) tab.focus();
  }
}

// One tab's answer: the form's values into the URL, the request, the rendering, the downloads.
async function answer(tab, form, ask) {
  const v = values(form);
  saveHash(tab, v);
  const section = $(`#${tab}`), out = $(`#${tab}-result`);
  await busy(section, async () => {
    const [scenario, result] = await ask(v, out);
    out.append(downloads(section, scenario, result, tab));
  });
}

const runFit = (form) => answer("fit", form, async (v, out) => {
  const scenario = fitScenario(v);
  if (v.config) scenario.model = await api("/api/model", v.config);  // a pasted config.json
  const est = await api("/api/estimate", scenario);
  renderEstimate(out, est);
  if (est.verdict === "does_not_fit") {
    renderLadder(out, await api("/api/plan", { name: "web", model: v.model, workload: { method: v.method, algorithm: v.algorithm || "sft", seq_len: num(v.seq_len), tokens: 1e9 },
      search: { gpu_types: [v.gpu], max_gpus: num(v.gpus) }, top: 1 }));
  }
  return [scenario, est];
});

const runPlan = (form) => answer("plan", form, async (v, out) => {
  const scenario = planScenario(v);
  const result = await api("/api/plan", scenario);
  renderPlans(out, result);
  return [scenario, result];
});

async function runProcure(form) {
  const section = $("#procure"), out = $("#procure-result");
  saveHash("procure", {});
  await busy(section, async () => {
    const result = await api("/api/procure", form.elements.portfolio.value, "application/yaml");
    renderProcure(out, result);
  });
}

async function init() {
  const tabs = [...document.querySelectorAll("[role=tab]")];
  tabs.forEach((tab, i) => {
    tab.addEventListener("click", () => { selectTab(tab.getAttribute("aria-controls")); history.replaceState(null, "", "#" + tab.getAttribute("aria-controls")); });
    tab.addEventListener("keydown", (e) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
      if (step) selectTab(tabs[(i + step + tabs.length) % tabs.length].getAttribute("aria-controls"), true);
    });
  });
  $("#procure-form").elements.portfolio.value = EXAMPLE_PORTFOLIO;
  $("#procure-form").elements.file.addEventListener("change", async (e) => {
    const file = e.target.files[0];
    if (file) $("#procure-form").elements.portfolio.value = await file.text();
  });
  $("#fit-form").addEventListener("submit", (e) => { e.preventDefault(); runFit(e.target); });
  $("#plan-form").addEventListener("submit", (e) => { e.preventDefault(); runPlan(e.target); });
  $("#procure-form").addEventListener("submit", (e) => { e.preventDefault(); runProcure(e.target); });
  const [gpus, models, version] = await Promise.all([api("/api/gpus"), api("/api/models"), api("/api/version")]);
  for (const select of document.querySelectorAll("select.gpus")) {
    select.replaceChildren(...gpus.map((g) => el("option", { value: g.id }, `${g.id} (${(g.memory_mib * 1048576 / GB).toFixed(0)} GB)`)));
    select.value = "h100-sxm-80gb";
  }
  $("#models").replaceChildren(...models.map((m) => el("option", { value: m.id }, `${m.name} · ${(m.params / 1e9).toFixed(1)}B`)));
  $("#version").textContent = `planner ${version.version}`;
  document.body.dataset.ready = "1";
  const state = readHash();
  if (state && ["fit", "plan", "procure"].includes(state.tab)) {
    selectTab(state.tab);
    const form = $(`#${state.tab}-form`);
    fill(form, state.values);
    if (state.tab !== "procure" && Object.keys(state.values).length) form.requestSubmit();
  } else {
    selectTab("fit");
  }
}

init();
