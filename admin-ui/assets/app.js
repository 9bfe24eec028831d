// fencegate admin page: plain JavaScript, no build step, no network beyond this node's API.
// Every view polls the node's JSON API (/v1/...) about once a second while it is shown.
"use strict";

const POLL_MS = 1000;
/** A read that gets no answer this soon counts as failed, so a hung node shows as stale. */
const READ_TIMEOUT_MS = 5000;
/** While this node refuses the page's reads for want of an admin key, the same credential is
 *  asked again only this often: every refused call is a line in the node's audit log. */
const DENIED_RETRY_MS = 30000;
/** A credential being typed is tried once the typing paused this long, not at each key. */
const TYPING_MS = 800;
const state = {
  view: "cluster",
  overview: null,
  locks: { prefix: "", pages: [null], page: 0, list: null, fetchedAt: 0 },
  series: { samples: [], elections: [], last: 0 },
  resource: null,
  // Set once a read was refused for want of an admin key (API keys on): from then on the
  // credential box shows on every view, not only on those that act.
  readsNeedKey: false,
  // The last refusal of the reads, { token, at }, while it holds (see `heldBack`).
  denied: null,
  // When the last refresh got everything it asked for (wall clock, ms): what the page shows
  // is as of then when a later one fails.
  lastOk: 0,
};
// When the admin token field last changed (performance.now()).
let typedAt = 0;

// ---- small helpers ------------------------------------------------------------------------

const $ = (sel) => document.querySelector(sel);

/** Builds an element; text children are added as text, never parsed as HTML. */
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") e.className = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else if (k in e) e[k] = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

/** Sets an element's text only when it differs: rewriting the same text would still replace
 *  its text node, losing a selection in it and re-announcing an aria-live region. */
function setText(e, text) {
  const t = String(text);
  if (e.textContent !== t) e.textContent = t;
}

// What each region showed when it was last rendered, as HTML. The page polls every second and
// most polls bring the same content: replacing the nodes anyway would drop the keyboard focus
// to <body> and clear a text selection each time. (Compared with what was rendered, not with
// the live DOM, which the countdown edits between polls.)
const rendered = new WeakMap();

/** Whether the user has a text selection touching `region` (they are reading or copying). */
function selectionIn(region) {
  const sel = document.getSelection();
  if (!sel || sel.isCollapsed) return false;
  for (let i = 0; i < sel.rangeCount; i += 1) {
    if (sel.getRangeAt(i).intersectsNode(region)) return true;
  }
  return false;
}

const FOCUSABLE = "a[href], button, input, select, textarea, [tabindex]";

/**
 * Puts `nodes` in `region` in place of its children, unless they are what it shows already
 * or the user has text selected in it (then the next poll tries again). Focus inside the
 * region moves to the new element with the same `data-focus-key` (the same link or button of
 * the same row), else to the one at the same place, so a keyboard user keeps their place.
 */
function render(region, nodes) {
  const html = nodes.map((n) => n.outerHTML).join("");
  if (rendered.get(region) === html || selectionIn(region)) return;
  const focused = document.activeElement;
  const inside = focused && focused !== region && region.contains(focused);
  const key = inside ? focused.dataset.focusKey : undefined;
  const at = inside ? [...region.querySelectorAll(FOCUSABLE)].indexOf(focused) : -1;
  region.replaceChildren(...nodes);
  rendered.set(region, html);
  if (!inside) return;
  const all = [...region.querySelectorAll(FOCUSABLE)];
  const same = key !== undefined ? region.querySelector(`[data-focus-key="${CSS.escape(key)}"]`) : null;
  // The element is gone (its row left the table): the one now in its place, else the
  // main content, never <body>.
  const next = same || all[Math.min(Math.max(at, 0), all.length - 1)] || $("#main");
  next.focus({ preventScroll: true });
}

/** The date is left out when it is today (most of what the page shows is minutes old). */
function fmtTime(ms) {
  if (!ms) return "—";
  const d = new Date(ms);
  return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}
/** Time of day only, for spans known to be short (a chart's ten minutes). */
const fmtClock = (ms) => new Date(ms).toLocaleTimeString();
const dash = (v) => (v === null || v === undefined || v === "" ? "—" : v);

/** A member's clock against the serving node's: its wall-clock offset, and its rate when that
 * is off by more than the half percent the node warns about. */
function fmtPeerClock(p) {
  if (p.clock_offset_ms === null || p.clock_offset_ms === undefined) return "—";
  const sign = p.clock_offset_ms < 0 ? "−" : "+";
  const offset = `${sign}${(Math.abs(p.clock_offset_ms) / 1000).toFixed(1)} s`;
  const rate = typeof p.clock_rate === "number" && Math.abs(p.clock_rate - 1) > 0.005 ? `, runs ×${p.clock_rate.toFixed(3)}` : "";
  return offset + rate;
}
const peerClockOff = (p) =>
  Math.abs(p.clock_offset_ms || 0) > 5000 || (typeof p.clock_rate === "number" && Math.abs(p.clock_rate - 1) > 0.005);

function fmtLeft(ms) {
  if (ms <= 0) return "expired";
  const s = ms / 1000;
  return s >= 60 ? `${Math.floor(s / 60)} min ${Math.floor(s % 60)} s` : `${s.toFixed(1)} s`;
}

/** The node answered, but refused: its status and the API's error code and message. */
class ApiError extends Error {
  constructor(status, body, statusText) {
    const code = body.error || statusText || "error";
    const message = body.message || statusText || "no message";
    super(`${status} ${code}: ${message}`);
    this.status = status;
    this.code = code;
    this.detail = message;
  }

  /** A refusal for want of a (valid, admin) credential. */
  get denied() {
    return this.status === 401 || this.status === 403;
  }
}

/** No answer at all: the node is down or unreachable, or it did not answer in time. */
class Unreachable extends Error {}

/** The admin token typed into the credential box ("" when none). */
const typedToken = () => $("#admin-token").value;

/** The Authorization header of the admin token typed in, if any. */
function credential() {
  const token = typedToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** A GET of this node's API that times out; throws `Unreachable` or `ApiError`. */
async function fetchRead(path) {
  // With authentication on, the page's reads need an admin key too: the one in the
  // credential field (the page itself is served without one).
  try {
    return await fetch(path, {
      headers: { Accept: "application/json", ...credential() },
      signal: AbortSignal.timeout(READ_TIMEOUT_MS),
    });
  } catch (e) {
    throw new Unreachable(e.name === "TimeoutError" ? `no answer within ${READ_TIMEOUT_MS / 1000} s` : e.message);
  }
}

async function getJson(path) {
  const r = await fetchRead(path);
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new ApiError(r.status, body, r.statusText);
  return body;
}

/**
 * Whether a read that was refused for want of a credential (`denial`, { token, at }) should
 * not be asked again yet: with the same credential only every DENIED_RETRY_MS; with a new
 * one as soon as the typing pauses.
 */
function heldBack(denial) {
  if (!denial) return false;
  if (typedToken() !== denial.token) return performance.now() - typedAt < TYPING_MS;
  return Date.now() - denial.at < DENIED_RETRY_MS;
}

/** Shows why the last refresh failed (or hides the banner), and marks what it left stale. */
function showError(e) {
  const p = $("#error");
  // Data from an earlier answer stays on screen, dimmed (style.css). A 400 is the node
  // answering that the request was bad (a prefix no name can start with): the view it was
  // for is cleared, and everything else was just read.
  document.body.classList.toggle("stale", !!e && !(e instanceof ApiError && e.status === 400));
  if (!e) {
    p.hidden = true;
    return;
  }
  let text;
  if (e instanceof ApiError) {
    text = `This node answered ${e.status} ${e.code}: ${e.detail}`;
    if (e.denied) {
      text += ` Enter an admin key under Credential; the page asks again when it changes, or in ${DENIED_RETRY_MS / 1000} s.`;
    }
  } else if (e instanceof Unreachable) {
    text = `Could not reach this node's API: ${e.message}.`;
  } else {
    text = `The page could not show this node's answer: ${e.message}.`;
  }
  if (document.body.classList.contains("stale")) {
    text += state.lastOk ? ` What is shown is as of ${fmtClock(state.lastOk)}.` : " Nothing was read yet.";
  }
  setText(p, text);
  p.hidden = false;
}

// ---- routing ------------------------------------------------------------------------------

function route() {
  let hash;
  try {
    hash = decodeURIComponent(location.hash.slice(1)) || "cluster";
  } catch {
    // A malformed fragment (`#%`): the cluster view, rather than a page that never starts.
    hash = "cluster";
  }
  // "#main" is the skip link's target, not a view (a click on the link never gets here; an
  // address ending in it does): stay on the view shown.
  let view = hash === "main" ? state.view : hash;
  if (hash.startsWith("resource/")) {
    view = "resource";
    state.resource = hash.slice("resource/".length);
  }
  if (!document.querySelector(`[data-view="${view}"]`)) view = "cluster";
  state.view = view;
  for (const s of document.querySelectorAll("[data-view]")) s.hidden = s.dataset.view !== view;
  placeCredential();
  for (const a of document.querySelectorAll("nav a")) {
    if (a.getAttribute("href") === `#${view}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  refresh();
}

/**
 * The credential box shows on the views that need the admin credential (its data-views:
 * Actions and Unknown outcomes) and, once this node refused a read for want of one (API keys
 * on: every /v1 read needs an admin key), on every view, since no view works without it.
 */
function placeCredential() {
  const box = $("#credential");
  box.hidden = !(state.readsNeedKey || box.dataset.views.split(" ").includes(state.view));
}

// ---- cluster ------------------------------------------------------------------------------

async function refreshOverview() {
  const o = await getJson("/v1/admin/overview");
  state.overview = o;
  const s = o.status;
  setText($("#served-by"), `node ${s.node_id}`);
  setText($("#leader"), s.leader_id ? `node ${s.leader_id}` : "none (election in progress)");
  setText($("#term"), s.term);
  $("#actions-off").hidden = o.actions_enabled;
  if (state.view !== "cluster") return;
  setText($("#role"), s.role);
  setText($("#last-log"), dash(s.last_log_index));
  setText($("#applied"), s.last_applied);
  setText($("#snapshot-index"), dash(s.snapshot_index));
  setText($("#purged-index"), dash(s.purged_index));
  setText($("#active-locks"), s.locks.active_locks);
  setText($("#waiters"), s.locks.waiters);
  setText($("#last-token"), s.locks.last_token);
  const last = o.elections[o.elections.length - 1];
  setText(
    $("#last-election"),
    last
      ? `${fmtTime(last.at_ms)}: node ${last.leader_id} won term ${last.term}, ${last.duration_ms} ms without a leader`
      : "none seen",
  );
  render(
    $("#members tbody"),
    o.peers.map((p) =>
      el(
        "tr",
        { "data-node": p.id, class: p.up ? "up" : "down" },
        el("th", { scope: "row" }, `node ${p.id}${p.id === s.node_id ? " (this page)" : ""}`),
        el("td", {}, p.addr),
        el("td", { class: "health" }, p.up ? "up" : "down", p.error ? el("small", {}, ` — ${p.error}`) : null),
        el("td", { class: "role" }, dash(p.role)),
        el("td", {}, p.voter ? "yes" : "learner"),
        el("td", {}, p.leader_id ? `node ${p.leader_id}` : "—"),
        el("td", {}, dash(p.matched_index)),
        el("td", {}, dash(p.lag)),
        el("td", {}, fmtTime(p.last_seen_ms)),
        el("td", peerClockOff(p) ? { class: "clock-off" } : {}, fmtPeerClock(p)),
      ),
    ),
  );
  render(
    $("#elections"),
    o.elections
      .slice()
      .reverse()
      .map((e) =>
        el("li", {}, `${fmtTime(e.at_ms)} — node ${e.leader_id} leads term ${e.term} (${e.duration_ms} ms without a leader)`),
      ),
  );
}

// ---- locks --------------------------------------------------------------------------------

async function refreshLocks() {
  const L = state.locks;
  const size = $("#page-size").value;
  const after = L.pages[L.page];
  const q = new URLSearchParams({ prefix: L.prefix, limit: size });
  if (after) q.set("after", after);
  const tbody = $("#locks-table tbody");
  let list;
  try {
    // Every tenant's locks, by stored name (`tenant#name`), which the resource view reads.
    list = await getJson(`/v1/admin/locks?${q}`);
  } catch (e) {
    // The node refused the search (a prefix no name can start with, say): no rows of the
    // previous search may stay under it. Without an answer the rows stay, marked stale.
    if (e instanceof ApiError) {
      L.list = null;
      render(tbody, []);
      setText($("#page-info"), `page ${L.page + 1} · no result`);
      $("#prev-page").disabled = L.page === 0;
      $("#next-page").disabled = true;
    }
    throw e;
  }
  L.list = list;
  L.fetchedAt = performance.now();
  L.pages[L.page + 1] = list.next_after || undefined;
  const none = L.prefix
    ? `No held or waited-on resource starts with “${L.prefix}”${L.page ? " after the previous page" : ""}.`
    : `No resource is held or waited on${L.page ? " after the previous page" : ""}.`;
  render(
    tbody,
    list.locks.length
      ? list.locks.map((l) =>
          el(
            "tr",
            { "data-resource": l.resource },
            el(
              "th",
              { scope: "row" },
              el("a", { href: `#resource/${encodeURIComponent(l.resource)}`, "data-focus-key": l.resource }, l.resource),
            ),
            el("td", {}, dash(l.holder)),
            el("td", { class: "token" }, dash(l.fencing_token)),
            el("td", { class: "left", "data-expires": l.expires_at_ms || "" }, l.expires_at_ms ? "" : "—"),
            el("td", {}, l.waiters),
          ),
        )
      : [el("tr", { class: "none" }, el("td", { colSpan: 5, class: "empty" }, none))],
  );
  setText($("#page-info"), `page ${L.page + 1} · ${list.locks.length} shown`);
  $("#prev-page").disabled = L.page === 0;
  $("#next-page").disabled = !list.next_after;
  tickCountdown();
}

/** Time left counts down between polls from the server's log time at the last fetch. */
function tickCountdown() {
  const L = state.locks;
  if (!L.list) return;
  const serverNow = L.list.now_ms + (performance.now() - L.fetchedAt);
  for (const td of document.querySelectorAll("#locks-table td.left[data-expires]")) {
    const exp = Number(td.dataset.expires);
    if (exp) setText(td, fmtLeft(exp - serverNow));
  }
}

// ---- resource -----------------------------------------------------------------------------

/** A list, or the sentence that says it is empty (not a list item numbered "1."). */
const listOr = (tag, items, none) => (items.length ? el(tag, {}, ...items) : el("p", { class: "empty" }, none));

async function refreshResource() {
  const name = state.resource;
  setText($("#resource-name"), name);
  let d;
  try {
    d = await getJson(`/v1/admin/resources/${encodeURIComponent(name)}`);
  } catch (e) {
    // Refused (a name no resource can have): show nothing of the resource shown before.
    if (e instanceof ApiError) {
      for (const id of ["#resource-facts", "#resource-queue", "#resource-grants", "#resource-events tbody"]) render($(id), []);
    }
    throw e;
  }
  const facts = [
    ["Held", d.view.held ? "yes" : "no"],
    ["Holder", dash(d.lease && d.lease.holder)],
    ["Current token", d.lease ? d.lease.fencing_token : "—"],
    ["Lease digest", d.lease ? d.lease.lease_digest : "—"],
    ["Time left", d.lease ? fmtLeft(d.lease.expires_at_ms - d.now_ms) : "—"],
    ["Highest token issued", d.last_token],
    ["Highest token admitted by a proxy", d.admitted],
    ["Next token deferred until", d.reissue_at_ms ? fmtTime(d.reissue_at_ms) : "—"],
  ];
  render($("#resource-facts"), facts.map(([k, v]) => el("div", {}, el("dt", {}, k), el("dd", {}, v))));
  render($("#resource-queue"), [
    listOr(
      "ol",
      d.queue.map((w) => el("li", {}, `${dash(w.holder)} — waits until ${fmtTime(w.deadline_ms)}, ttl ${w.ttl_ms} ms`)),
      "Nobody waits.",
    ),
  ]);
  render($("#resource-grants"), [
    listOr(
      "ul",
      d.grants.map((g) => el("li", {}, `proxy ${g.proxy}: token ${g.fencing_token} until ${fmtTime(g.until_ms)}`)),
      "None live.",
    ),
  ]);
  render(
    $("#resource-events tbody"),
    d.events.length
      ? d.events
          .slice()
          .reverse()
          .map((e) => el("tr", {}, el("td", {}, fmtTime(e.at_ms)), el("td", {}, e.kind), el("td", {}, dash(e.fencing_token)), el("td", {}, e.outcome)))
      : [el("tr", {}, el("td", { colSpan: 4, class: "empty" }, "This node has seen no calls or fence decisions for this resource; other nodes keep their own."))],
  );
}

// ---- hot ----------------------------------------------------------------------------------

async function refreshHot() {
  const h = await getJson("/v1/admin/hot?limit=10");
  const lists = [
    ["By acquire rate (per s, last minute)", h.by_acquire_rate, (v) => v.toFixed(2)],
    ["By wait time (ms, moving average)", h.by_wait_ms, (v) => v.toFixed(0)],
    ["By queue depth", h.by_queue_depth, (v) => v],
    ["By fencing rejections (last minute)", h.by_fence_rejections, (v) => v],
  ];
  render(
    $("#hot-lists"),
    lists.map(([title, entries, fmt], i) =>
      el(
        "section",
        { class: "card" },
        el("h3", {}, title),
        listOr(
          "ol",
          entries.map((e) =>
            el(
              "li",
              {},
              // A resource may be in several lists: the key names the list too.
              el("a", { href: `#resource/${encodeURIComponent(e.resource)}`, "data-focus-key": `${i} ${e.resource}` }, e.resource),
              ` — ${fmt(e.value)}`,
            ),
          ),
          "Nothing yet.",
        ),
      ),
    ),
  );
}

// ---- quotas -------------------------------------------------------------------------------

const pct = (f) => `${(f * 100).toFixed(0)} %`;

/** A table in a box of its own that scrolls sideways on a narrow screen, not the page. */
const scrolling = (table) => el("div", { class: "scroll" }, table);

async function refreshQuotas() {
  const l = await getJson("/v1/admin/quotas");
  setText($("#quota-rebalances"), l.rebalances);
  render(
    $("#quota-list"),
    l.quotas.length
      ? l.quotas.map((q) =>
          el(
            "section",
            { class: "card quota", "data-quota": q.name },
            el("h3", {}, q.name),
            el(
              "p",
              { class: "quota-def" },
              `R = ${q.rate_per_s}/s · B = ${q.burst} · lease ${q.lease_ms} ms · ${q.policy}` +
                (q.policy === "emergency" ? ` (E = ${q.allowance} per proxy)` : "") +
                (q.set_at_run_time ? " · set at run time" : " · from the proxies' config"),
            ),
            el("h4", {}, "Per tenant"),
            scrolling(
              el(
                "table",
                {},
                el("thead", {}, el("tr", {}, ...["Tenant", "Leased of R", "Demand of R"].map((h) => el("th", { scope: "col" }, h)))),
                el(
                  "tbody",
                  {},
                  ...(q.tenants.length
                    ? q.tenants.map((t) => el("tr", {}, el("td", {}, t.tenant), el("td", {}, pct(t.leased_fraction)), el("td", {}, pct(t.demand_fraction))))
                    : [el("tr", {}, el("td", { colSpan: 3, class: "empty" }, "no tenant has used it recently"))]),
                ),
              ),
            ),
            el("h4", {}, "Shares per proxy (the leases that count now)"),
            scrolling(
              el(
                "table",
                {},
                el("thead", {}, el("tr", {}, ...["Tenant", "Proxy", "Rate share /s", "Burst share", "Leases", "Until", "Demand /s"].map((h) => el("th", { scope: "col" }, h)))),
                el(
                  "tbody",
                  {},
                  ...(q.shares.length
                    ? q.shares.map((s) =>
                        el(
                          "tr",
                          {},
                          el("td", {}, s.tenant),
                          el("td", {}, `node ${s.proxy}`),
                          el("td", {}, s.rate_per_s.toFixed(1)),
                          el("td", {}, s.burst.toFixed(1)),
                          el("td", {}, s.leases),
                          el("td", {}, fmtTime(s.expires_at_ms)),
                          el("td", {}, s.demand_per_s.toFixed(1)),
                        ),
                      )
                    : [el("tr", {}, el("td", { colSpan: 7, class: "empty" }, "no shares leased now"))]),
                ),
              ),
            ),
          ),
        )
      : [el("p", { class: "empty" }, "No quota is defined yet: a proxy defines its configured quotas when it first limits a request.")],
  );
}

// ---- charts -------------------------------------------------------------------------------

async function refreshSeries() {
  const S = state.series;
  const r = await getJson(`/v1/admin/series?since=${S.last}`);
  S.samples.push(...r.samples);
  if (S.samples.length > 600) S.samples.splice(0, S.samples.length - 600);
  if (r.samples.length) S.last = r.samples[r.samples.length - 1].at_ms;
  S.elections = r.elections;
  if (state.view === "charts") drawCharts();
}

const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];

/** A line chart in inline SVG: one polyline per series, dashed verticals at elections. */
function lineChart(title, series, unit) {
  const W = 560, H = 180, L = 48, B = 20, T = 8, R = 8;
  const all = series.flatMap((s) => s.points);
  const t0 = all.length ? Math.min(...all.map((p) => p[0])) : 0;
  const t1 = all.length ? Math.max(...all.map((p) => p[0])) : 1;
  const vmax = Math.max(0, ...all.map((p) => p[1])) || 1;
  const x = (t) => L + ((t - t0) / Math.max(1, t1 - t0)) * (W - L - R);
  const y = (v) => H - B - (v / vmax) * (H - B - T);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  const latest = series.map((s) => `${s.name} ${s.points.length ? s.points[s.points.length - 1][1].toFixed(2) : "—"}`).join(", ");
  svg.setAttribute("aria-label", `${title}; latest: ${latest} ${unit}`);
  const add = (tag, attrs, text) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    svg.append(e);
  };
  add("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, class: "axis" });
  add("line", { x1: L, y1: T, x2: L, y2: H - B, class: "axis" });
  add("text", { x: L - 4, y: T + 10, "text-anchor": "end", class: "tick" }, vmax.toPrecision(3));
  add("text", { x: L - 4, y: H - B, "text-anchor": "end", class: "tick" }, "0");
  if (all.length) {
    add("text", { x: L, y: H - 4, class: "tick" }, fmtClock(t0));
    add("text", { x: W - R, y: H - 4, "text-anchor": "end", class: "tick" }, fmtClock(t1));
  } else {
    add("text", { x: (L + W) / 2, y: H / 2, "text-anchor": "middle", class: "tick" }, "no data yet");
  }
  for (const e of state.series.elections) {
    if (e.at_ms < t0 || e.at_ms > t1) continue;
    add("line", { x1: x(e.at_ms), y1: T, x2: x(e.at_ms), y2: H - B, class: "election" });
    // Labels near the right edge grow leftwards, so they stay inside the chart.
    const right = x(e.at_ms) > (L + W) / 2;
    add(
      "text",
      { x: x(e.at_ms) + (right ? -3 : 3), y: T + 10, "text-anchor": right ? "end" : "start", class: "tick" },
      `election → node ${e.leader_id}`,
    );
  }
  series.forEach((s, i) => {
    if (!s.points.length) return;
    add("polyline", {
      points: s.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "),
      fill: "none",
      stroke: COLORS[i % COLORS.length],
      "stroke-width": 1.5,
    });
  });
  const legend = el(
    "ul",
    { class: "legend" },
    ...series.map((s, i) => el("li", { style: `--c:${COLORS[i % COLORS.length]}` }, s.name)),
  );
  return el("figure", { class: "card chart" }, el("figcaption", {}, `${title} (${unit})`), svg, legend);
}

function drawCharts() {
  const S = state.series.samples;
  const pts = (f) => S.map((s) => [s.at_ms, f(s)]);
  const lat = (op) =>
    ["p50", "p95", "p99"].map((q) => ({
      name: `${op} ${q}`,
      points: S.filter((s) => s.latency[op] && s.latency[op].count > 0).map((s) => [s.at_ms, s.latency[op][`${q}_ms`]]),
    }));
  const fenceKeys = [...new Set(S.flatMap((s) => Object.keys(s.fence)))].sort();
  render($("#charts-grid"), [
    lineChart("Acquire latency", lat("acquire"), "ms"),
    lineChart("Renew latency", lat("renew"), "ms"),
    lineChart("Release latency", lat("release"), "ms"),
    lineChart("Commits per second", [{ name: "applied entries/s", points: pts((s) => s.commits_per_s) }], "1/s"),
    lineChart(
      "Active locks and waiters",
      [
        { name: "active locks", points: pts((s) => s.active_locks) },
        { name: "waiters", points: pts((s) => s.waiters) },
      ],
      "count",
    ),
    lineChart(
      "Fence decisions by outcome/reason",
      fenceKeys.map((k) => ({ name: k, points: pts((s) => s.fence[k] || 0) })),
      "per s",
    ),
  ]);
}

// ---- audit --------------------------------------------------------------------------------

async function refreshAudit() {
  const q = new URLSearchParams({
    resource: $("#audit-resource").value.trim(),
    outcome: $("#audit-outcome").value.trim(),
    caller: $("#audit-caller").value.trim(),
    holder: $("#audit-holder").value.trim(),
    limit: "200",
  });
  const t = await getJson(`/v1/admin/audit?${q}`);
  render(
    $("#audit-table tbody"),
    t.entries
      .slice()
      .reverse()
      .map((e) =>
        el(
          "tr",
          { "data-op": e.op },
          el("td", {}, fmtTime(e.time_ms)),
          el("td", {}, e.node_id),
          el("td", {}, e.op),
          el("td", {}, dash(e.resource)),
          el("td", {}, dash(e.lease_digest)),
          el("td", {}, dash(e.token)),
          el("td", { class: "caller" }, dash(e.caller)),
          el("td", { class: "holder" }, dash(e.holder)),
          el("td", { class: "outcome" }, e.outcome),
          el("td", {}, dash(e.detail)),
        ),
      ),
  );
}

// ---- actions ------------------------------------------------------------------------------

/** Asks for confirmation in a modal dialog; resolves true only on "Do it". */
function confirmAction(text) {
  const d = $("#confirm");
  $("#confirm-text").textContent = text;
  return new Promise((resolve) => {
    d.addEventListener("close", () => resolve(d.returnValue === "yes"), { once: true });
    d.returnValue = "";
    d.showModal();
  });
}

// What a successful action's answer says: its JSON body.
async function jsonAnswer(r, what) {
  const answer = await r.json().catch(() => ({}));
  return `Done (${r.status}): ${what} — ${JSON.stringify(answer)}`;
}

// A backup's answer is the file: handed to the browser as a download.
async function backupAnswer(r) {
  const index = r.headers.get("fencegate-backup-index");
  const blob = await r.blob();
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `fencegate-${index}.backup`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 60_000);
  return `Done (${r.status}): backup of log index ${index}, ${blob.size} bytes, saved as ${link.download}`;
}

async function runAction(what, path, body, out = $("#action-result"), done = jsonAnswer) {
  if (!(await confirmAction(what))) {
    out.textContent = `Cancelled: ${what}`;
    return;
  }
  out.textContent = `Working: ${what}…`;
  sessionStorage.setItem("fencegate-operator", $("#operator").value);
  const headers = { "Content-Type": "application/json", ...credential() };
  try {
    const r = await fetch(path, {
      method: "POST",
      headers,
      body: JSON.stringify({ operator: $("#operator").value.trim(), ...body }),
    });
    out.dataset.status = r.status;
    if (r.ok) {
      out.textContent = await done(r, what);
    } else {
      const answer = await r.json().catch(() => ({}));
      out.textContent = `Refused (${r.status} ${answer.error || ""}): ${answer.message || r.statusText}`;
    }
  } catch (e) {
    out.dataset.status = "network";
    out.textContent = `Failed: ${e.message}`;
  }
  refresh();
}

// ---- idempotency keys with an unknown outcome ---------------------------------------------

// The cursors of the pages before the one shown (empty: the first page), and the next one's.
const idemPages = [];
let idemNext = null;

function wireIdempotencyPages() {
  $("#idem-next").addEventListener("click", () => {
    if (idemNext) {
      idemPages.push(idemNext);
      refreshIdempotency();
    }
  });
  $("#idem-first").addEventListener("click", () => {
    idemPages.length = 0;
    refreshIdempotency();
  });
}

// The last refusal of the list for want of a credential ({ token, at }) while it holds: it is
// asked again with another credential, or after DENIED_RETRY_MS (see heldBack).
let idemDenied = null;

/** A time as a <time> element, with the date when it is not today. */
const when = (ms) => (ms ? el("time", { dateTime: new Date(ms).toISOString() }, fmtTime(ms)) : "—");

async function refreshIdempotency() {
  const note = $("#idem-note");
  const tbody = $("#idem-table tbody");
  if (!typedToken()) {
    setText(note, "Enter the admin token above to list the keys.");
    render(tbody, []);
    return;
  }
  if (heldBack(idemDenied)) return;
  idemDenied = null;
  const after = idemPages.at(-1);
  const query = `limit=50${after ? `&after=${encodeURIComponent(after)}` : ""}`;
  const r = await fetchRead(`/v1/admin/idempotency/unknown?${query}`);
  const page = await r.json().catch(() => ({}));
  if (!r.ok) {
    const e = new ApiError(r.status, page, r.statusText);
    if (e.denied) idemDenied = { token: typedToken(), at: Date.now() };
    setText(note, `Cannot list (${e.status} ${e.code}): ${e.detail}`);
    render(tbody, []);
    $("#idem-next").disabled = true;
    return;
  }
  idemNext = page.next || null;
  $("#idem-next").disabled = !idemNext;
  $("#idem-first").disabled = idemPages.length === 0;
  const pageNo = idemPages.length + 1;
  setText(
    note,
    page.records.length === 0
      ? pageNo === 1
        ? "No key has an unknown outcome."
        : `Page ${pageNo}: no more keys.`
      : `Page ${pageNo}: ${page.records.length} key(s)${idemNext ? "; more on the next page" : ""}.`,
  );
  render(
    tbody,
    page.records.map((rec) => {
      const name = `key ${rec.key} of tenant ${rec.tenant} on ${rec.route}`;
      const resolve = (resolution, label, cls) =>
        el(
          "button",
          {
            type: "button",
            class: `resolve-${resolution} ${cls}`,
            "data-focus-key": JSON.stringify([resolution, rec.tenant, rec.route, rec.key]),
            onclick: () =>
              runAction(
                `resolve ${name} as "${label}"`,
                "/v1/admin/idempotency/resolve",
                { tenant: rec.tenant, route: rec.route, key: rec.key, attempt: rec.attempt, resolution },
                $("#idem-result"),
              ),
          },
          `${label}…`,
        );
      return el(
        "tr",
        { "data-key": rec.key, "data-tenant": rec.tenant },
        el("td", {}, rec.tenant),
        el("td", {}, rec.route),
        el("td", { class: "key" }, rec.key),
        el("td", {}, rec.attempt),
        el("td", {}, when(rec.created_ms)),
        el("td", {}, when(rec.expires_at_ms)),
        el("td", { class: "row" }, resolve("succeeded", "It ran", ""), resolve("never_ran", "It never ran", "danger")),
      );
    }),
  );
}

function forceRelease(resource) {
  const path = `/v1/admin/force-release/${encodeURIComponent(resource)}`;
  return runAction(`force release of ${resource}`, path, {});
}

function wireActions() {
  $("#operator").value = sessionStorage.getItem("fencegate-operator") || "";
  const on = (id, f) =>
    $(id).addEventListener("submit", (ev) => {
      ev.preventDefault();
      f();
    });
  on("#form-force", () => forceRelease($("#fr-resource").value.trim()));
  on("#form-drain", () => runAction("drain the leader (another voter takes over)", "/v1/admin/drain", {}));
  on("#form-snapshot", () => runAction("take a snapshot on this node", "/v1/admin/snapshot", {}));
  on("#form-backup", () =>
    runAction("download a backup of the cluster's state", "/v1/admin/backup", {}, $("#action-result"), backupAnswer),
  );
  on("#form-add", () =>
    runAction(`add node ${$("#add-id").value} at ${$("#add-addr").value}`, "/v1/admin/members/add", {
      node_id: Number($("#add-id").value),
      addr: $("#add-addr").value.trim(),
      peer_addr: $("#add-peer").value.trim(),
    }),
  );
  on("#form-remove", () =>
    runAction(`remove node ${$("#remove-id").value}`, "/v1/admin/members/remove", { node_id: Number($("#remove-id").value) }),
  );
  $("#resource-force").addEventListener("click", () => {
    $("#fr-resource").value = state.resource;
    location.hash = "#actions";
    forceRelease(state.resource);
  });
}

// ---- polling ------------------------------------------------------------------------------

// One refresh at a time; a request made meanwhile (a click) runs right after it.
let busy = false;
let again = false;
async function refresh() {
  if (busy) {
    again = true;
    return;
  }
  // Refused for want of an admin key: asking again each second would only write a refusal a
  // second to the audit log (86,400 lines a day per open tab). The banner says what to do.
  if (heldBack(state.denied)) return;
  busy = true;
  try {
    await refreshOverview();
    await refreshSeries();
    if (state.view === "locks") await refreshLocks();
    if (state.view === "resource" && state.resource) await refreshResource();
    if (state.view === "hot") await refreshHot();
    if (state.view === "quotas") await refreshQuotas();
    if (state.view === "audit") await refreshAudit();
    if (state.view === "idempotency") await refreshIdempotency();
    state.denied = null;
    state.lastOk = Date.now();
    showError(null);
  } catch (e) {
    if (e instanceof ApiError && e.denied) {
      state.denied = { token: typedToken(), at: Date.now() };
      state.readsNeedKey = true;
      placeCredential();
    } else {
      state.denied = null;
    }
    showError(e);
  } finally {
    busy = false;
  }
  if (again) {
    again = false;
    refresh();
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("#lock-search").addEventListener("submit", (ev) => {
    ev.preventDefault();
    state.locks.prefix = $("#prefix").value.trim();
    state.locks.pages = [null];
    state.locks.page = 0;
    refresh();
  });
  $("#page-size").addEventListener("change", () => {
    state.locks.pages = [null];
    state.locks.page = 0;
    refresh();
  });
  $("#next-page").addEventListener("click", () => {
    if (state.locks.pages[state.locks.page + 1]) {
      state.locks.page += 1;
      refresh();
    }
  });
  $("#prev-page").addEventListener("click", () => {
    if (state.locks.page > 0) {
      state.locks.page -= 1;
      refresh();
    }
  });
  $("#audit-filters").addEventListener("submit", (ev) => {
    ev.preventDefault();
    refresh();
  });
  // The skip link moves focus to the main content of the view shown; followed as a link, its
  // "#main" would be routed like a view's address.
  $(".skip").addEventListener("click", (ev) => {
    ev.preventDefault();
    $("#main").focus();
  });
  $("#admin-token").addEventListener("input", () => {
    typedAt = performance.now();
  });
  wireActions();
  wireIdempotencyPages();
  window.addEventListener("hashchange", route);
  route();
  setInterval(refresh, POLL_MS);
  setInterval(tickCountdown, 250);
});
