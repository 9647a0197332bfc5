// ktd dashboard: one card per configured model.

K.cards = {};

// States holding CPUs and GPUs (ktd.core.states.HOLDS_RESOURCES); asleep keeps only host memory.
const HOLDING = new Set(["starting", "ready", "draining", "stopping", "sleeping", "waking"]);
// States with a process: the engine can be evicted; an asleep one is woken, not loaded.
const RUNNING = new Set([...HOLDING, "asleep"]);
const SLEEPY = new Set(["sleeping", "asleep", "waking"]);

function stat(label, value, kind, extra, title) {
  return K.h("div", { class: "stat", title },
    K.h("b", { dataset: kind ? { kind, ...extra } : undefined }, value),
    K.h("span", {}, label));
}

// The parts of a card that move with the clock (uptime, TTL, load progress), redrawn each second.
K.cards.tick = function (root) {
  const now = K.now();
  for (const el of root.querySelectorAll("[data-kind]")) {
    const d = el.dataset;
    if (d.kind === "uptime" || d.kind === "ago") el.textContent = K.fmtDuration(now - Number(d.at));
    else if (d.kind === "ttl") {
      el.textContent = d.at ? K.fmtDuration(Number(d.at) - now) : d.idle || "–";
    } else if (d.kind === "progress") {
      const ran = now - Number(d.start);
      const eta = d.eta ? Number(d.eta) : null;
      const bar = el.querySelector(".progress");
      const text = el.querySelector(".progress-text");
      if (eta) {
        const pct = Math.min(99, (ran / eta) * 100);
        bar.firstChild.style.width = pct.toFixed(1) + "%";
        const left = eta - ran;
        text.textContent = left > 0
          ? `${K.fmtDuration(ran)} of about ${K.fmtDuration(eta)} · ETA ${K.fmtDuration(left)}`
          : `${K.fmtDuration(ran)} · taking longer than the usual ${K.fmtDuration(eta)}`;
      } else {
        text.textContent = `${K.fmtDuration(ran)} · no load history yet, no ETA`;
      }
    } else if (d.kind === "retry") {
      el.textContent = K.fmtDuration(Number(d.at) - now);
    }
  }
};

K.cards.render = function (card, ctx) {
  const h = K.h;
  const c = card;
  const colour = K.colour(c.colour);
  const rate = ctx.rate;
  const selected = ctx.selected === c.alias;
  const el = h("article", {
    class: "card" + (selected ? " selected" : "") + (c.served ? "" : " unserved"),
    style: { borderLeftColor: colour },
    "data-alias": c.alias, "data-state": c.state,
    onclick: c.served ? () => ctx.select(c.alias) : null,
  });
  el.append(h("div", { class: "card-head" },
    h("span", { class: "alias", title: c.path }, c.alias),
    c.pinned ? h("span", { class: "muted", title: "pinned: never evicted for another model" }, "pinned") : null,
    c.sleep === "unsupported" ? h("span", { class: "muted sleep-mode",
      title: "\"sleep\": true, but its SGLang has no --enable-memory-saver: swaps stop and reload it" },
    "sleep: unsupported") : null,
    h("span", { class: "state " + c.state }, c.state)));
  const edit = () => h("button", { type: "button", class: "edit", title: "this model's settings in the config editor",
    onclick: (e) => { e.stopPropagation(); ctx.edit(c.alias); } }, "Edit");
  if (!c.served) {
    el.append(h("div", { class: "phase" }, `${c.backend}: ${c.reason || "not served by ktd"}`));
    if (ctx.control) el.append(h("div", { class: "card-foot" }, h("div", { class: "grow" }), h("div", { class: "buttons" }, edit())));
    return el;
  }
  const idlePhase = c.state === "ready" ? "serving"
    : c.state === "asleep" ? "asleep: GPU memory released, host memory kept; a request wakes it" : "";
  el.append(h("div", { class: "phase" }, c.phase || idlePhase));
  if (c.state === "starting" && c.load_started) {
    el.append(h("div", { dataset: { kind: "progress", start: c.load_started, eta: c.load_eta || "" } },
      h("div", { class: "progress" + (c.load_eta ? "" : " unknown") }, h("div", { style: { background: colour } })),
      h("div", { class: "progress-text" })));
  }
  if (c.asleep_since && c.state === "asleep") {
    const since = new Date((c.asleep_since - K.clockOffset) * 1000);
    el.append(h("div", { class: "sleepline", title: since.toLocaleString() },
      `asleep since ${since.toLocaleTimeString()} (`, h("span", { dataset: { kind: "ago", at: c.asleep_since } }), " ago)",
      c.host_bytes ? ` · holds ${K.fmtBytes(c.host_bytes)} of host memory` : "",
      c.sleep_expires ? [" · stopped in ", h("span", { dataset: { kind: "ttl", at: c.sleep_expires } }), " (sleep TTL)"]
        : " · no sleep TTL"));
  }
  if (c.state === "failed" || c.reason) {
    const last = c.state === "ready" || c.state === "starting";
    const quiet = last || SLEEPY.has(c.state);
    el.append(h("div", { class: quiet ? "reason muted" : "reason" },
      last ? "last: " : "", c.reason || "failed",
      c.retry_in ? h("span", { class: "muted" }, " · retried by the next request in ",
        h("span", { dataset: { kind: "retry", at: ctx.now + c.retry_in } })) : null));
  }
  const up = RUNNING.has(c.state) && c.started_at;
  const asleep = c.state === "asleep";
  const idleText = asleep ? (c.sleep_ttl ? "–" : "no sleep TTL") : c.ttl ? (c.in_flight ? "busy" : "–") : "no TTL";
  const expires = asleep ? c.sleep_expires : c.state === "ready" ? c.expires_at : null;
  el.append(h("div", { class: "stats" },
    stat("uptime", "–", up ? "uptime" : null, up ? { at: c.started_at } : {}),
    stat(asleep ? "sleep TTL" : "TTL", "–", "ttl", { at: expires || "", idle: idleText }, asleep
      ? "asleep this long more and it is stopped (sleep_ttl)"
      : `idle this long more and it is ${c.sleep === "on" ? "put to sleep" : "evicted"} (ttl)`),
    stat("in flight", `${c.in_flight}${c.max_concurrent ? " / " + c.max_concurrent : ""}`),
    stat("queued", `${c.queued}${c.max_queue !== null && c.max_queue !== undefined ? " / " + c.max_queue : ""}`),
    stat("req/s", rate ? K.fmtNum(rate[1]) : "–"),
    stat("tokens/s", rate ? K.fmtNum(rate[2]) : "–"),
    stat("TTFB", rate ? K.fmtSeconds(rate[3]) : "–", null, null,
      "time to first byte at the frontend (load waits included), last sample"),
    stat("TTFT", rate ? K.fmtSeconds(rate[4]) : "–", null, null,
      "the engine's own time to first token (needs --enable-metrics), last sample"),
    stat("restarts", String(c.restarts)),
    stat("loads", String(c.loads)),
    stat("last load", c.load_seconds ? K.fmtDuration(c.load_seconds) : "–"),
    stat("evictions", String(c.evictions)),
  ));
  el.append(h("div", { class: "url" }, c.url || (c.state === "stopped" ? "not loaded" : asleep ? "asleep: no address until woken" : "")));
  const open = ctx.opened.has(c.alias);
  const more = h("details", { class: "more", open: open || null,
    ontoggle: (e) => ctx.setOpen(c.alias, e.target.open), onclick: (e) => e.stopPropagation() },
  h("summary", {}, "pid, argv, placement"),
  h("dl", {},
    h("dt", {}, "pid"), h("dd", {}, c.pid ? String(c.pid) : "–"),
    h("dt", {}, "port"), h("dd", {}, c.port ? String(c.port) : "–"),
    h("dt", {}, "SGLang"), h("dd", {}, c.sglang || "–"),
    h("dt", {}, "NUMA nodes"), h("dd", {}, c.numa_nodes && c.numa_nodes.length ? c.numa_nodes.join(", ") : "–"),
    h("dt", {}, "CPUs"), h("dd", {}, c.cpulist || "–"),
    h("dt", {}, "GPUs"), h("dd", {}, c.gpus && c.gpus.length ? c.gpus.join(", ") : "–"),
    h("dt", {}, "claims"), h("dd", {}, String(c.claims || 0)),
    h("dt", {}, "sleep"), h("dd", {}, (c.sleep || "off") + (c.sleep_ttl ? `, stopped after ${K.fmtDuration(c.sleep_ttl)} asleep` : "")),
    (c.gateway || []).length ? [h("dt", {}, "routers"), h("dd", {}, c.gateway.map((g) => `${g.router} ${g.state}`).join("; "))] : null,
    h("dt", {}, "argv"), h("dd", { class: "mono argv" }, c.argv && c.argv.length ? c.argv.join(" ") : "–"),
    (c.notes || []).length ? [h("dt", {}, "notes"), h("dd", {}, c.notes.join("; "))] : null));
  const foot = h("div", { class: "card-foot" }, h("div", { class: "grow" }, more));
  if (ctx.control) {
    const canLoad = !RUNNING.has(c.state);
    const canEvict = RUNNING.has(c.state);
    const confirming = ctx.confirming === c.alias;
    const button = (action, label, enabled, title) => h("button", { type: "button", class: action,
      disabled: !enabled || null, title,
      onclick: (e) => { e.stopPropagation(); ctx.act(action, c.alias); } }, label);
    // Sleep and wake where the model sleeps (or an engine is asleep anyway: adopted, config changed).
    const sleeps = c.sleep === "on" || SLEEPY.has(c.state);
    foot.append(h("div", { class: "buttons" },
      button("load", "Load", canLoad),
      sleeps ? button("sleep", "Sleep", c.state === "ready",
        "ktctl sleep: drain, then release its GPU memory; host memory stays") : null,
      sleeps ? button("wake", "Wake", c.state === "asleep" || c.state === "sleeping",
        "ktctl wake: take its GPU memory back (seconds)") : null,
      h("button", { type: "button", class: "evict" + (confirming ? " danger" : ""), disabled: !canEvict || null,
        onclick: (e) => { e.stopPropagation(); ctx.evict(c.alias); } }, confirming ? "Confirm evict" : "Evict"),
      edit()));
  }
  el.append(foot);
  return el;
};
