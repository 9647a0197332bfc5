// ktd dashboard: shared helpers. Everything lives under one global, K.
"use strict";
const K = {};

// Every URL is computed from the page's own address, so the dashboard works at /ui,
// /ui/, under a reverse proxy's prefix and behind a unix: bind alike.
K.BASE = location.pathname.replace(/\/*$/, "/");
K.api = (path) => K.BASE + path;

K.SVG = "http://www.w3.org/2000/svg";
// Tableau 10: distinct on dark and light backgrounds; a model keeps its colour (config order).
K.PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2",
  "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"];
K.colour = (i) => K.PALETTE[((i % K.PALETTE.length) + K.PALETTE.length) % K.PALETTE.length];

// Build an element: h("div", {class: "x", onclick: f, style: {width: "3px"}}, children...).
// Styles go through the CSSOM (the page's CSP allows no inline style attributes).
K.h = function h(tag, props, ...kids) {
  const svg = tag.startsWith("svg:");
  const el = svg ? document.createElementNS(K.SVG, tag.slice(4)) : document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "style") Object.assign(el.style, v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    el.append(kid instanceof Node ? kid : String(kid));
  }
  return el;
};

// The server's wall clock: every message carries "now"; the page counts from it.
K.clockOffset = 0;
K.setServerNow = (now) => { if (typeof now === "number") K.clockOffset = now - Date.now() / 1000; };
K.now = () => Date.now() / 1000 + K.clockOffset;

K.fmtBytes = function (n) {
  if (n === null || n === undefined) return "?";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return (v >= 100 || i === 0 ? v.toFixed(0) : v.toFixed(1)) + " " + units[i];
};

K.fmtDuration = function (s) {
  if (s === null || s === undefined || !isFinite(s)) return "–";
  s = Math.max(0, Math.round(s));
  const d = Math.floor(s / 86400), hr = Math.floor((s % 86400) / 3600);
  const m = Math.floor((s % 3600) / 60), sec = s % 60;
  const two = (x) => String(x).padStart(2, "0");
  if (d) return `${d}d ${two(hr)}h`;
  if (hr) return `${hr}h ${two(m)}m`;
  if (m) return `${m}m ${two(sec)}s`;
  return `${sec}s`;
};

K.fmtNum = function (v, unit) {
  if (v === null || v === undefined || !isFinite(v)) return "–";
  if (v === 0) return unit ? `0 ${unit}` : "0";
  const a = Math.abs(v);
  const text = a >= 100 ? v.toFixed(0) : a >= 10 ? v.toFixed(1) : a >= 1 ? v.toFixed(2) : v.toFixed(3);
  return unit ? `${text} ${unit}` : text;
};

K.fmtSeconds = (v) => (v === null || v === undefined ? "–" : v === 0 ? "0" : v < 1
  ? `${(v * 1000).toFixed(0)} ms` : `${v.toFixed(2)} s`);

// ``control``: with the page's own header, which what only ui_control allows wants.
K.getJSON = async function (path, control) {
  const headers = control ? { "X-Ktd-UI": "1" } : {};
  const r = await fetch(K.api(path), { credentials: "same-origin", cache: "no-store", headers });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  return { status: r.status, ok: r.ok, body };
};

K.postJSON = async function (path, payload) {
  const r = await fetch(K.api(path), {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Ktd-UI": "1" },
    body: JSON.stringify(payload || {}),
  });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  return { status: r.status, ok: r.ok, body };
};

K.errorText = (res) => (res.body && res.body.error && res.body.error.message) || `HTTP ${res.status}`;

let toastTimer = null;
K.toast = function (text, bad) {
  const el = document.getElementById("toast");
  el.textContent = text;
  el.classList.toggle("bad", !!bad);
  el.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { el.hidden = true; }, bad ? 8000 : 4000);
};
