// ktd dashboard: the plots, hand-drawn SVG (no library).

K.plots = {};

// Round numbers for an axis from 0 to about max.
K.plots.ticks = function (max) {
  if (!(max > 0)) return [0, 1];
  const step0 = max / 3;
  const mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) || 10 * mag;
  const out = [];
  for (let v = 0; v <= max * 1.0001 + step; v += step) { out.push(v); if (v >= max) break; }
  return out;
};

// Seconds before "now" to label on a time axis spanning ``span`` seconds (at most 5 labels).
K.plots.timeTicks = function (span) {
  const step = [10, 30, 60, 120, 300, 600, 900].find((s) => span / s <= 4) || 900;
  const out = [];
  for (let ago = 0; ago <= span + 0.001; ago += step) out.push(ago);
  return out.reverse();
};

const PLOT_W = 600, PLOT_H = 170, PAD_L = 52, PAD_R = 10, PAD_T = 10, PAD_B = 22;

// lines: [{colour, label, points: [[t, value|null], ...]}] over [t0, t1].
K.plots.line = function (lines, t0, t1, format, metric) {
  const h = K.h;
  let max = 0;
  for (const l of lines) for (const [, v] of l.points) if (v !== null && v > max) max = v;
  const ticks = K.plots.ticks(max);
  const top = ticks[ticks.length - 1] || 1;
  const x = (t) => PAD_L + ((t - t0) / (t1 - t0)) * (PLOT_W - PAD_L - PAD_R);
  const y = (v) => PLOT_H - PAD_B - (v / top) * (PLOT_H - PAD_T - PAD_B);
  const svg = h("svg:svg", { viewBox: `0 0 ${PLOT_W} ${PLOT_H}`, role: "img", "data-metric": metric });
  for (const v of ticks) {
    svg.append(h("svg:line", { class: "axis", x1: PAD_L, x2: PLOT_W - PAD_R, y1: y(v), y2: y(v) }));
    svg.append(h("svg:text", { class: "tick", x: PAD_L - 6, y: y(v) + 3, "text-anchor": "end" }, format(v)));
  }
  for (const ago of K.plots.timeTicks(t1 - t0)) {
    svg.append(h("svg:text", { class: "tick", x: x(t1 - ago), y: PLOT_H - 6, "text-anchor": "middle" },
      ago ? `-${ago >= 60 ? ago / 60 + "m" : ago + "s"}` : "now"));
  }
  for (const l of lines) {
    // A null is a gap (no reading): the line is broken there, never drawn through.
    let d = "";
    let pen = false;
    let drawn = 0;
    for (const [t, v] of l.points) {
      if (v === null || t < t0) { pen = false; continue; }
      d += `${pen ? "L" : "M"}${x(t).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
      drawn += 1;
    }
    if (drawn === 1) d += "h2";
    if (d) {
      svg.append(h("svg:path", { d, fill: "none", stroke: l.colour, "stroke-width": 1.8,
        "stroke-linejoin": "round", "data-alias": l.label, "data-points": drawn }));
    }
  }
  return svg;
};

// groups: [{colour, label, values: [seconds, ...]}]: recent load durations per model.
K.plots.bars = function (groups) {
  const h = K.h;
  let max = 0;
  for (const g of groups) for (const v of g.values) max = Math.max(max, v);
  const ticks = K.plots.ticks(max);
  const top = ticks[ticks.length - 1] || 1;
  const y = (v) => PLOT_H - PAD_B - (v / top) * (PLOT_H - PAD_T - PAD_B);
  const svg = h("svg:svg", { viewBox: `0 0 ${PLOT_W} ${PLOT_H}`, role: "img", "data-metric": "loads" });
  for (const v of ticks) {
    svg.append(h("svg:line", { class: "axis", x1: PAD_L, x2: PLOT_W - PAD_R, y1: y(v), y2: y(v) }));
    svg.append(h("svg:text", { class: "tick", x: PAD_L - 6, y: y(v) + 3, "text-anchor": "end" },
      K.fmtDuration(v)));
  }
  const slots = groups.reduce((n, g) => n + g.values.length + 1, 0) || 1;
  const w = Math.min((PLOT_W - PAD_L - PAD_R) / slots, 36);
  let i = 0.5;
  for (const g of groups) {
    const start = i;
    for (const v of g.values) {
      svg.append(h("svg:rect", { x: PAD_L + i * w, y: y(v), width: Math.max(w * 0.8, 1),
        height: Math.max(PLOT_H - PAD_B - y(v), 0.5), fill: g.colour, "data-alias": g.label },
      h("svg:title", {}, `${g.label}: ${K.fmtDuration(v)}`)));
      i += 1;
    }
    svg.append(h("svg:text", { class: "tick", x: PAD_L + ((start + i) / 2) * w, y: PLOT_H - 6,
      "text-anchor": "middle" }, g.label));
    i += 1;
  }
  return svg;
};

K.plots.legend = function (entries) {
  return K.h("div", { class: "legend" },
    entries.map((e) => K.h("span", {}, K.h("i", { style: { background: e.colour } }), e.label)));
};

// The whole plots panel: requests/s, tokens/s, TTFT per model, and the load durations.
// The time axis is the last hour, or less while the frontend has not been up that long.
K.plots.render = function (root, models, series, loads, interval) {
  const h = K.h;
  const t1 = K.now();
  let first = t1;
  for (const points of Object.values(series)) if (points.length) first = Math.min(first, points[0][0]);
  const t0 = Math.max(t1 - 3600, Math.min(first - interval, t1 - 60));
  const served = models.filter((m) => m.served);
  const lines = (col) => served.map((m) => ({
    colour: K.colour(m.colour),
    label: m.alias,
    points: (series[m.alias] || []).map((p) => [p[0], p[col]]),
  }));
  const legend = K.plots.legend(served.map((m) => ({ colour: K.colour(m.colour), label: m.alias })));
  const charts = [
    ["Requests / s (frontend)", 1, (v) => K.fmtNum(v), "rps"],
    ["Tokens / s (engine)", 2, (v) => K.fmtNum(v), "tps"],
    ["Time to first byte (frontend)", 3, K.fmtSeconds, "ttft"],
    ["Time to first token (engine)", 4, K.fmtSeconds, "engine_ttft"],
  ];
  root.replaceChildren(
    ...charts.map(([title, col, fmt, metric]) => h("div", { class: "plot" },
      h("h3", {}, title), K.plots.line(lines(col), t0, t1, fmt, metric), legend.cloneNode(true))),
    h("div", { class: "plot" }, h("h3", {}, "Load durations (recent, from the load history)"),
      K.plots.bars(served.filter((m) => (loads[m.alias] || []).length)
        .map((m) => ({ colour: K.colour(m.colour), label: m.alias, values: loads[m.alias] })))),
  );
};
