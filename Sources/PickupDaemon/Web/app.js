// Pickup's web page: plain JavaScript, no build step. It follows the daemon's event stream
// (a snapshot first, then every change) and calls the API with the bearer token.
"use strict";

const api = "/api/v1";
const downloads = new Map();   // id -> download, as the API shows it
const dirty = new Set();
let totals = null;
let token = localStorage.getItem("pickup-token") || "";
let stream = null;
let drawScheduled = false;

const $ = (id) => document.getElementById(id);

function formatBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i === 0 ? n.toFixed(0) : n.toFixed(1)) + " " + units[i];
}

function formatDuration(s) {
  s = Math.round(s);
  if (s >= 3600) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  if (s >= 60) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return s + "s";
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
      $("downloads").replaceChildren();
      for (const d of data.downloads) { downloads.set(d.id, d); dirty.add(d.id); }
      totals = data.totals;
      break;
    case "added":
    case "changed":
      downloads.set(data.id, data); dirty.add(data.id);
      break;
    case "progress": {
      const d = downloads.get(data.id);
      // A field a progress event leaves out is gone (stallTimeout once the server is quick again).
      if (d) { Object.assign(d, { stallTimeout: undefined }, data); dirty.add(d.id); }
      break;
    }
    case "totals": totals = data; break;
    case "removed":
      downloads.delete(data.id); dirty.add(data.id);
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
    let li = list.querySelector(`li[data-id="${id}"]`);
    if (!d) { if (li) li.remove(); continue; }
    if (!li) {
      li = $("item").content.firstElementChild.cloneNode(true);
      li.dataset.id = id;
      li.querySelector(".pause").addEventListener("click", () => act("POST", `/downloads/${id}/pause`));
      li.querySelector(".resume").addEventListener("click", () => act("POST", `/downloads/${id}/resume`));
      li.querySelector(".retry").addEventListener("click", () => act("POST", `/downloads/${id}/retry`));
      const change = (body) => act("PATCH", `/downloads/${id}`, body);
      li.querySelector(".up").addEventListener("click", () => change({ priority: (downloads.get(id)?.priority ?? 0) + 1 }));
      li.querySelector(".down").addEventListener("click", () => change({ priority: (downloads.get(id)?.priority ?? 0) - 1 }));
      li.querySelector(".front").addEventListener("click", () => change({ position: "front" }));
      li.querySelector(".item-limit").addEventListener("change", (e) => {
        const text = e.target.value.trim();
        change({ speedLimit: text === "" || Number(text) <= 0 ? null : Math.round(Number(text) * 1048576) });
      });
      li.querySelector(".remove").addEventListener("click", () => askToRemove(id));
      // Newest first.
      const next = [...list.children].find((other) => Number(other.dataset.id) < id);
      list.insertBefore(li, next || null);
    }
    drawItem(li, d);
  }
  dirty.clear();
  $("empty").hidden = downloads.size > 0;
  drawTotals();
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
    parts.push(formatBytes(d.bytesPerSecond) + "/s");
    if (d.secondsLeft != null) parts.push(formatDuration(d.secondsLeft) + " left");
    if (d.stallTimeout != null) parts.push("slow server: waiting up to " + formatDuration(d.stallTimeout) + " for data");
  }
  li.querySelector(".numbers").textContent = parts.join(" · ");
  li.querySelector(".pause").hidden = !(d.state === "running" || d.state === "waiting");
  li.querySelector(".resume").hidden = d.state !== "paused";
  li.querySelector(".retry").hidden = d.state !== "failed";
  li.querySelector(".reason").textContent = d.error ? d.error.message : "";
  li.querySelector(".priority").textContent = d.priority ? `priority ${d.priority}` : "";
  const waiting = d.state === "waiting" || d.state === "paused";
  li.querySelector(".front").hidden = !waiting;
  const finished = d.state === "completed" || d.state === "failed";
  for (const c of [".up", ".down", ".item-limit"]) li.querySelector(c).hidden = finished;
  const limit = li.querySelector(".item-limit");
  if (document.activeElement !== limit) limit.value = d.speedLimit == null ? "" : String(+(d.speedLimit / 1048576).toFixed(2));
}

function drawTotals() {
  if (!totals) return;
  const c = totals.counts;
  const parts = [`${c.running} running`, `${c.waiting} waiting`, `${c.paused} paused`, `${c.completed} done`];
  if (c.failed) parts.push(`${c.failed} failed`);
  let text = parts.join(" · ");
  if (totals.bytesPerSecond > 0) text += " — " + formatBytes(totals.bytesPerSecond) + "/s";
  if (totals.secondsLeft != null) text += ", " + formatDuration(totals.secondsLeft) + " left";
  $("totals-text").textContent = text;
  $("totals-bar").style.width = ((totals.fraction ?? 0) * 100).toFixed(1) + "%";
}

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

$("limit-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const text = $("limit").value.trim();
  const body = { speedLimit: text === "" || Number(text) <= 0 ? null : Math.round(Number(text) * 1048576) };
  if ($("jobs").value) body.maxConcurrentDownloads = Number($("jobs").value);
  try { showSettings(await call("PATCH", "/settings", body)); } catch (err) { setStatus(err.message); }
});

$("pause-all").addEventListener("click", () => act("POST", "/pause-all"));
$("resume-all").addEventListener("click", () => act("POST", "/resume-all"));
$("clear-completed").addEventListener("click", () => act("DELETE", "/downloads?state=completed"));

async function changeSettings(body) {
  try { showSettings(await call("PATCH", "/settings", body)); } catch (err) { setStatus(err.message); }
}
$("order").addEventListener("change", () => changeSettings({ order: $("order").value }));
$("all-at-once").addEventListener("change", () => changeSettings({ startsAllAtOnce: $("all-at-once").checked }));

function showSettings(s) {
  $("limit").value = s.speedLimit == null ? "" : String(+(s.speedLimit / 1048576).toFixed(2));
  $("jobs").value = s.maxConcurrentDownloads;
  $("order").value = s.order;
  $("all-at-once").checked = s.startsAllAtOnce;
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
  follow();
}

start();
