"use strict";
// The status page's renderer. Everything it shows comes from the daemon
// (/status, /events), and backend reasons and event texts can hold any
// text a backend sent: it builds the DOM with createElement and
// textContent only, never an HTML-parsing property, and the Trusted Types
// policy in its CSP would refuse one anyway.
const REFRESH_MS = 2000;
const MAX_EVENTS = 25;
let lastSeq = 0;
let events = [];
let eventsNote = "";

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function td(text, cls) { return el("td", cls, text); }

function num(x, digits) {
  return x === null || x === undefined ? "-" : Number(x).toFixed(digits);
}

function when(ms) {
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function badge(state) {
  const b = el("span", "st st-" + state, state);
  return b;
}

function table(headings, rows) {
  const t = el("table");
  const head = el("tr");
  for (const h of headings) head.append(el("th", null, h));
  t.append(head);
  for (const r of rows) t.append(r);
  return t;
}

// The reason an operator wants first: what the policy says (for a down
// backend, the failing probe's text), else a failing probe, else the last
// transition's.
function backendReason(b) {
  if (b.placement_reason) return b.placement_reason;
  if (b.last_probe && !b.last_probe.ok) return b.last_probe.reason;
  return b.last_transition_reason || "";
}

function backendRow(vip, b) {
  const tr = el("tr", "backend");
  tr.dataset.vip = vip.name;
  tr.dataset.backend = b.address;
  tr.dataset.state = b.state;
  const state = td(null, "state");
  state.append(badge(b.state));
  const probe = b.last_probe;
  tr.append(
    td(b.address, "address"),
    state,
    td(b.placement, "placement"),
    td(num(b.effective_weight, 2) + " / " + b.weight, "num weight"),
    td(probe ? num(probe.latency_ms, 1) : "-", "num latency"),
    td(num(b.packets_per_sec, 1), "num pps"),
    td(num(b.new_flows_per_sec, 1), "num nfps"),
    td(b.flows === null || b.flows === undefined ? "-" : b.flows, "num flows"),
    td(backendReason(b), "reason"),
  );
  return tr;
}

function vipState(v) {
  if (v.panic) return "panic";
  if (v.backends_up === 0) return "down";
  return v.backends_up < v.backends_total ? "degraded" : "up";
}

function vipSection(v) {
  const sec = el("section", "vip");
  sec.dataset.vip = v.name;
  const h = el("h2");
  h.append(
    el("span", "name", v.name + " "),
    badge(vipState(v)),
    el("span", "meta", " " + v.address + ":" + v.port + "/" + v.protocol + " " + v.mode +
      ", " + v.backends_up + " of " + v.backends_total + " backends up, " +
      num(v.packets_per_sec, 1) + " packets/s, " + num(v.new_flows_per_sec, 1) + " new flows/s"),
  );
  sec.append(h);
  const notes = [];
  if (v.panic_reason) notes.push("panic: " + v.panic_reason);
  if (v.fleet_slow) notes.push("fleet slow: " + v.fleet_slow);
  if (v.announce) notes.push("announce: " + v.announce.state + " (" + v.announce.reason + ")");
  for (const n of notes) sec.append(el("p", "note", n));
  sec.append(table(
    ["backend", "state", "placement", "weight (effective / configured)", "last probe ms",
      "packets/s", "new flows/s", "established flows", "reason"],
    v.backends.map((b) => backendRow(v, b)),
  ));
  return sec;
}

function summary(s) {
  const ct = s.conntrack;
  const drops = Object.entries(s.counters)
    .filter(([k, n]) => k.startsWith("drop_") && n > 0)
    .map(([k, n]) => k + " " + n);
  document.getElementById("summary").textContent =
    "instance " + s.instance + " on " + s.interface + " (" + s.xdp_mode + "), started " +
    when(s.started_unix_ms) + "; conntrack " + ct.entries + " of " + ct.capacity +
    (ct.established === null || ct.established === undefined ? "" : ", " + ct.established + " established") +
    "; drops: " + (drops.length ? drops.join(", ") : "none");
}

function eventRow(e) {
  const tr = el("tr", "event");
  tr.dataset.seq = e.seq;
  const change = e.from || e.to ? (e.from || "") + " → " + (e.to || "") : "";
  tr.append(
    td(e.seq, "num"), td(when(e.at_unix_ms)), td(e.kind), td(e.vip || ""),
    td(e.backend || ""), td(change), td(e.reason, "reason"),
  );
  return tr;
}

function renderEvents() {
  const box = document.getElementById("events");
  const parts = [];
  if (eventsNote) parts.push(el("p", "note", eventsNote));
  if (events.length) {
    parts.push(table(["seq", "at", "kind", "vip", "backend", "change", "reason"],
      events.slice().reverse().map(eventRow)));
  } else if (!eventsNote) {
    parts.push(el("p", "note", "no events yet"));
  }
  box.replaceChildren(...parts);
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store", credentials: "omit" });
  if (!r.ok) {
    const err = new Error(path + " answered " + r.status);
    err.status = r.status;
    throw err;
  }
  return r.json();
}

async function refreshEvents() {
  try {
    const got = await getJson("/events?since=" + lastSeq);
    for (const e of got) {
      if (e.seq > lastSeq) lastSeq = e.seq;
      events.push(e);
    }
    events = events.slice(-MAX_EVENTS);
    eventsNote = "";
  } catch (e) {
    eventsNote = e.status === 404 ? "this daemon does not serve events (GET /events)" :
      "events: " + e.message;
  }
  renderEvents();
}

async function refresh() {
  const stamp = document.getElementById("updated");
  try {
    const s = await getJson("/status");
    const list = document.createDocumentFragment();
    for (const v of s.vips) list.append(vipSection(v));
    document.getElementById("vips").replaceChildren(list);
    summary(s);
    stamp.className = "meta";
    stamp.textContent = "updated " + new Date().toLocaleTimeString() + ", every " + REFRESH_MS / 1000 + " s";
  } catch (e) {
    stamp.className = "stale";
    stamp.textContent = "not updated: " + e.message + " (showing the last status read)";
  }
  await refreshEvents();
  setTimeout(refresh, REFRESH_MS);
}

refresh();
