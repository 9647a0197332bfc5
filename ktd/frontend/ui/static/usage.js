// ktd dashboard: the usage ledger (ktd's, every frontend's): per key and model, per day.

K.usage = {};

// Days from ``since`` (YYYY-MM-DD, UTC) on, ``count`` of them.
K.usage.days = function (since, count) {
  const start = Date.parse(since + "T00:00:00Z");
  const out = [];
  for (let i = 0; i < count; i += 1) out.push(new Date(start + i * 86400000).toISOString().slice(0, 10));
  return out;
};

// Stacked bars, one per day, a segment per key: stacks = {day: {key: value}}.
K.usage.bars = function (days, keys, colours, stacks, format, metric) {
  const h = K.h;
  const W = 600, H = 170, L = 52, R = 10, T = 10, B = 22;
  let max = 0;
  for (const d of days) max = Math.max(max, keys.reduce((s, k) => s + ((stacks[d] || {})[k] || 0), 0));
  const ticks = K.plots.ticks(max);
  const top = ticks[ticks.length - 1] || 1;
  const y = (v) => H - B - (v / top) * (H - T - B);
  const w = (W - L - R) / Math.max(days.length, 1);
  const svg = h("svg:svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "data-metric": metric });
  for (const v of ticks) {
    svg.append(h("svg:line", { class: "axis", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    svg.append(h("svg:text", { class: "tick", x: L - 6, y: y(v) + 3, "text-anchor": "end" }, format(v)));
  }
  days.forEach((d, i) => {
    let base = 0;
    for (const k of keys) {
      const v = (stacks[d] || {})[k] || 0;
      if (!v) continue;
      svg.append(h("svg:rect", { x: L + i * w + w * 0.1, y: y(base + v), width: Math.max(w * 0.8, 1),
        height: Math.max(y(base) - y(base + v), 0.5), fill: colours[k], "data-key": k, "data-day": d,
        "data-value": v }, h("svg:title", {}, `${d} · ${K.usage.keyName(k)}: ${format(v)}`)));
      base += v;
    }
    if (i % 7 === days.length % 7 || i === days.length - 1) {
      svg.append(h("svg:text", { class: "tick", x: L + (i + 0.5) * w, y: H - 6, "text-anchor": "middle" },
        d.slice(5)));
    }
  });
  return svg;
};

K.usage.keyName = (k) => k || "(no key)";

// The panel: tokens and requests per day by key, and per key and model over the period.
K.usage.render = function (root, data) {
  const h = K.h;
  if (!data) { root.replaceChildren(h("p", { class: "muted" }, "No usage read yet.")); return; }
  const rows = data.rows || [];
  const days = K.usage.days(data.since, data.days);
  const keys = [...new Set(rows.map((r) => r.key))].sort();
  const colours = {};
  keys.forEach((k, i) => { colours[k] = K.colour(i); });
  const tokens = {}, requests = {}, totals = new Map();
  for (const r of rows) {
    const t = (tokens[r.day] = tokens[r.day] || {});
    t[r.key] = (t[r.key] || 0) + r.prompt + r.completion;
    const q = (requests[r.day] = requests[r.day] || {});
    q[r.key] = (q[r.key] || 0) + r.requests;
    const id = r.key + "\u0000" + r.model;
    const sum = totals.get(id) || { key: r.key, model: r.model, requests: 0, prompt: 0, completion: 0, errors: 0 };
    for (const f of ["requests", "prompt", "completion", "errors"]) sum[f] += r[f];
    totals.set(id, sum);
  }
  const legend = K.plots.legend(keys.map((k) => ({ colour: colours[k], label: K.usage.keyName(k) })));
  const sums = [...totals.values()].sort((a, b) => (b.prompt + b.completion) - (a.prompt + a.completion));
  const num = (n) => n.toLocaleString("en-US");
  const table = h("table", { class: "usage", "data-rows": sums.length },
    h("thead", {}, h("tr", {}, ["key", "model", "requests", "prompt", "completion", "errors"]
      .map((c) => h("th", {}, c)))),
    h("tbody", {}, sums.map((s) => h("tr", { "data-key": s.key, "data-model": s.model },
      h("td", {}, h("i", { class: "swatch", style: { background: colours[s.key] } }), K.usage.keyName(s.key)),
      h("td", {}, s.model), h("td", {}, num(s.requests)), h("td", {}, num(s.prompt)),
      h("td", {}, num(s.completion)), h("td", {}, num(s.errors))))));
  root.replaceChildren(
    h("div", { class: "plot" }, h("h3", {}, "Tokens / day (prompt + completion, as the engines reported)"),
      K.usage.bars(days, keys, colours, tokens, (v) => K.fmtNum(v), "usage_tokens"), legend),
    h("div", { class: "plot" }, h("h3", {}, "Requests / day"),
      K.usage.bars(days, keys, colours, requests, (v) => K.fmtNum(v), "usage_requests"), legend.cloneNode(true)),
    rows.length ? table : h("p", { class: "muted" }, "Nothing used in these days."),
  );
};
