// Pickup's web page: plain JavaScript, no build step. It follows the daemon's event stream
// (a snapshot first, then every change) and calls the API with the bearer token.
"use strict";

const api = "/api/v1";
const downloads = new Map();   // id -> download, as the API shows it
const rows = new Map();        // id -> its <li>
const dirty = new Set();
let totals = null;
let settings = null;
let token = localStorage.getItem("pickup-token") || "";
let stream = null;
let drawScheduled = false;
let arranged = false;          // whether the rows' order and filter still hold
let folded = false;            // whether the add form was folded (or not) after the first snapshot

// The list's view: sort key and direction, the state and text filters (kept across visits).
const defaultView = { sort: "added", desc: true, state: "", text: "" };
let view = { ...defaultView };
try { view = { ...defaultView, ...JSON.parse(localStorage.getItem("pickup-view") || "{}") }; } catch (e) { /* reset */ }

// The speed of the last 60 seconds, one sample a second: in total, and per download.
const historyLength = 61;
const totalHistory = [];
const histories = new Map();   // id -> [bytes per second]

const $ = (id) => document.getElementById(id);

function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function formatRate(n) { return formatBytes(n) + "/s"; }

// A limit as a person set it: "200 KiB/s", "1.5 MiB/s" (no trailing ".0").
function formatLimit(n) {
  const unit = limitUnit(n);
  return String(+(n / unit).toFixed(2)) + (unit === 1024 ? " KiB/s" : " MiB/s");
}

// The unit a limit is shown in: MiB/s from 1 MiB/s up, else KiB/s.
function limitUnit(n) { return n >= 1048576 ? 1048576 : 1024; }

// A limit input and its unit select, from bytes per second (nil: empty, unit kept).
function showLimit(input, select, n) {
  if (document.activeElement === input || document.activeElement === select) return;
  if (n == null) { input.value = ""; return; }
  const unit = limitUnit(n);
  select.value = String(unit);
  input.value = String(+(n / unit).toFixed(2));
}

// Bytes per second from a limit input and its unit (empty or 0: no limit).
function readLimit(input, select) {
  const text = input.value.trim();
  if (text === "" || !(Number(text) > 0)) return null;
  return Math.round(Number(text) * Number(select.value));
}

function formatDuration(s) {
  s = Math.round(s);
  if (s >= 3600) return Math.floor(s / 3600) + " h " + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + " min";
  if (s >= 60) return Math.floor(s / 60) + " min " + String(s % 60).padStart(2, "0") + " s";
  return s + " s";
}

function formatDate(seconds) {
  return new Date(seconds * 1000).toLocaleString();
}

// Until the server has named the file: the URL's last path segment.
function displayName(d) {
  if (d.name) return d.name;
  try {
    const u = new URL(d.url);
    const parts = u.pathname.split("/").filter(Boolean);
    return parts.length ? decodeURIComponent(parts[parts.length - 1]) : u.host;
  } catch (e) {
    return d.url;
  }
}

async function call(method, path, body) {
  const headers = { "Authorization": "Bearer " + token };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(api + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  if (response.status === 401) { showLogin("The token was not accepted."); throw new Error("unauthorized"); }
  if (!response.ok) {
    let message = response.statusText;
    try { message = (await response.json()).error.message; } catch (e) { /* not JSON */ }
    throw new Error(message);
  }
  return response.status === 204 ? null : response.json();
}

function setStatus(text, live) {
  $("status").textContent = text;
  $("status").classList.toggle("live", !!live);
}

// MARK: - Token

function showLogin(message) {
  if (stream) { stream.abort(); stream = null; }
  $("app").hidden = true;
  $("login").hidden = false;
  $("token-error").hidden = !message;
  $("token-error").textContent = message || "";
  setStatus("not connected");
}

$("token-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  token = $("token").value.trim();
  localStorage.setItem("pickup-token", token);
  start();
});

// MARK: - Events

async function follow() {
  const controller = new AbortController();
  stream = controller;
  try {
    const response = await fetch(api + "/events", { headers: { "Authorization": "Bearer " + token }, signal: controller.signal });
    if (response.status === 401) { showLogin("The token was not accepted."); return; }
    if (!response.ok) throw new Error(response.statusText);
    setStatus("live", true);
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        let name = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event:")) name = line.slice(6).trim();
          else if (line.startsWith("data:")) data += line.slice(5).trim();
        }
        if (data) handle(name, JSON.parse(data));
      }
    }
  } catch (e) {
    if (controller.signal.aborted) return;
  }
  if (stream !== controller) return;
  // The daemon went away (restart?): try again; the next snapshot puts everything right.
  setStatus("reconnecting…");
  setTimeout(() => { if (stream === controller) follow(); }, 2000);
}

function handle(name, data) {
  switch (name) {
    case "snapshot":
      downloads.clear();
      rows.clear();
      $("downloads").replaceChildren();
      for (const d of data.downloads) { downloads.set(d.id, d); dirty.add(d.id); }
      totals = data.totals;
      // The add form takes room the list needs once there is a list: folded (once; then it
      // stays as the user leaves it).
      if (!folded) { folded = true; $("add-panel").open = downloads.size === 0; }
      break;
    case "added":
    case "changed":
      downloads.set(data.id, data); dirty.add(data.id);
      break;
    case "progress": {
      const d = downloads.get(data.id);
      // A field a progress event leaves out is gone (stallTimeout once the server is quick
      // again, limitedBy once the limit no longer holds it).
      if (d) { Object.assign(d, { stallTimeout: undefined, limitedBy: undefined }, data); dirty.add(d.id); }
      break;
    }
    case "totals": totals = data; break;
    case "removed":
      downloads.delete(data.id); histories.delete(data.id); dirty.add(data.id);
      break;
  }
  scheduleDraw();
}

// MARK: - Drawing

function scheduleDraw() {
  if (drawScheduled) return;
  drawScheduled = true;
  requestAnimationFrame(draw);
}

function draw() {
  drawScheduled = false;
  const list = $("downloads");
  for (const id of dirty) {
    const d = downloads.get(id);
    let li = rows.get(id);
    if (!d) { if (li) { li.remove(); rows.delete(id); } continue; }
    if (!li) {
      li = makeItem(id);
      rows.set(id, li);
      list.append(li);
    }
    drawItem(li, d);
  }
  if (dirty.size) arranged = false;
  dirty.clear();
  if (!arranged) arrange();
  drawTotals();
}

function makeItem(id) {
  const li = $("item").content.firstElementChild.cloneNode(true);
  li.dataset.id = id;
  const on = (c, f) => li.querySelector(c).addEventListener("click", f);
  on(".pause", () => act("POST", `/downloads/${id}/pause`));
  on(".resume", () => act("POST", `/downloads/${id}/resume`));
  on(".retry", () => act("POST", `/downloads/${id}/retry`));
  const change = (body) => act("PATCH", `/downloads/${id}`, body);
  on(".up", () => change({ priority: (downloads.get(id)?.priority ?? 0) + 1 }));
  on(".down", () => change({ priority: (downloads.get(id)?.priority ?? 0) - 1 }));
  on(".front", () => change({ position: "front" }));
  const limit = li.querySelector(".item-limit"), unit = li.querySelector(".item-limit-unit");
  const setLimit = () => change({ speedLimit: readLimit(limit, unit) });
  limit.addEventListener("change", setLimit);
  unit.addEventListener("change", () => { if (limit.value.trim() !== "") setLimit(); });
  on(".remove", () => askToRemove(id));
  on(".more", () => {
    const panel = li.querySelector(".more-panel");
    panel.hidden = !panel.hidden;
    li.querySelector(".more").setAttribute("aria-expanded", String(!panel.hidden));
    const d = downloads.get(id);
    if (d && !panel.hidden) { drawFacts(li, d); drawGraph(li.querySelector(".item-graph"), histories.get(id) || []); }
  });
  return li;
}

// Why a running download goes at the speed it does, when something other than the server's
// plain speed holds it: the user's limit (its own or the global one), or a server or
// connection so slow that a connection waits longer than usual for its data.
function why(d) {
  if (d.state === "running") {
    if (d.limitedBy === "download" && d.speedLimit != null) return `Held to its own speed limit, ${formatLimit(d.speedLimit)}`;
    if (d.limitedBy === "global") {
      const limit = settings?.speedLimit;
      return "Held to the global speed limit" + (limit != null ? `, ${formatLimit(limit)} for all downloads together` : "");
    }
    if (d.stallTimeout != null) {
      return `The server or the connection to it is slow: waiting up to ${formatDuration(d.stallTimeout)} for its data`;
    }
  }
  if (d.state === "waiting" && settings && !settings.startsAllAtOnce) {
    const n = settings.maxConcurrentDownloads;
    return `Waiting its turn: ${n} download${n === 1 ? "" : "s"} run at once`;
  }
  return "";
}

function drawItem(li, d) {
  li.className = "item " + d.state;
  li.querySelector(".name").textContent = displayName(d);
  li.querySelector(".name").title = d.url;
  const state = li.querySelector(".state");
  state.textContent = d.state;
  state.className = "state " + d.state;
  const fraction = d.state === "completed" ? 1 : (d.fraction ?? 0);
  li.querySelector(".bar").style.width = (fraction * 100).toFixed(1) + "%";
  const parts = [];
  if (d.fraction != null) parts.push((d.fraction * 100).toFixed(1) + " %");
  parts.push(formatBytes(d.bytesDone) + (d.totalBytes != null ? " of " + formatBytes(d.totalBytes) : ""));
  if (d.state === "running") {
    parts.push(formatRate(d.bytesPerSecond));
    if (d.secondsLeft != null) parts.push(formatDuration(d.secondsLeft) + " left");
  }
  if (d.speedLimit != null && d.state !== "completed") parts.push("limit " + formatLimit(d.speedLimit));
  li.querySelector(".numbers").textContent = parts.join(" · ");
  const said = li.querySelector(".why");
  said.textContent = why(d);
  said.classList.toggle("slow", d.state === "running" && d.stallTimeout != null && !d.limitedBy);
  li.querySelector(".pause").hidden = !(d.state === "running" || d.state === "waiting");
  li.querySelector(".resume").hidden = d.state !== "paused";
  li.querySelector(".retry").hidden = d.state !== "failed";
  li.querySelector(".reason").textContent = d.error ? d.error.message : "";
  li.querySelector(".priority").textContent = d.priority ? `priority ${d.priority}` : "";
  const waiting = d.state === "waiting" || d.state === "paused";
  li.querySelector(".front").hidden = !waiting;
  const finished = d.state === "completed" || d.state === "failed";
  for (const c of [".up", ".down"]) li.querySelector(c).hidden = finished;
  li.querySelector(".limit-row").hidden = finished;
  showLimit(li.querySelector(".item-limit"), li.querySelector(".item-limit-unit"), d.speedLimit);
  if (!li.querySelector(".more-panel").hidden) drawFacts(li, d);
}

// The details: what the API says of it beyond the row.
function drawFacts(li, d) {
  const facts = [];
  const add = (term, value) => { if (value != null && value !== "") facts.push([term, value]); };
  add("URL", d.url);
  if (d.mirrors?.length) add("Mirrors", d.mirrors);
  add("File", d.name ? d.name + " (in the download folder)" : "not named yet (the server names it)");
  if (d.totalBytes != null) add("Size", formatBytes(d.totalBytes) + ` (${d.totalBytes.toLocaleString()} bytes)`);
  add("Connections", d.connections != null ? `up to ${d.connections} (its own setting)` : "the daemon's setting");
  add("Speed limit", d.speedLimit != null ? formatLimit(d.speedLimit) + " (its own)" : "none of its own");
  if (settings?.speedLimit != null) add("Global limit", formatLimit(settings.speedLimit) + " for all downloads together");
  add("Priority", String(d.priority));
  add("Checksum", d.checksum);
  if (d.headers?.length) add("Headers sent", d.headers.join(", ") + " (values not shown)");
  add("Added", formatDate(d.addedAt));
  if (d.finishedAt != null) add(d.state === "failed" ? "Failed" : "Finished", formatDate(d.finishedAt));
  if (d.error) add("Error", `${d.error.code}: ${d.error.message}`);
  const dl = li.querySelector(".facts");
  dl.replaceChildren();
  for (const [term, value] of facts) {
    const dt = document.createElement("dt");
    dt.textContent = term;
    const dd = document.createElement("dd");
    if (Array.isArray(value)) {
      const ul = document.createElement("ul");
      for (const v of value) { const item = document.createElement("li"); item.textContent = v; ul.append(item); }
      dd.append(ul);
    } else {
      dd.textContent = value;
    }
    dt.dataset.fact = term;
    dl.append(dt, dd);
  }
}

// MARK: - Sorting and filtering

const stateOrder = { running: 0, waiting: 1, paused: 2, failed: 3, completed: 4 };
const sortKeys = {
  added: (d) => d.addedAt,
  name: (d) => displayName(d).toLocaleLowerCase(),
  progress: (d) => d.state === "completed" ? 1 : (d.fraction ?? -1),
  speed: (d) => d.state === "running" ? d.bytesPerSecond : -1,
  state: (d) => stateOrder[d.state] ?? 5,
};
// The direction a key starts in when chosen: names A to Z and states as they run, the rest highest first.
const ascendingKeys = new Set(["name", "state"]);

function matches(d) {
  if (view.state && d.state !== view.state) return false;
  const text = view.text.trim().toLocaleLowerCase();
  if (!text) return true;
  return [displayName(d), d.url, ...(d.mirrors || [])].some((s) => s.toLocaleLowerCase().includes(text));
}

// Puts the rows in the view's order, hides those the filters leave out.
function arrange() {
  arranged = true;
  const key = sortKeys[view.sort] || sortKeys.added;
  const sign = view.desc ? -1 : 1;
  const all = [...downloads.values()];
  all.sort((a, b) => {
    const x = key(a), y = key(b);
    if (x < y) return -sign;
    if (x > y) return sign;
    return b.id - a.id;   // then newest first
  });
  const list = $("downloads");
  let shown = 0;
  let at = list.firstElementChild;
  for (const d of all) {
    const li = rows.get(d.id);
    if (!li) continue;
    li.hidden = !matches(d);
    if (!li.hidden) shown++;
    if (li !== at) list.insertBefore(li, at); else at = at.nextElementSibling;
  }
  const filtered = view.state !== "" || view.text.trim() !== "";
  $("toolbar").hidden = downloads.size === 0;
  $("shown").textContent = filtered ? `${shown} of ${downloads.size} shown` : "";
  $("empty").hidden = shown > 0;
  $("empty").textContent = downloads.size === 0 ? "No downloads yet." : "No download matches the filter.";
}

function showView() {
  $("sort").value = view.sort;
  $("sort-direction").textContent = view.desc ? "↓" : "↑";
  $("sort-direction").title = view.desc ? "Descending (click for ascending)" : "Ascending (click for descending)";
  $("filter-state").value = view.state;
  if (document.activeElement !== $("filter-text")) $("filter-text").value = view.text;
}

function changeView(change) {
  Object.assign(view, change);
  localStorage.setItem("pickup-view", JSON.stringify(view));
  showView();
  arrange();
}

$("sort").addEventListener("change", () => changeView({ sort: $("sort").value, desc: !ascendingKeys.has($("sort").value) }));
$("sort-direction").addEventListener("click", () => changeView({ desc: !view.desc }));
$("filter-state").addEventListener("change", () => changeView({ state: $("filter-state").value }));
$("filter-text").addEventListener("input", () => changeView({ text: $("filter-text").value }));

// MARK: - Totals and the speed graph

function drawTotals() {
  if (!totals) return;
  const c = totals.counts;
  const parts = [`${c.running} running`, `${c.waiting} waiting`, `${c.paused} paused`, `${c.completed} done`];
  if (c.failed) parts.push(`${c.failed} failed`);
  let text = parts.join(" · ");
  if (totals.bytesPerSecond > 0) text += " — " + formatRate(totals.bytesPerSecond);
  if (totals.secondsLeft != null) text += ", " + formatDuration(totals.secondsLeft) + " left";
  $("totals-text").textContent = text;
  $("totals-bar").style.width = ((totals.fraction ?? 0) * 100).toFixed(1) + "%";
}

// A graph of `samples` (bytes per second, one a second, the newest last) in a <figure>: an SVG
// drawn here, no library; its scale and the speed now as text with their units.
function drawGraph(figure, samples) {
  if (!figure.firstChild) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("viewBox", `0 0 ${historyLength - 1} 100`);
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("aria-hidden", "true");
    const area = document.createElementNS(ns, "polygon");
    area.setAttribute("class", "area");
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("class", "line");
    svg.append(area, line);
    const caption = document.createElement("figcaption");
    caption.append(document.createElement("span"), document.createElement("span"));
    figure.append(caption, svg);
  }
  const peak = Math.max(0, ...samples);
  const top = peak > 0 ? peak * 1.15 : 1;
  const start = historyLength - samples.length;
  const points = samples.map((v, i) => `${start + i},${(100 - v / top * 100).toFixed(1)}`);
  figure.querySelector(".line").setAttribute("points", points.join(" "));
  figure.querySelector(".area").setAttribute("points",
    points.length ? `${start},100 ${points.join(" ")} ${historyLength - 1},100` : "");
  const [now, scale] = figure.querySelectorAll("figcaption span");
  now.textContent = samples.length ? "now " + formatRate(samples[samples.length - 1]) : "speed";
  scale.textContent = `peak ${formatRate(peak)} · last 60 s`;
}

function push(samples, value) {
  samples.push(value);
  if (samples.length > historyLength) samples.shift();
}

// Once a second: the speeds the events last said, into the histories, and the graphs redrawn.
function sample() {
  if ($("app").hidden || !totals) return;
  push(totalHistory, totals.bytesPerSecond || 0);
  for (const d of downloads.values()) {
    const samples = histories.get(d.id);
    if (d.state === "running") {
      if (samples) push(samples, d.bytesPerSecond); else histories.set(d.id, [d.bytesPerSecond]);
    } else if (samples) {
      push(samples, 0);
      if (samples.every((v) => v === 0)) histories.delete(d.id);
    }
  }
  drawGraph($("total-graph"), totalHistory);
  for (const li of $("downloads").querySelectorAll(".more-panel:not([hidden])")) {
    drawGraph(li.querySelector(".item-graph"), histories.get(Number(li.parentElement.dataset.id)) || []);
  }
}
setInterval(sample, 1000);

// Removing asks first, and deletes nothing on disk unless ticked: a finished file stays, and an
// unfinished download's partial file stays (a later download of the same URL to the same place
// resumes it) unless "Delete the partial file too" is ticked.
function askToRemove(id) {
  const d = downloads.get(id);
  if (!d) return;
  const dialog = $("remove-dialog");
  const finished = d.state === "completed";
  const done = d.fraction != null && d.state !== "completed" ? ` at ${(d.fraction * 100).toFixed(0)} %` : "";
  $("remove-text").textContent = finished
    ? `Remove ${displayName(d)} from the list? The file stays on disk.`
    : `Remove ${displayName(d)} (${d.state}${done}) from the list? Its partial file stays on disk unless you tick below.`;
  $("remove-partial-row").hidden = finished;
  $("remove-partial").checked = false;
  dialog.dataset.id = String(id);
  dialog.returnValue = "";
  dialog.showModal();
}

$("remove-dialog").addEventListener("close", () => {
  const dialog = $("remove-dialog");
  if (dialog.returnValue !== "remove") return;
  const partial = !$("remove-partial-row").hidden && $("remove-partial").checked;
  act("DELETE", `/downloads/${dialog.dataset.id}` + (partial ? "?deletePartial=true" : ""));
});

async function act(method, path, body) {
  try { await call(method, path, body); } catch (e) { setStatus(e.message); }
}

// MARK: - Forms

$("add-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const urls = $("urls").value.split("\n").map((s) => s.trim()).filter((s) => s && !s.startsWith("#"));
  const headers = {};
  for (const line of $("headers").value.split("\n")) {
    const colon = line.indexOf(":");
    if (colon > 0) headers[line.slice(0, colon).trim()] = line.slice(colon + 1).trim();
  }
  const agent = $("user-agent").value.trim();
  if (agent) headers["User-Agent"] = agent;
  const failed = [];
  let error = "";
  // Mirrors: one download from every line (each line its own server); else one download a line.
  const items = $("as-mirrors").checked && urls.length > 1 ? [urls] : urls.map((u) => [u]);
  for (const [url, ...mirrors] of items) {
    const body = { url };
    if (mirrors.length) body.urls = mirrors;
    if (Object.keys(headers).length) body.headers = headers;
    try { await call("POST", "/downloads", body); } catch (err) { failed.push(url, ...mirrors); error = err.message; }
  }
  $("urls").value = failed.join("\n");
  $("add-error").hidden = failed.length === 0;
  $("add-error").textContent = failed.length ? `${failed.length} not added: ${error}` : "";
});

async function changeSettings(body) {
  try { showSettings(await call("PATCH", "/settings", body)); } catch (err) { setStatus(err.message); }
}

$("limit-form").addEventListener("submit", (e) => {
  e.preventDefault();
  const body = { speedLimit: readLimit($("limit"), $("limit-unit")) };
  if ($("jobs").value) body.maxConcurrentDownloads = Number($("jobs").value);
  changeSettings(body);
});

$("pause-all").addEventListener("click", () => act("POST", "/pause-all"));
$("resume-all").addEventListener("click", () => act("POST", "/resume-all"));
$("clear-completed").addEventListener("click", () => act("DELETE", "/downloads?state=completed"));
$("order").addEventListener("change", () => changeSettings({ order: $("order").value }));
$("all-at-once").addEventListener("change", () => changeSettings({ startsAllAtOnce: $("all-at-once").checked }));

function showSettings(s) {
  settings = s;
  showLimit($("limit"), $("limit-unit"), s.speedLimit);
  $("jobs").value = s.maxConcurrentDownloads;
  $("order").value = s.order;
  $("all-at-once").checked = s.startsAllAtOnce;
  const parts = [s.speedLimit == null ? "no limit" : "limit " + formatLimit(s.speedLimit),
    s.startsAllAtOnce ? "all at once" : `${s.maxConcurrentDownloads} at once`,
    s.order === "lifo" ? "last added first" : "first added first"];
  $("settings-summary").textContent = parts.join(" · ");
  // What the rows say of limits and turns depends on the settings.
  for (const id of downloads.keys()) dirty.add(id);
  scheduleDraw();
}

async function start() {
  if (!token) { showLogin(); return; }
  try {
    showSettings(await call("GET", "/settings"));
  } catch (e) {
    if (e.message !== "unauthorized") setStatus(e.message);
    return;
  }
  $("login").hidden = true;
  $("app").hidden = false;
  showView();
  follow();
}

start();
