// ktd dashboard: the daemon's pull jobs (issue 44), each with a bar: the file being
// fetched, bytes done of the total, rate, ETA and state; a failed one with its kind and
// message. The jobs come in the view (the daemon's `pulls`, then its `pull.` events).

K.pulls = {};

K.pulls.stateText = function (j) {
  if (j.state === "failed") return `failed (${j.kind || "?"})`;
  if (j.state === "running") return j.phase === "plan" ? "planning" : "fetching";
  return j.state;
};

K.pulls.bytesText = function (j) {
  if (!j.total) {
    if (j.state === "queued") return "waiting for a free slot";
    return j.state === "running" ? "reading the hub's metadata" : "nothing fetched";
  }
  const pct = j.fraction === null ? "" : ` (${(100 * j.fraction).toFixed(1)}%)`;
  return `${K.fmtBytes(j.done)} of ${K.fmtBytes(j.total)}${pct}`;
};

K.pulls.speedText = function (j) {
  if (j.state !== "running" || j.phase !== "fetch") return "";
  const rate = j.rate > 0 ? `${K.fmtBytes(j.rate)}/s` : "no byte yet";
  const eta = j.eta === null || j.eta === undefined ? "ETA –" : "ETA " + K.fmtDuration(j.eta);
  return `${rate} · ${eta}`;
};

// One row per job, kept by its key, so a moving bar slides (its width eases) instead of
// being redrawn from nothing at each event.
K.pulls.row = function (j) {
  const h = K.h;
  return h("div", { class: "pull", "data-key": j.key },
    h("div", { class: "pull-head" },
      h("span", { class: "pull-name" }),
      h("span", { class: "state" })),
    h("div", { class: "progress" }, h("div", {})),
    h("div", { class: "progress-text pull-bytes" }),
    h("div", { class: "pull-error error" }));
};

K.pulls.update = function (el, j) {
  const d = el.dataset;
  d.state = j.state; d.phase = j.phase; d.done = j.done; d.total = j.total;
  d.kind = j.kind || ""; d.file = j.file || "";
  const names = (j.names || []).filter((n) => n && n !== j.repo);
  el.querySelector(".pull-name").textContent =
    `${j.repo}@${j.revision}` + (names.length ? ` (${names.join(", ")})` : "");
  const state = el.querySelector(".state");
  state.textContent = K.pulls.stateText(j);
  state.className = "state pull-" + j.state;
  const bar = el.querySelector(".progress");
  bar.className = "progress pull-bar" + (j.fraction === null && j.state === "running" ? " unknown" : "");
  bar.firstChild.style.width = j.fraction === null ? "" : (100 * j.fraction).toFixed(1) + "%";
  const parts = [K.pulls.bytesText(j), K.pulls.speedText(j)];
  if (j.file && j.state === "running") parts.unshift(j.file);
  if (j.restarts) parts.push(`restarted ${j.restarts}×`);
  el.querySelector(".pull-bytes").textContent = parts.filter(Boolean).join(" · ");
  const err = el.querySelector(".pull-error");
  err.textContent = j.state === "failed" || j.state === "cancelled"
    ? `${j.kind || j.state}: ${j.message || ""}` : "";
  err.hidden = !err.textContent;
};

// jobs: the view's `pulls`, in the daemon's order.
K.pulls.render = function (root, jobs) {
  jobs = jobs || [];
  if (!jobs.length) {
    root.replaceChildren(K.h("p", { class: "muted" }, "No pull job."));
    return;
  }
  const have = new Map();
  for (const el of root.querySelectorAll(".pull")) have.set(el.dataset.key, el);
  const rows = jobs.map((j) => {
    const el = have.get(j.key) || K.pulls.row(j);
    K.pulls.update(el, j);
    return el;
  });
  root.replaceChildren(...rows);
};
