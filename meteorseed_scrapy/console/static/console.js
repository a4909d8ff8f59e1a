// MeteorSeed console: plain JS, no dependencies. Everything from the server is rendered with
// textContent / DOM nodes, never innerHTML, so a task URL cannot inject markup or script.
"use strict";

const TOKEN_KEY = "meteorseed.token";
const REFRESH_MS = 2000;
// A query unanswered this long fails (its page refreshes again): a hung one would stop them.
const ANSWER_MS = 30000;
const pages = ["overview", "sites", "dead", "task", "submit"];
let timer = null;
// The navigation shows once the server has accepted the token (not merely once one is typed).
let accepted = false;

const $ = (id) => document.getElementById(id);

// Answers can come back out of order (a slow lookup, a refresh). A page never shows an answer
// older than the one it shows, nor one to a query asked before another query (another `key`:
// a lookup, a filter), yet a refresh slower than REFRESH_MS still shows. The page is aria-busy
// while any of its queries is in flight.
const queries = {};
async function newest(page, key, ask, render) {
  const q = queries[page]
    || (queries[page] = { asked: 0, shown: 0, since: 0, key: null, open: 0 });
  const mine = ++q.asked;
  if (key !== q.key) { q.key = key; q.since = mine; }
  q.open += 1;
  $(`page-${page}`).setAttribute("aria-busy", "true");
  try {
    const answer = await ask();
    if (answer && mine >= q.since && mine > q.shown) { q.shown = mine; render(answer); }
  } finally {
    q.open -= 1;
    if (q.open === 0) $(`page-${page}`).removeAttribute("aria-busy");
  }
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "onclick") node.addEventListener("click", value);
    else if (value !== null && value !== undefined) node.setAttribute(name, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number" && !Number.isInteger(value)) return value.toFixed(2);
  return String(value);
}

function table(columns, rows, emptyText) {
  if (!rows.length) return el("p", { class: "empty" }, emptyText);
  const head = el("tr", {}, columns.map((c) => el("th", {}, c.label)));
  const body = rows.map((row) => el("tr", {}, columns.map((c) => {
    const value = c.render ? c.render(row) : fmt(row[c.key]);
    return el("td", { class: c.cls || null }, value);
  })));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}

function badge(state) {
  return el("span", { class: `badge ${String(state).replace(/[^a-z]/g, "")}` }, state);
}

function flash(message, ok) {
  const node = $("flash");
  node.textContent = message;
  node.className = ok ? "ok" : "";
  node.hidden = !message;
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

class Unauthorized extends Error {}

async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (token()) headers.Authorization = `Bearer ${token()}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const abort = new AbortController();
  const deadline = setTimeout(() => abort.abort(new Error(
    `no answer to ${method} ${path} in ${ANSWER_MS / 1000} s`)), ANSWER_MS);
  let response;
  let data = null;
  try {
    response = await fetch(path, {
      method, headers, body: body === undefined ? undefined : JSON.stringify(body),
      signal: abort.signal,
    });
    try {
      data = await response.json();
    } catch (error) {
      if (abort.signal.aborted) throw error;  // (a body cut off by the deadline: no answer)
      data = null;
    }
  } finally {
    clearTimeout(deadline);
  }
  if (response.status === 401) {
    accepted = false;
    showNav();
    throw new Unauthorized((data && data.detail) || "unauthorized");
  }
  if (!accepted) { accepted = true; showNav(); }
  return { status: response.status, data };
}

function problemText(result) {
  const data = result.data || {};
  return `${result.status} ${data.title || ""}: ${data.detail || "request failed"}`;
}

// --- pages ---------------------------------------------------------------------------------

function showOverview() {
  return newest("overview", "", () => Promise.all([api("GET", "/status"),
    api("GET", "/seeds?limit=20"), api("GET", "/history"), api("GET", "/seed-controls")]),
  renderOverview);
}

function renderOverview([status, seeds, history, controls]) {
  if (status.status !== 200) { flash(problemText(status)); return; }
  const s = status.data;
  const t = s.throughput || {};
  const delayed = s.delayed || { total: 0, reasons: {}, sites: [] };
  const cards = [
    ["backlog", "Backlog", s.backlog], ["pending", "Pending", s.pending],
    ["delayed", "Delayed", delayed.total], ["dead", "Dead letters", s.dead],
    ["seeds", "Seeds", s.seeds], ["added", "Added / s", t.added_per_s],
    ["finished", "Finished / s", t.finished_per_s],
  ];
  const why = rateNote(t);
  $("overview-cards").replaceChildren(...cards.map(([id, label, value]) => el("div",
    { class: "card", id: `card-${id}` }, el("div", { class: "label" }, label),
    el("div", { class: "value", "data-testid": id }, fmt(value)),
    (id === "added" || id === "finished") && why
      ? el("div", { class: "note", "data-testid": `${id}-note` }, why) : null)));
  showCharts(history.status === 200 ? history.data : null);
  const lanes = Object.entries(s.lanes || {}).map(([lane, v]) => ({ lane, ...v }));
  $("overview-lanes").replaceChildren(lanes.length ? table([
    { key: "lane", label: "Lane" },
    { key: "backlog", label: "Backlog", cls: "num" },
    { key: "pending", label: "Pending", cls: "num" },
  ], lanes, "") : "");
  showDelayed(delayed);
  $("overview-consumers").replaceChildren(table([
    { key: "name", label: "Consumer" },
    { key: "pending", label: "Pending", cls: "num" },
    { label: "Idle", cls: "num", render: (c) => `${(c.idle_ms / 1000).toFixed(1)} s` },
  ], s.consumers || [], "No worker is reading the streams now."));
  const gone = history.status === 200 ? history.data.consumers_gone : [];
  $("overview-consumers-gone").replaceChildren(gone.length ? el("p", { class: "hint" },
    "Seen by this server, gone since (a worker removes its consumer when it stops):") : "",
  gone.length ? table([
    { key: "name", label: "Consumer" },
    { label: "Last seen", render: (c) => `${when(c.last_seen_at)} (${agoText(c.last_seen_at)})` },
    { key: "pending", label: "Pending then", cls: "num" },
  ], gone, "") : "");
  const seedRows = seeds.status === 200 ? seeds.data.seeds : [];
  // (paused or cancelled while an operator's control lasts, as `meteorseed seeds list` says)
  const controlled = (r) => (r.control && r.control.cancelled ? "cancelled"
    : r.control && r.control.held ? "paused" : null);
  $("overview-seeds").replaceChildren(table([
    { label: "Seed", render: (r) => r.seed.seed_id },
    { label: "Site", render: (r) => r.seed.site_id },
    { label: "Type", render: (r) => r.seed.task_type },
    { label: "Status", render: (r) => el("span", { "data-testid": `status-${r.seed.seed_id}` },
      badge(controlled(r) || r.status)) },
    { label: "Expansion", render: (r) => (r.expansion ? badge(r.expansion.state) : "–") },
    { label: "Enqueued", cls: "num seed-enqueued", render: (r) => fmt(
      r.expansion ? r.expansion.enqueued : r.last_enqueued) },
    { label: "Dupli\u00adcates", cls: "num", render: (r) => fmt(
      r.expansion ? r.expansion.duplicates : r.last_duplicates) },
    { label: "Rejected", cls: "num", render: (r) => fmt(
      r.expansion ? r.expansion.rejected : r.last_rejected) },
    { label: "Runs", cls: "num", render: (r) => fmt(r.runs) },
    { label: "Next run", render: (r) => (r.next_due ? el("span", { title: when(r.next_due) },
      due(r.next_due - Date.now() / 1000)) : "–") },
    { label: "Last error", cls: "url", render: (r) => fmt(r.last_error) },
  ], seedRows, "No seed registered."));
  // What became of each seed's tasks (GET /seeds' progress, counted fleet-wide as they settle).
  const counted = seedRows.filter((r) => r.progress);
  // (soft hyphens: a header may break, so the table fits 800 px)
  const labels = { enqueued: "En\u00adqueued", waiting: "Wait\u00ading",
    delayed: "De\u00adlayed", anomalies: "Anom\u00adalies" };
  const cell = (name) => ({ label: labels[name] || name[0].toUpperCase() + name.slice(1),
    cls: "num",
    render: (r) => el("span", { "data-testid": `${name}-${r.seed.seed_id}` },
      fmt(r.progress[name])) });
  $("overview-progress").replaceChildren(table([
    { label: "Seed", render: (r) => r.seed.seed_id },
    // (its pause, resume and cancel buttons under its state)
    { label: "State", render: (r) => el("div", {},
      el("span", { "data-testid": `progress-${r.seed.seed_id}` },
        badge(controlled(r) || r.progress.state)),
      seedControlCell(r.seed.seed_id, r.progress,
        (controls.status === 200 ? controls.data : {})[r.seed.seed_id] || {})) },
    ...["enqueued", "done", "dead", "waiting", "delayed", "items", "anomalies", "bytes"]
      .map(cell),
    { label: "Finished", render: (r) => (r.progress.finished_at
      ? el("span", { title: when(r.progress.finished_at) }, agoText(r.progress.finished_at))
      : "–") },
  ], counted, "No task of these seeds counted yet."));
  const warnings = (s.redis && s.redis.warnings) || [];
  $("overview-warnings").replaceChildren(...warnings.map((w) => el("li", {}, w)));
}

// Why "Added / s" has no number: the rate is the growth between two snapshots of the counter.
function rateNote(t) {
  if (t.added_total === null || t.added_total === undefined) {
    return "counter unreadable (see warnings)";
  }
  if (t.added_per_s === null || t.added_per_s === undefined) {
    return "needs two samples in the last minute";
  }
  return `over ${fmt(t.over_s)} s`;
}

function agoText(epoch) {
  const s = Math.max(0, Date.now() / 1000 - epoch);
  return s < 120 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(0)} min ago`;
}

// The last hour, sampled by the server (GET /history), as small SVG charts (charts.js).
function showCharts(h) {
  if (!h) { $("overview-charts-note").textContent = "History unavailable."; return; }
  const samples = h.samples;
  const times = samples.map((p) => p.at);
  const col = (key) => samples.map((p) => (p[key] === undefined ? null : p[key]));
  const opts = { interval: h.interval_s };
  const since = samples.length ? new Date(samples[0].at * 1000).toISOString().slice(11, 19) : "";
  $("overview-charts-note").textContent = (samples.length
    ? `${samples.length} samples, one every ${h.interval_s} s since ${since} UTC ` +
      `(kept: the last ${h.size}).` : `No sample yet (one every ${h.interval_s} s).`) +
    (h.error ? ` Last sample failed: ${h.error}` : "");
  const sites = h.sites.map((site) => ({ name: site,
    values: samples.map((p) => (site in p.sites ? p.sites[site] : 0)) }));
  $("overview-charts").replaceChildren(
    MeteorCharts.line("chart-queue", "Queue", times, [
      { name: "backlog", values: col("backlog") }, { name: "pending", values: col("pending") },
      { name: "delayed", values: col("delayed") }], opts),
    MeteorCharts.line("chart-throughput", "Tasks / s", times, [
      { name: "added", values: col("added_per_s") },
      { name: "finished", values: col("finished_per_s") }], opts),
    MeteorCharts.line("chart-sites", "Requests / s by site", times, sites.length ? sites
      : [{ name: "all sites", values: col("requests_per_s") }], opts),
    MeteorCharts.line("chart-errors", "Error share", times,
      [{ name: "errors", values: col("error_ratio"), colour: "#b42318" }],
      { ...opts, unit: "%" }),
    MeteorCharts.line("chart-latency", "Mean latency", times,
      [{ name: "latency", values: col("latency_ms"), colour: "#ae3ec9" }],
      { ...opts, unit: "ms" }));
}

function due(seconds) {
  if (seconds === null || seconds === undefined) return "never";
  return seconds < 0 ? `overdue ${(-seconds).toFixed(1)} s` : `in ${seconds.toFixed(1)} s`;
}

function reasons(counts) {
  return Object.entries(counts || {}).map(([why, n]) => `${why} ${n}`).join(", ");
}

// Tasks deferred in the delayed set: not in the backlog, not done either (retries, paused or
// sick sites, parked tasks), so a crawl with only delayed tasks left is not finished.
function showDelayed(delayed) {
  const sampled = delayed.scanned < delayed.total
    ? ` (breakdown of the ${delayed.scanned} due soonest)` : "";
  $("overview-delayed-summary").textContent = delayed.total
    ? `${delayed.total} delayed, next due ${due(delayed.next_due_in_s)}: ` +
      `${reasons(delayed.reasons)}${sampled}`
    : "No task is delayed.";
  $("overview-delayed").replaceChildren(delayed.total ? table([
    { label: "Site", render: (r) => (r.site_id === null ? "(damaged entry)" : r.site_id) },
    { key: "count", label: "Delayed", cls: "num" },
    { label: "Why", render: (r) => reasons(r.reasons) },
    { label: "Next due", cls: "num", render: (r) => due(r.next_due_in_s) },
  ], (delayed.sites || []).slice(0, 20), "") : "");
}

function showSites() {
  return newest("sites", "", () => Promise.all([api("GET", "/sites"), api("GET", "/status"),
    api("GET", "/controls")]), renderSites);
}

function renderSites([result, status, controls]) {
  if (result.status !== 200) { flash(problemText(result)); return; }
  const held = controls.status === 200 ? controls.data : {};
  // Fleet-wide adaptive limits and robots.txt caps, from the queue snapshot (docs/politeness.md).
  const throttles = status.status === 200 ? (status.data.throttles || []) : [];
  $("sites-adaptive").replaceChildren(table([
    { key: "site_id", label: "Site" },
    { label: "Target req / s", cls: "num", render: (r) => fmt(r.target_rate) },
    { label: "Latency ms", cls: "num", render: (r) => fmt(r.latency_ms) },
    { key: "in_flight", label: "In flight", cls: "num" },
    { label: "robots.txt delay s", cls: "num", render: (r) => fmt(r.robots_interval_s) },
  ], throttles, "No site has an adaptive limit or a robots.txt cap."));
  $("sites-table").replaceChildren(table([
    { key: "site_id", label: "Site" },
    { label: "Breaker", render: (r) => badge(r.breaker) },
    { key: "requests_per_s", label: "Req / s", cls: "num" },
    { label: "Errors", cls: "num", render: (r) => (r.error_ratio === null ? "–"
      : `${(r.error_ratio * 100).toFixed(0)} %`) },
    { key: "mean_latency_ms", label: "Latency ms", cls: "num" },
    { key: "in_flight", label: "In flight", cls: "num" },
    { key: "paused_for_s", label: "Paused s", cls: "num" },
    { key: "rate_factor", label: "Rate factor", cls: "num" },
    { key: "rate_limit", label: "Rate limit", cls: "num" },
    { key: "anomalies", label: "Anomalies", cls: "num" },
    { label: "Hold", render: (r) => holdCell(r.site_id, held[r.site_id] || {}) },
  ], result.data.sites, "No site has any state yet."));
  const d = result.data;
  $("sites-note").textContent = d.anomalies_error ? `Anomalies unavailable: ${d.anomalies_error}`
    : d.anomalies_source ? `Anomalies from ${d.anomalies_source}.`
      : "Anomalies: start serve with --store-uri to count them.";
}

// Pause / resume a site fleet-wide (POST /sites/{id}/pause|resume; docs/operations.md).
function holdCell(site, control) {
  const testid = `hold-${site}`;
  if (control.held) {
    return el("span", { "data-testid": testid }, `held by ${control.held.by} `,
      el("button", { type: "button", onclick: () => siteControl(site, "resume") }, "Resume"));
  }
  const limit = control.override ? `limited to ${fmt(control.override.rate)} req/s ` : "";
  return el("span", { "data-testid": testid }, limit,
    el("button", { type: "button", class: "secondary",
      onclick: () => siteControl(site, "pause") }, "Pause"));
}

async function siteControl(site, action) {
  const body = action === "pause" ? { reason: "from the console" } : undefined;
  const result = await guarded(() => api("POST",
    `/sites/${encodeURIComponent(site)}/${action}`, body));
  if (!result) return;
  if (result.status === 200) {
    flash(action === "pause" ? `${site} held fleet-wide.`
      : `${site} resumed: ${result.data.woken} parked task(s) due now.`, true);
  } else flash(problemText(result));
  await guarded(showSites);
}

// Pause / resume / cancel a seed fleet-wide (POST /seeds/{id}/pause|resume|cancel).
function seedControlCell(seed, progress, control) {
  const testid = `seed-control-${seed}`;
  const who = control.by ? `${control.state} by ${control.by} at ${when(control.at)}` : "";
  // (how many of its tasks were cancelled: its progress' counter)
  const count = el("span", { "data-testid": `cancelled-${seed}` }, fmt(progress.cancelled));
  if (control.cancelled) {
    return el("div", { "data-testid": testid, title: who }, "cancelled ", count);
  }
  const cancelled = progress.cancelled ? el("span", { class: "hint" }, " (", count, ")") : "";
  const cancel = el("button", { type: "button", class: "secondary small",
    onclick: () => seedControl(seed, "cancel") }, "Cancel");
  if (control.held) {
    return el("div", { "data-testid": testid, title: who }, "held ",
      el("button", { type: "button", class: "small",
        onclick: () => seedControl(seed, "resume") }, "Resume"), cancel, cancelled);
  }
  return el("div", { "data-testid": testid, title: who },
    el("button", { type: "button", class: "secondary small",
      onclick: () => seedControl(seed, "pause") }, "Pause"), cancel, cancelled);
}

async function seedControl(seed, action) {
  if (action === "cancel" && !window.confirm(`Cancel seed ${seed}? Its waiting and delayed ` +
      "tasks are removed.")) return;
  const body = action === "pause" ? { reason: "from the console" } : undefined;
  const result = await guarded(() => api("POST",
    `/seeds/${encodeURIComponent(seed)}/${action}`, body));
  if (!result) return;
  if (result.status !== 200) flash(problemText(result));
  else if (action === "pause") flash(`Seed ${seed} held fleet-wide.`, true);
  else if (action === "resume") {
    flash(`Seed ${seed} resumed: ${result.data.woken} parked task(s) due now.`, true);
  } else {
    flash(`Seed ${seed} cancelled: ${result.data.removed.waiting} waiting and ` +
      `${result.data.removed.delayed} delayed task(s) removed.`, true);
  }
  await guarded(showOverview);
}

function showDead() {
  const site = $("dead-site").value.trim();
  const query = site ? `?site_id=${encodeURIComponent(site)}` : "";
  return newest("dead", query, () => api("GET", `/dead-letters${query}`), renderDead);
}

function renderDead(result) {
  if (result.status !== 200) { flash(problemText(result)); return; }
  $("dead-table").replaceChildren(table([
    { key: "id", label: "Id" },
    { key: "site_id", label: "Site" },
    { key: "url", label: "URL", cls: "url" },
    { key: "reason", label: "Reason", cls: "url" },
    { key: "retries", label: "Retries", cls: "num" },
    { key: "deliveries", label: "Deliveries (last try)", cls: "num" },
    { key: "at", label: "At" },
    { label: "", render: (r) => el("span", {},
      el("button", { type: "button", class: "secondary", onclick: () => inspect(r.id) }, "Inspect"),
      " ",
      r.requeueable ? el("button", { type: "button", onclick: () => requeue(r.id) }, "Requeue")
        : "") },
  ], result.data.dead_letters, "No dead letters."));
}

async function inspect(id) {
  const result = await guarded(() => api("GET", `/dead-letters/${encodeURIComponent(id)}`));
  if (!result) return;
  if (result.status !== 200) { flash(problemText(result)); return; }
  $("dead-detail-title").hidden = false;
  $("dead-detail").hidden = false;
  $("dead-detail").textContent = JSON.stringify(result.data, null, 2);
}

async function requeue(id) {
  const result = await guarded(() => api("POST",
    `/dead-letters/${encodeURIComponent(id)}/requeue`));
  if (!result) return;
  if (result.status === 200) flash(`Requeued ${id} as ${result.data.requeued.stream_id}.`, true);
  else flash(problemText(result));
  await guarded(showDead);
}

function when(epoch) {
  return epoch === null || epoch === undefined ? "never" : new Date(epoch * 1000).toISOString();
}

function placeText(p) {
  if (p.state === "waiting") return `${p.lane}/${p.band}, ${p.ahead} ahead of it`;
  if (p.state === "pending") {
    return p.consumer ? `${p.lane}/${p.band} on ${p.consumer} for ${fmt(p.idle_s)} s, ` +
      `delivered ${p.deliveries} time(s)` : `${p.lane}/${p.band}`;
  }
  if (p.state === "delayed") return `${p.why}: due ${when(p.due_at)}, then to ${p.to_lane}/${p.to_band}`;
  if (p.state === "dead") return `${p.reason} (${fmt(p.deliveries)} deliveries, at ${fmt(p.at)})`;
  if (p.state === "done") {
    const r = p.record || {};
    return `items ${fmt(r.items)}, digest ${fmt(r.digest)}, status ${fmt(r.status)}`;
  }
  return "";
}

// GET /tasks/{id} or /tasks?url=: the same answer as `meteorseed task`.
function findTask(event) {
  event.preventDefault();
  const q = $("task-query").value.trim();
  const site = $("task-site").value.trim();
  const siteQuery = site ? `site_id=${encodeURIComponent(site)}` : "";
  const path = q.includes("://")
    ? `/tasks?url=${encodeURIComponent(q)}${siteQuery ? "&" + siteQuery : ""}`
    : `/tasks/${encodeURIComponent(q)}${siteQuery ? "?" + siteQuery : ""}`;
  return newest("task", path, () => guarded(() => api("GET", path)), showTask);
}

function showTask(result) {
  for (const id of ["task-summary", "task-places", "task-dedup", "task-searched"]) {
    $(id).replaceChildren();  // (an answer never stays beside another query's error)
  }
  $("task-detail").hidden = true;
  if (result.status !== 200) {
    const errors = ((result.data && result.data.errors) || []).map((e) => `${e.field}: ${e.problem}`);
    flash(`${problemText(result)} ${errors.join("; ")}`);
    return;
  }
  flash("");
  const d = result.data;
  $("task-summary").replaceChildren("State: ", badge(d.state));
  $("task-places").replaceChildren(table([
    { label: "State", render: (p) => badge(p.state) },
    { label: "Where", cls: "url", render: (p) => p.stream || p.key || "" },
    { label: "Enqueued", render: (p) => (p.enqueued_at ? when(p.enqueued_at) : "–") },
    { label: "Detail", cls: "url", render: placeText },
    { label: "URL", cls: "url", render: (p) => (p.task ? p.task.url : "–") },
  ], d.places, "Not in any stream, delayed set, dead letter or completion record searched."));
  $("task-dedup").replaceChildren(...d.dedup.map((row) => el("li", {},
    !row.seen ? `Site ${row.site_id}: not in its dedup record (a seed may enqueue it).`
      : row.window_s ? `Site ${row.site_id}: deduplicated, eligible again ${when(row.eligible_at)}.`
        : `Site ${row.site_id}: deduplicated, never re-crawled (no window).`)));
  const read = d.searched.reduce((n, s) => n + s.read, 0);
  $("task-searched").textContent = `Searched ${d.searched.length} keys, ${read} entries read` +
    (d.exhaustive ? ", every one in full." : "; some only in part (see the JSON below).");
  $("task-detail").hidden = false;
  $("task-detail").textContent = JSON.stringify(d, null, 2);
}

function seedFromForm() {
  const type = $("seed-type").value;
  const text = $("seed-payload").value.trim();
  let payload;
  if (text.startsWith("{")) {
    payload = JSON.parse(text); // a syntax error is shown to the operator
  } else if (type === "url_list") {
    payload = { urls: text.split(/\r?\n/).map((u) => u.trim()).filter(Boolean) };
  } else {
    throw new Error(`the payload of a ${type} seed must be a JSON object`);
  }
  return {
    seed_id: $("seed-id").value.trim(), site_id: $("seed-site").value.trim(),
    task_type: type, priority: Number.parseInt($("seed-priority").value || "0", 10),
    payload,
  };
}

async function submitSeed(event) {
  event.preventDefault();
  let seed;
  try { seed = seedFromForm(); } catch (error) { flash(`Payload: ${error.message}`); return; }
  const result = await guarded(() => api("POST", "/dispatch", seed));
  if (!result) return;
  const out = $("seed-result");
  const errors = ((result.data && result.data.errors) || []).map((e) => el("li", {},
    el("code", {}, e.field), `: ${e.problem}`));
  if (result.status === 202) {
    const d = result.data;
    const line = d.seeds[0] || {};
    flash(`Seed ${line.seed_id} accepted: ${d.enqueued} tasks enqueued, ${d.duplicates} ` +
      `duplicates, ${d.rejected_urls} URLs rejected (${line.state}).`, true);
    out.replaceChildren(el("p", { id: "seed-result-summary" },
      `enqueued ${d.enqueued}, duplicates ${d.duplicates}, rejected ${d.rejected_urls}`),
      errors.length ? el("ul", { class: "errors" }, errors) : "");
  } else {
    flash(problemText(result));
    out.replaceChildren(el("ul", { class: "errors" }, errors));
  }
}

// --- navigation, token ---------------------------------------------------------------------

const renderers = { overview: showOverview, sites: showSites, dead: showDead, task: null,
  submit: null };

async function guarded(fn) {
  try {
    return await fn();
  } catch (error) {
    if (error instanceof Unauthorized) {
      sessionStorage.removeItem(TOKEN_KEY);
      flash(`Token refused: ${error.message}`);
      route();
    } else {
      flash(`Cannot reach the server: ${error.message}`);
    }
    return null;
  }
}

function currentPage() {
  const name = location.hash.replace(/^#/, "");
  return pages.includes(name) ? name : "overview";
}

function showNav() { $("nav").hidden = !(token() && accepted); }

function route() {
  clearInterval(timer);
  const authed = Boolean(token());
  $("login").hidden = authed;
  showNav();
  const page = currentPage();
  for (const name of pages) $(`page-${name}`).hidden = !authed || name !== page;
  for (const link of document.querySelectorAll("nav a")) {
    link.classList.toggle("active", link.dataset.page === page);
  }
  if (!authed) { $("token").focus(); return; }
  const render = renderers[page];
  if (!accepted && !render) guarded(() => api("GET", "/seeds?limit=1"));  // checks the token
  if (render) {
    guarded(render);
    // (no refresh is asked while the last one is still in flight: a slow server is not piled on)
    timer = setInterval(() => (queries[page] || {}).open || guarded(render), REFRESH_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (event) => {
    event.preventDefault();
    sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
    accepted = false;
    $("token").value = "";
    flash("");
    route();
  });
  $("logout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    accepted = false;
    route();
  });
  $("seed-form").addEventListener("submit", submitSeed);
  $("task-form").addEventListener("submit", findTask);
  $("dead-filter").addEventListener("submit", (event) => { event.preventDefault(); guarded(showDead); });
  window.addEventListener("hashchange", () => { flash(""); route(); });
  route();
});
