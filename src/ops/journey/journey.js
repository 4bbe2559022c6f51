"use strict";
// The journey page: polls `?format=json&since=N` (bounded: one request at a time, a second
// apart) and draws each followed key's steps in one lane per stage. See src/ops/journey.rs.

const LANES = [
  ["watch", "watch", "client-go Reflector.watchHandler"],
  ["fifo", "FIFO", "client-go RealFIFO.Add / Pop"],
  ["indexer", "indexer", "client-go processDeltas: indexer.Add / Update"],
  ["handlers", "handlers", "client-go processorListener.run: OnAdd / OnUpdate"],
  ["workqueue", "workqueue", "controller-runtime priorityqueue.AddWithOpts; client-go Add / AddAfter / AddRateLimited"],
  ["worker", "worker", "controller-runtime Controller.processNextWorkItem (queue.Get)"],
  ["reconcile", "reconcile", "controller-runtime Controller.reconcileHandler: Reconcile"],
  ["writes", "writes", "controller-runtime client.Status().Update, client.Patch"],
];
const STAGES = {
  watch_event: ["watch", "watch event"],
  fifo_queued: ["fifo", "fifo queued"],
  fifo_popped: ["fifo", "fifo popped"],
  indexer_stored: ["indexer", "indexer stored"],
  handler_delivered: ["handlers", "handler called"],
  queue_added: ["workqueue", "workqueue add"],
  queue_deduplicated: ["workqueue", "workqueue dedup"],
  queue_while_processing: ["workqueue", "workqueue add (busy)"],
  queue_delayed: ["workqueue", "workqueue add_after"],
  queue_rate_limited: ["workqueue", "workqueue rate-limited"],
  worker_took: ["worker", "worker took key"],
  freshness_held: ["worker", "held for freshness"],
  reconcile_started: ["reconcile", "reconcile started"],
  reconcile_finished: ["reconcile", "reconcile finished"],
  status_written: ["writes", "status written"],
  finalizer_written: ["writes", "finalizer patch"],
};
const WAIT_OF = {
  queue_added: "in_line",
  queue_deduplicated: "in_line",
  queue_while_processing: "busy",
  queue_delayed: "delay",
  queue_rate_limited: "rate_limit",
};
const WAIT_WORDS = {
  in_line: "in line",
  busy: "waiting for the busy worker",
  delay: "add_after delay",
  rate_limit: "rate-limit delay",
  freshness: "held for freshness",
};
const RING = 512, LANE_H = 34, PAD = 16, MIN_DX = 6, PX_PER_MS = 24, MAX_DX = 200,
  CUT_MS = 100, CUT_W = 48, HISTORY = 120, POLL_MS = 1000;

const wanted = new URLSearchParams(location.search).get("key");
const state = { next: 0, keys: new Map(), history: [], polls: 0, selected: null };

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}
function clock(micros) {
  const d = new Date(micros / 1000);
  return d.toISOString().slice(11, 19) + "." + String(micros % 1e6).padStart(6, "0");
}
function dur(micros) {
  if (micros < 1000) return micros + "µs";
  if (micros < 1e6) return (micros / 1000).toFixed(1) + "ms";
  return (micros / 1e6).toFixed(2) + "s";
}
function problem(words) {
  const p = document.getElementById("problem");
  p.textContent = words;
  p.hidden = false;
  p.dataset.problem = words;
}
function clearProblem() {
  const p = document.getElementById("problem");
  p.hidden = true;
  delete p.dataset.problem;
}

async function poll() {
  const q = new URLSearchParams({ format: "json", since: String(state.next) });
  if (wanted) q.set("key", wanted);
  let resp, text;
  try {
    resp = await fetch(location.pathname + "?" + q, { cache: "no-store" });
    text = await resp.text();
  } catch (e) {
    problem("cannot reach the server: " + e.message);
    return later(POLL_MS * 3);
  }
  if (!resp.ok) {
    problem(resp.status + " " + resp.statusText + ": " + text.trim());
    // A client error (an unfollowed key, no --trace, a saved trace that does not parse) stays
    // what it is; a server error may pass.
    if (resp.status >= 500) later(POLL_MS * 3);
    else setStatus(false);
    return;
  }
  let data;
  try {
    data = JSON.parse(text);
  } catch (e) {
    problem("the server sent a trace that does not parse: " + e.message);
    setStatus(false);
    return;
  }
  clearProblem();
  state.polls++;
  merge(data);
  const started = performance.now();
  render(data);
  document.body.dataset.renderMs = (performance.now() - started).toFixed(1);
  setStatus(data.live);
  if (data.live) later(POLL_MS);
}
function later(ms) {
  setTimeout(poll, ms);
}
function setStatus(live) {
  const s = document.getElementById("status");
  s.dataset.live = String(!!live);
  s.dataset.polls = String(state.polls);
  s.textContent = live ? `live (poll ${state.polls})` : "not live";
}

function merge(data) {
  state.next = data.next;
  for (const k of data.keys) {
    const steps = (state.keys.get(k.key) || []).concat(k.steps);
    state.keys.set(k.key, steps.slice(Math.max(0, steps.length - RING)));
  }
  state.history.push({ at: Date.now(), queues: data.queues || [] });
  if (state.history.length > HISTORY) state.history.shift();
}

function render(data) {
  const src = document.getElementById("source");
  src.textContent = data.source;
  src.dataset.source = data.source;
  const main = document.getElementById("keys");
  main.replaceChildren();
  if (state.keys.size === 0) {
    problem("no key is followed: start the controller with --trace namespace/name");
  }
  for (const [key, steps] of state.keys) main.append(renderKey(key, steps));
  if (data.more_keys > 0) main.append(el("p", "help", `… and ${data.more_keys} more followed keys (open ?key=namespace/name)`));
  renderQueues(data);
}

// x of each step: gaps under CUT_MS at PX_PER_MS (at least MIN_DX), longer ones cut.
function layout(steps) {
  const xs = [], cuts = [];
  let x = PAD;
  steps.forEach((s, i) => {
    if (i > 0) {
      const gap = s.mono_micros - steps[i - 1].mono_micros;
      if (gap > CUT_MS * 1000) {
        cuts.push({ x: x + CUT_W / 2, gap });
        x += CUT_W;
      } else {
        x += Math.min(MAX_DX, Math.max(MIN_DX, (gap / 1000) * PX_PER_MS));
      }
    }
    xs.push(x);
  });
  return { xs, cuts, width: x + PAD * 4 };
}

function laneY(lane) {
  return LANES.findIndex((l) => l[0] === lane) * LANE_H + LANE_H / 2;
}

// Reconciles, waits and the links from a reconcile to the watch events its writes caused.
function analyse(steps) {
  const writer = steps.find((s) => s.stage === "status_written" || s.stage === "finalizer_written");
  const first = steps.find((s) => s.stage === "watch_event");
  const primary = writer ? writer.kind : first ? first.kind : "";
  const reconciles = [], waits = [], links = [];
  const rvReconcile = new Map();
  const ownEvents = [];
  let open = null, queued = null, took = null, last = null;
  steps.forEach((s, i) => {
    const rv = (/rv=(\d+)/.exec(s.detail) || [])[1];
    switch (s.stage) {
      case "reconcile_started":
        open = { from: i, to: null, id: "r" + i, took };
        reconciles.push(open);
        last = open;
        break;
      case "reconcile_finished":
        if (open) open.to = i;
        open = null;
        break;
      case "status_written":
      case "finalizer_written":
        if (open && rv) rvReconcile.set(rv, { r: open, write: i });
        break;
      case "worker_took":
        if (queued) waits.push({ from: queued.i, to: i, kind: queued.kind, lane: "workqueue", under: s.detail });
        queued = null;
        took = i;
        break;
      case "freshness_held":
        if (took !== null) waits.push({ from: took, to: i, kind: "freshness", lane: "worker", under: s.detail });
        break;
      case "watch_event":
        if (s.kind === primary && rv) ownEvents.push({ step: i, rv });
        else if (s.kind !== primary && s.detail.startsWith("ADDED") && last) {
          links.push({ step: i, r: last, from: last.from, fromLane: "reconcile", why: "the child it created" });
        }
        break;
      default:
        if (WAIT_OF[s.stage] && !queued) queued = { i, kind: WAIT_OF[s.stage] };
    }
  });
  // The watch event of a status write can arrive before the write's own response: matched by
  // resourceVersion once every write is known.
  for (const { step, rv } of ownEvents) {
    const w = rvReconcile.get(rv);
    if (w) links.push({ step, r: w.r, from: w.write, fromLane: "writes", why: "its own status write" });
  }
  return { primary, reconciles, waits, links };
}

function renderKey(key, steps) {
  const sec = el("section", "key");
  sec.dataset.key = key;
  sec.dataset.steps = String(steps.length);
  sec.append(el("h2", "", `${key}: ${steps.length} steps` + (steps.length >= RING ? " (the newest 512)" : "")));
  if (steps.length === 0) {
    sec.append(el("p", "help", "followed; no step recorded yet (no event for it has reached the controller)"));
    return sec;
  }
  const { xs, cuts, width } = layout(steps);
  const a = analyse(steps);
  const chart = el("div", "chart");
  const labels = el("div", "labels");
  for (const [lane, name, fn] of LANES) {
    const l = el("div", "label");
    l.dataset.lane = lane;
    l.append(el("b", "", name), el("code", "", fn));
    l.title = fn;
    labels.append(l);
  }
  const scroll = el("div", "scroll");
  const plot = el("div", "plot");
  const height = LANES.length * LANE_H;
  plot.style.width = width + "px";
  plot.style.height = height + "px";
  LANES.forEach((l, i) => {
    const lane = el("div", "lane");
    lane.style.top = i * LANE_H + "px";
    plot.append(lane);
  });
  for (const c of cuts) {
    const cut = el("div", "cut", "+" + dur(c.gap));
    cut.style.left = c.x + "px";
    plot.append(cut);
  }
  const bar = (from, to, lane, cls) => {
    const b = el("div", "span " + cls);
    b.style.left = xs[from] + "px";
    b.style.width = Math.max(2, xs[to] - xs[from]) + "px";
    b.style.top = laneY(lane) + "px";
    plot.append(b);
    return b;
  };
  for (const r of a.reconciles) {
    const to = r.to === null ? steps.length - 1 : r.to;
    const b = bar(r.from, to, "reconcile", "reconcile");
    b.dataset.reconcile = r.id;
    b.title = `reconcile ${r.to === null ? "running" : steps[r.to].detail}` + (r.took !== null ? `\nworker: ${steps[r.took].detail}` : "");
  }
  for (const w of a.waits) {
    const b = bar(w.from, w.to, w.lane, w.kind);
    b.dataset.wait = w.kind;
    b.title = `${WAIT_WORDS[w.kind]}: ${dur(steps[w.to].mono_micros - steps[w.from].mono_micros)}\nhanded out under: ${w.under}`;
  }
  const caused = new Map(a.links.map((l) => [l.step, l]));
  steps.forEach((s, i) => {
    const [lane, label] = STAGES[s.stage] || ["watch", s.stage];
    const m = el("div", "mark");
    if (s.kind && s.kind !== a.primary) m.classList.add("child");
    if (s.detail.startsWith("error")) m.classList.add("err");
    m.style.left = xs[i] + "px";
    m.style.top = laneY(lane) + "px";
    m.dataset.step = String(i);
    m.dataset.stage = s.stage;
    m.dataset.lane = lane;
    m.dataset.kind = s.kind;
    const link = caused.get(i);
    if (link) {
      m.dataset.causedBy = link.r.id;
      m.dataset.cause = link.why;
    }
    const prev = i > 0 ? " (+" + dur(s.mono_micros - steps[i - 1].mono_micros) + ")" : "";
    m.title = `${clock(s.at_unix_micros)}${prev}  ${label}  ${s.kind}\n${s.detail}` +
      (link ? `\ncaused by reconcile at ${clock(steps[link.r.from].at_unix_micros)}: ${link.why}` : "");
    m.addEventListener("click", () => pin(key, i, m, lane));
    plot.append(m);
  });
  const lines = svg("svg", { class: "links", width, height });
  for (const l of a.links) {
    const x1 = xs[l.from], y1 = laneY(l.fromLane), x2 = xs[l.step], y2 = laneY("watch");
    const p = svg("path", { d: `M${x1},${y1} C${x1},${y1 - 60} ${x2},${y2 + 60} ${x2},${y2}` });
    p.dataset.fromReconcile = l.r.id;
    p.dataset.toStep = String(l.step);
    lines.append(p);
  }
  plot.append(lines);
  scroll.append(plot);
  chart.append(labels, scroll);
  sec.append(chart);
  return sec;
}

function pin(key, i, mark, lane) {
  const s = state.keys.get(key)[i];
  const d = document.getElementById("detail");
  for (const m of document.querySelectorAll(".mark.sel")) m.classList.remove("sel");
  mark.classList.add("sel");
  const fn = LANES.find((l) => l[0] === lane)[2];
  d.textContent = `${key}, step ${i}\n${mark.title}\n\nmirrors: ${fn}`;
  d.dataset.step = String(i);
  d.hidden = false;
}

function renderQueues(data) {
  const note = document.getElementById("queues-note");
  const box = document.getElementById("queue-chart");
  box.replaceChildren();
  if (!data.live) {
    note.textContent = "A saved trace holds no queue depths.";
    return;
  }
  const series = new Map();
  state.history.forEach((h, t) => {
    for (const q of h.queues) {
      const name = `${q.queue} ${q.by} ${q.label}`;
      if (!series.has(name)) series.set(name, []);
      series.get(name).push([t, q.depth]);
    }
  });
  note.textContent = series.size === 0
    ? "No named queue has reported a depth in this process yet."
    : `Sampled at each poll (the last ${HISTORY}): depth by priority (workqueue_depth on /metrics) and ready items by fairness key (/debug/queue).`;
  if (series.size === 0) return;
  const W = 720, H = 140, max = Math.max(1, ...[...series.values()].flat().map((p) => p[1]));
  const chart = svg("svg", { width: W + 220, height: H + 20 });
  const colors = ["#1565c0", "#ef6c00", "#2e7d32", "#6a1b9a", "#c62828", "#00838f", "#5d4037", "#455a64"];
  let n = 0;
  for (const [name, points] of series) {
    const color = colors[n % colors.length];
    const xy = points.map(([t, d]) => `${10 + (t / Math.max(1, state.history.length - 1)) * W},${10 + H - (d / max) * H}`).join(" ");
    const line = svg("polyline", { points: xy, fill: "none", stroke: color, "stroke-width": 1.5 });
    line.dataset.series = name;
    chart.append(line);
    const label = svg("text", { x: W + 20, y: 20 + n * 13, fill: color });
    label.textContent = `${name}: ${points[points.length - 1][1]}`;
    chart.append(label);
    n++;
  }
  const axis = svg("text", { x: 10, y: 10 });
  axis.textContent = `max ${max}`;
  chart.append(axis);
  box.append(chart);
}

poll();
