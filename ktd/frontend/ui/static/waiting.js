// ktd dashboard: the requests waiting for their engine at this frontend (issue 46), per
// model and key: what each waits for, its place in the model's line and its ETA.

K.waiting = {};

K.waiting.phaseText = function (w) {
  let text = w.phase;
  if (w.phase === "room" && w.waiting_for) text += ": " + w.waiting_for.join(", ") + " to go idle";
  else if (w.detail) text += ": " + w.detail;
  if (w.percent !== undefined && w.percent !== null) text += ` ${w.percent}%`;
  return text;
};

// data: {data: [{model, key, request_id, phase, position, queued, waited, eta, ...}]}
K.waiting.render = function (root, data) {
  const h = K.h;
  const rows = ((data && data.data) || []).slice();
  rows.sort((a, b) => (a.model < b.model ? -1 : a.model > b.model ? 1 : 0)
    || (a.position || 1e9) - (b.position || 1e9));
  if (!rows.length) {
    root.replaceChildren(h("p", { class: "muted" }, "No request is waiting."));
    return;
  }
  const groups = new Map();
  for (const w of rows) {
    const id = w.model + "\u0000" + w.key;
    groups.set(id, (groups.get(id) || 0) + 1);
  }
  const summary = h("p", { class: "muted" }, [...groups.entries()].map(([id, n]) => {
    const [model, key] = id.split("\u0000");
    return `${model} · ${K.usage.keyName(key)}: ${n}`;
  }).join("; "));
  const table = h("table", { class: "waiting", "data-rows": rows.length },
    h("thead", {}, h("tr", {}, ["model", "key", "phase", "place", "waited", "ETA", "request"]
      .map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.map((w) => h("tr", {
      "data-model": w.model, "data-key": w.key, "data-phase": w.phase,
      "data-position": w.position, "data-eta": w.eta === null ? "" : w.eta,
    },
    h("td", {}, w.model), h("td", {}, K.usage.keyName(w.key)),
    h("td", {}, K.waiting.phaseText(w)),
    h("td", {}, w.position ? `${w.position} of ${w.queued}` : "–"),
    h("td", {}, K.fmtDuration(w.waited)),
    h("td", {}, w.eta === null || w.eta === undefined ? "–" : "~" + K.fmtDuration(w.eta)),
    h("td", { class: "mono" }, w.request_id || "")))));
  root.replaceChildren(summary, table);
};
