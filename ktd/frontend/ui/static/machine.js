// ktd dashboard: the machine picture (NUMA nodes, CPUs, memory, GPUs) and a planned load.

K.machine = {};

// What a load would do to the engines in its way: stop them, or put to sleep those that
// sleep (issue 43: every one was "stop").
function makingRoom(plan) {
  const sleeps = plan.sleeps || [];
  const stops = (plan.evict || []).filter((a) => !sleeps.includes(a));
  const parts = [];
  if (sleeps.length) parts.push(`put ${sleeps.join(", ")} to sleep`);
  if (stops.length) parts.push(`stop ${stops.join(", ")}`);
  return parts.length ? h("div", {}, `and ${parts.join(" and ")} first`) : null;
}

function holderChips(aliases, colours) {
  return aliases.map((a) => K.h("span", { class: "chip", style: { background: colours[a] || "#888" } }, a));
}

// Asleep engines keep host memory on a node without holding it: their chips are outlined.
function asleepChips(asleep, colours) {
  return asleep.map((s) => K.h("span", { class: "chip asleep", "data-asleep": s.alias,
    style: { borderColor: colours[s.alias] || "#888", color: colours[s.alias] || "#888" },
    title: `${s.alias} is asleep: it keeps ${K.fmtBytes(s.bytes)} of host memory here, no CPU` }, `${s.alias} · asleep`));
}

// Stripes in a sleeper's colour: its memory, told apart from the awake holder's solid fill.
const asleepFill = (colour) => `repeating-linear-gradient(135deg, ${colour} 0 4px, transparent 4px 7px)`;

// A memory bar: the part in use (coloured by its holder when there is exactly one), the
// asleep engines' share of it first, striped in their colours.
function memBar(total, used, colour, asleep, colours) {
  const pct = (n) => (total > 0 ? Math.min(100, (n / total) * 100) : 0) + "%";
  let left = used;
  const parts = (asleep || []).map((s) => {
    const take = Math.min(s.bytes, Math.max(0, left));
    left -= take;
    return K.h("div", { class: "asleep", "data-asleep": s.alias,
      style: { width: pct(take), background: asleepFill(colours[s.alias] || "#888") } });
  });
  return K.h("div", { class: "mem" }, parts, K.h("div", { style: { width: pct(Math.max(0, left)), background: colour } }));
}

K.machine.render = function (root, machine, models, plan, selected) {
  const h = K.h;
  if (!machine) {
    root.replaceChildren(h("p", { class: "muted" }, "No picture of the machine yet."));
    return;
  }
  const colours = {};
  for (const m of models) colours[m.alias] = K.colour(m.colour);
  const owner = new Map(machine.cpu_owner.map(([cpu, alias]) => [cpu, alias]));
  const reserved = new Set(machine.reserved_cpus);
  const p = plan && plan.ok !== false ? plan : null;
  const plannedNodes = new Set(p ? p.numa_nodes || [] : []);
  const plannedGpus = new Set(p ? p.gpus || [] : []);
  const plannedCpus = new Set(p ? p.cpus || [] : []);
  const planColour = selected ? colours[selected] : null;

  const nodes = machine.nodes.map((n) => {
    const used = Math.max(0, n.mem_total - n.mem_available);
    const one = n.holders.length === 1 ? colours[n.holders[0]] : "var(--muted)";
    const asleep = n.asleep || [];
    const kept = asleep.reduce((sum, s) => sum + s.bytes, 0);
    const cpus = n.cpus.map((c) => {
      const who = owner.get(c);
      const cls = "cpu" + (reserved.has(c) && !who ? " reserved" : "");
      const style = who ? { background: colours[who] } : plannedCpus.has(c) ? { outline: `1px dashed ${planColour}` } : {};
      return h("span", { class: cls, style, title: `CPU ${c}${who ? " · " + who : reserved.has(c) ? " · kept for ktd" : ""}` });
    });
    const planned = plannedNodes.has(n.id);
    return h("div", { class: "part" + (planned ? " planned" : ""), "data-node": n.id,
      style: planned && planColour ? { borderColor: planColour } : {} },
    h("div", { class: "part-head" }, h("b", {}, `NUMA node ${n.id}`),
      h("span", { class: "muted" }, `${n.cpus.length} CPUs · ${n.cpulist}`), holderChips(n.holders, colours),
      asleepChips(asleep, colours)),
    h("div", { class: "cpus" }, cpus),
    memBar(n.mem_total, used, one, asleep, colours),
    h("div", { class: "mem-text" },
      `${K.fmtBytes(n.mem_available)} free of ${K.fmtBytes(n.mem_total)}`,
      n.mem_available !== n.mem_free ? ` (${K.fmtBytes(n.mem_free)} unused, the rest page cache)` : "",
      kept ? ` · ${K.fmtBytes(kept)} kept by ${asleep.map((s) => s.alias).join(", ")} asleep (striped)` : ""));
  });

  const gpus = machine.gpus.map((g) => {
    const one = g.holders.length === 1 ? colours[g.holders[0]] : "var(--muted)";
    const planned = plannedGpus.has(g.index);
    return h("div", { class: "part" + (planned ? " planned" : ""), "data-gpu": g.index,
      style: planned && planColour ? { borderColor: planColour } : {} },
    h("div", { class: "part-head" }, h("b", {}, `GPU ${g.index}`), h("span", { class: "muted" }, ""),
      holderChips(g.holders, colours)),
    memBar(g.memory_total, g.memory_used, one),
    h("div", { class: "mem-text" },
      `${g.name} · ${K.fmtBytes(g.memory_used)} used of ${K.fmtBytes(g.memory_total)}`));
  });
  root.replaceChildren(
    h("div", { class: "nodes" }, nodes),
    gpus.length ? h("div", { class: "gpus" }, gpus)
      : h("p", { class: "muted" }, `No GPU: ${machine.gpu_error || "nvidia-smi lists none"}`),
  );
};

// What loading the selected model would take now: the dry-run and the memory estimate.
K.machine.renderPlan = function (root, alias, plan, error) {
  const h = K.h;
  if (!alias) { root.replaceChildren(); return; }
  if (error) { root.replaceChildren(h("div", { class: "plan" }, h("span", { class: "error" }, error))); return; }
  if (!plan) { root.replaceChildren(h("div", { class: "plan muted" }, `Planning a load of ${alias}…`)); return; }
  const est = plan.estimate || {};
  const fit = plan.fit || {};
  const where = [];
  if (plan.numa_nodes && plan.numa_nodes.length) where.push(`NUMA node${plan.numa_nodes.length > 1 ? "s" : ""} ${plan.numa_nodes.join(", ")}`);
  else if (plan.ok !== false) where.push("no NUMA node of its own");
  if (plan.cpus && plan.cpus.length) where.push(`${plan.cpus.length} CPUs (${plan.cpulist})`);
  if (plan.gpus && plan.gpus.length) where.push(`GPU${plan.gpus.length > 1 ? "s" : ""} ${plan.gpus.join(", ")}`);
  const rows = (fit.rows || []).map((r) => h("tr", { class: r.need > r.free ? "short" : "fits" },
    h("td", {}, r.what), h("td", {}, K.fmtBytes(r.need)), h("td", {}, K.fmtBytes(r.free))));
  root.replaceChildren(h("div", { class: "plan", "data-plan": alias },
    h("h3", {}, `Dry-run: loading ${alias} now`),
    plan.ok === false ? h("div", { class: "error" }, plan.reason || "cannot be placed")
      : h("div", {}, `would take ${where.join(", ")}`),
    makingRoom(plan),
    plan.blocked_by && plan.blocked_by.length ? h("div", { class: "muted" }, `waits for ${plan.blocked_by.join(", ")}`) : null,
    h("div", { class: "muted" },
      `estimate: host RAM ${est.host_bytes ? K.fmtBytes(est.host_bytes) : "?"}, GPU ${est.gpu_bytes ? K.fmtBytes(est.gpu_bytes) : "?"}`,
      est.kv_cache_bytes ? ` (KV cache ${K.fmtBytes(est.kv_cache_bytes)} for ${est.ctx} tokens)` : ""),
    rows.length ? h("table", {}, h("tr", {}, h("th", {}, ""), h("th", {}, "needs"), h("th", {}, "free")), rows) : null,
    fit.ok === false ? h("div", { class: "error" }, fit.reason) : fit.ok ? h("div", { class: "fits" }, "fits") : null,
    (plan.notes || []).concat(est.notes || [], fit.notes || []).map((n) => h("div", { class: "muted" }, n))));
};
