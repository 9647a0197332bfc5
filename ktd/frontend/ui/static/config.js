// ktd dashboard: the config editor (ui_control, an admin key). A model's settings as a form,
// models.json as text, the history; every change is planned first and applied against the
// version the editor read (a change made meanwhile elsewhere is refused and said so).

// One scope of its own: the page's scripts are one script, and names must not meet.
K.config = {};

(function () {

  const CFG = {
    data: null, // GET api/config: version, models_text, entries, fields, history
    alias: null, // the model the form edits
    tab: "form",
    rollback: null, // the history's version being planned
    plan: null, // the last plan's answer
    planned: null, // the change it was made for (JSON), so Apply applies exactly that
    error: null, // {message, code}
    busy: false,
  };

  const $c = (id) => document.getElementById(id);

  function getPath(obj, path) {
    let v = obj;
    for (const part of path.split(".")) {
      if (v === null || typeof v !== "object") return undefined;
      v = v[part];
    }
    return v;
  }

  function setPath(obj, path, value) {
    const parts = path.split(".");
    let holder = obj;
    for (const part of parts.slice(0, -1)) {
      if (holder[part] === null || typeof holder[part] !== "object") holder[part] = {};
      holder = holder[part];
    }
    holder[parts[parts.length - 1]] = value;
  }

  function deletePath(obj, path) {
    const parts = path.split(".");
    let holder = obj;
    for (const part of parts.slice(0, -1)) {
      if (holder === null || typeof holder !== "object") return;
      holder = holder[part];
    }
    if (holder && typeof holder === "object") delete holder[parts[parts.length - 1]];
  }

  // A value of the file as the form shows it (empty: not set, the default applies).
  function shown(field, v) {
    if (v === undefined || v === null) return "";
    if (typeof v === "string") return v;
    if (field.kind === "bool") return v ? "true" : "false";
    if (typeof v === "number") return String(v);
    return JSON.stringify(v);
  }

  function ints(text) {
    const body = text.replace(/^\[|\]$/g, "");
    const parts = body.split(",").map((s) => s.trim()).filter((s) => s !== "");
    if (!parts.every((s) => /^-?\d+$/.test(s))) return null;
    return parts.map(Number);
  }

  // What a form input means for the file, or {error}.
  function parseField(field, raw) {
    const t = raw.trim();
    switch (field.kind) {
      case "text": return { value: raw };
      case "int":
        return /^-?\d+$/.test(t) ? { value: Number(t) } : { error: "expected a whole number" };
      case "seconds": {
        const n = Number(t);
        return t !== "" && isFinite(n) && n >= 0 ? { value: n } : { error: "expected a number of seconds, 0 or more" };
      }
      case "bool": return { value: t === "true" };
      case "choice": return { value: t };
      case "numa": {
        if (["auto", "all", "none"].includes(t)) return { value: t };
        const list = ints(t);
        return list ? { value: list } : { error: 'expected "auto", "all", "none" or node ids like 0,1' };
      }
      case "gpus": {
        if (t === "auto") return { value: t };
        if (/^\d+$/.test(t)) return { value: Number(t) };
        const list = ints(t);
        return list ? { value: list } : { error: 'expected "auto", a count, or GPU indices like 0,1' };
      }
      case "args":
      case "env": {
        const open = field.kind === "args" ? "[" : "{";
        if (!t.startsWith(open)) return { value: raw }; // ktd reads a string like a shell
        try {
          const v = JSON.parse(t);
          const ok = field.kind === "args" ? Array.isArray(v) : v && typeof v === "object" && !Array.isArray(v);
          return ok ? { value: v } : { error: field.kind === "args" ? "expected a JSON list" : "expected a JSON object" };
        } catch (e) {
          return { error: "not valid JSON: " + e.message };
        }
      }
      default: return { value: raw };
    }
  }

  function entryOf(alias) {
    const d = CFG.data;
    return d ? d.entries.find((e) => e.alias === alias) : undefined;
  }

  // ------------------------------------------------------------ the change the page would send

  // The change the page would send now; with ``mark``, a value that cannot be read is said
  // under its field (and the change is null).
  function change(mark) {
    const d = CFG.data;
    if (!d) return null;
    if (CFG.tab === "history") return CFG.rollback ? { base: d.version, rollback: CFG.rollback } : null;
    if (CFG.tab === "raw") return { base: d.version, models_text: $c("cfg-raw").value };
    const found = entryOf(CFG.alias);
    if (!found) return null;
    const entry = JSON.parse(JSON.stringify(found.entry)); // its key order is the file's
    let bad = false;
    for (const field of d.fields) {
      const input = document.querySelector(`#cfg-form [data-field="${CSS.escape(field.name)}"]`);
      if (!input) continue;
      const note = document.querySelector(`#cfg-form [data-error-for="${CSS.escape(field.name)}"]`);
      if (mark) {
        note.textContent = "";
        input.classList.remove("bad");
      }
      if (input.value.trim() === "" && field.kind !== "text") { deletePath(entry, field.name); continue; }
      if (input.value === "" && field.kind === "text") { deletePath(entry, field.name); continue; }
      const got = parseField(field, input.value);
      if (got.error) {
        if (mark) {
          note.textContent = got.error;
          input.classList.add("bad");
        }
        bad = true;
        continue;
      }
      setPath(entry, field.name, got.value);
    }
    return bad ? null : { base: d.version, alias: CFG.alias, entry };
  }

  // ------------------------------------------------------------ talking to the frontend

  K.config.load = async function () {
    const res = await K.getJSON("api/config", true);
    if (!res.ok) {
      CFG.data = null;
      CFG.error = { message: K.errorText(res), code: res.body && res.body.error && res.body.error.code };
      render();
      return;
    }
    CFG.data = res.body;
    CFG.plan = null;
    CFG.planned = null;
    CFG.error = null;
    CFG.rollback = null;
    if (!entryOf(CFG.alias)) {
      const first = CFG.data.entries[0];
      CFG.alias = first ? first.alias : null;
    }
    render();
  };

  // Read when first opened (a card's Edit, or the panel's button), not with every page.
  K.config.edit = async function (alias) {
    CFG.tab = "form";
    if (!CFG.data) await K.config.load();
    CFG.alias = alias;
    CFG.plan = null;
    CFG.planned = null;
    render();
    $c("config-panel").scrollIntoView({ block: "start" });
  };

  function refused(res) {
    const error = res.body && res.body.error;
    CFG.error = { message: K.errorText(res), code: error ? error.code : null };
    if (res.body && res.body.plan) CFG.plan = res.body.plan;
  }

  async function planIt() {
    const c = change(true);
    if (!c) return;
    CFG.busy = true;
    CFG.error = null;
    renderButtons();
    const res = await K.postJSON("api/config/plan", c);
    CFG.busy = false;
    if (res.ok) {
      CFG.plan = res.body.plan;
      CFG.planned = JSON.stringify(c);
    } else {
      CFG.plan = null;
      CFG.planned = null;
      refused(res);
    }
    renderPlan();
  }

  async function applyIt() {
    const c = change();
    if (!c || JSON.stringify(c) !== CFG.planned || !CFG.plan || !CFG.plan.ok) return;
    CFG.busy = true;
    renderButtons();
    const res = await K.postJSON("api/config/apply", c);
    CFG.busy = false;
    if (res.ok) {
      K.toast(res.body.message, false);
      await K.config.load();
      CFG.plan = res.body.plan;
      CFG.applied = res.body.message;
      renderPlan();
      return;
    }
    refused(res);
    CFG.planned = null;
    renderPlan();
  }

  // ------------------------------------------------------------ drawing

  function fieldRow(field, value) {
    const h = K.h;
    const id = "cfg-f-" + field.name.replace(/\W/g, "-");
    let input;
    const common = { id, "data-field": field.name, oninput: staleNote, onchange: staleNote };
    if (field.kind === "bool" || field.kind === "choice") {
      const options = field.kind === "bool" ? ["true", "false"] : field.choices;
      input = h("select", common, h("option", { value: "" }, "(default)"),
        options.map((o) => h("option", { value: o }, o)));
    } else if (field.kind === "args" || field.kind === "env") {
      input = h("textarea", { ...common, rows: 2, spellcheck: "false" });
    } else {
      input = h("input", { ...common, type: "text", spellcheck: "false",
        inputmode: field.kind === "int" || field.kind === "seconds" ? "decimal" : null,
        placeholder: field.required ? "required" : "(default)" });
    }
    input.value = shown(field, value);
    return h("div", { class: "cfg-field", "data-row": field.name },
      h("label", { for: id }, field.name),
      input,
      h("small", { class: "muted help" }, field.meaning),
      h("div", { class: "error field-error", "data-error-for": field.name }));
  }

  function staleNote() {
    if (CFG.planned !== null) {
      CFG.planned = null;
      renderButtons();
      const note = $c("cfg-plan-note");
      if (note) note.textContent = "Changed since this plan: plan again before applying.";
    }
  }

  function renderForm() {
    const h = K.h;
    const d = CFG.data;
    const root = $c("cfg-form");
    const found = entryOf(CFG.alias);
    const pick = h("select", { id: "cfg-model", onchange: (e) => { CFG.alias = e.target.value; CFG.plan = null; CFG.planned = null; render(); } },
      d.entries.map((e) => h("option", { value: String(e.alias) }, String(e.alias))));
    pick.value = CFG.alias === null ? "" : String(CFG.alias);
    const rows = found ? d.fields.map((f) => fieldRow(f, getPath(found.entry, f.name))) : [h("p", { class: "muted" }, "No model to edit.")];
    root.replaceChildren(h("div", { class: "cfg-pick" }, h("label", { for: "cfg-model" }, "Model"), pick),
      h("div", { class: "cfg-grid" }, rows));
  }

  function renderRaw() {
    const d = CFG.data;
    const area = $c("cfg-raw");
    if (area.dataset.version !== d.version) {
      area.value = d.models_text === null ? "" : d.models_text;
      area.dataset.version = d.version;
    }
  }

  function renderHistory() {
    const h = K.h;
    const d = CFG.data;
    const rows = d.history.map((v) => {
      const who = (v.user ? `${v.user} (uid ${v.uid})` : v.uid !== null ? `uid ${v.uid}` : "ktd")
        + (v.claimed && v.claimed !== v.user ? `, claimed "${v.claimed}"` : "");
      const current = v.version === d.version;
      return h("tr", { "data-seq": v.seq, class: current ? "current" : null },
        h("td", {}, "#" + v.seq),
        h("td", { class: "mono" }, v.version),
        h("td", {}, new Date(v.time * 1000).toLocaleString()),
        h("td", {}, v.how + (v.rollback_of ? ` of #${v.rollback_of}` : "")),
        h("td", {}, who),
        h("td", {}, v.what),
        h("td", {}, current ? h("span", { class: "muted" }, "the files now")
          : h("button", { type: "button", class: "rollback",
            onclick: () => { CFG.rollback = v.seq; planIt(); } }, `Roll back to #${v.seq}`)));
    });
    $c("cfg-history").replaceChildren(h("table", { class: "cfg-table cfg-history" },
      h("thead", {}, h("tr", {}, ["#", "version", "when", "how", "who", "what", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows)),
    h("p", { class: "muted" }, `ktd keeps ${d.keep} versions: the files now and the ${d.keep - 1} before them.`));
  }

  function value(v) {
    if (typeof v === "number" && Number.isInteger(v)) return String(v);
    return JSON.stringify(v);
  }

  function markFields(problems) {
    const found = entryOf(CFG.alias);
    if (!found || CFG.tab !== "form") return;
    const prefix = `$[${found.index}].`;
    for (const q of problems) {
      if (!q.path || !q.path.startsWith(prefix)) continue;
      const name = q.path.slice(prefix.length);
      const input = document.querySelector(`#cfg-form [data-field="${CSS.escape(name)}"]`);
      const note = document.querySelector(`#cfg-form [data-error-for="${CSS.escape(name)}"]`);
      if (input) input.classList.add("bad");
      if (note) note.textContent = q.message;
    }
  }

  function renderPlan() {
    const h = K.h;
    const root = $c("cfg-plan");
    const out = [];
    if (CFG.error) {
      const stale = CFG.error.code === "stale_config";
      out.push(h("div", { id: "cfg-error", class: "cfg-error" + (stale ? " stale" : ""), role: "alert", "data-code": CFG.error.code || "" },
        stale ? h("b", {}, "Not applied: someone changed the configuration meanwhile. ") : null,
        CFG.error.message,
        stale ? h("button", { type: "button", id: "cfg-reload", onclick: () => K.config.load() }, "Reload the editor") : null));
    }
    const plan = CFG.plan;
    if (plan) {
      out.push(h("h3", {}, `Plan: version ${plan.base || "?"} → ${plan.version}` + (plan.changed.length ? "" : " (the files do not change)")));
      out.push(h("table", { class: "cfg-table cfg-engines" },
        h("thead", {}, h("tr", {}, ["model", "action", "state", "changes", "note"].map((t) => h("th", {}, t)))),
        h("tbody", {}, plan.engines.map((e) => h("tr", { "data-alias": e.alias, "data-action": e.action },
          h("td", {}, e.alias),
          h("td", {}, h("span", { class: "action " + e.action }, e.action)),
          h("td", {}, e.state || "–"),
          h("td", { class: "mono" }, e.fields.map((f) => h("div", {}, `${f.field}: ${value(f.old)} → ${value(f.new)}`))),
          h("td", { class: "muted" }, e.note))))));
      if (plan.settings.length) {
        out.push(h("ul", { class: "cfg-settings" }, plan.settings.map((s) =>
          h("li", {}, `${s.field}: ${value(s.old)} → ${value(s.new)} (${s.effect})`))));
      }
      if (plan.problems.length) {
        out.push(h("ul", { class: "cfg-problems" }, plan.problems.map((q) =>
          h("li", { class: q.level, "data-path": q.path || "" }, `${q.level}: ` + (q.path ? `${q.file}: ${q.path}: ` : "") + q.message))));
      }
      out.push(h("p", { id: "cfg-plan-note", class: plan.ok ? "muted" : "error" },
        plan.ok ? (CFG.planned ? "This is what Apply does." : CFG.applied || "") : "Refused: " + plan.summary));
      markFields(plan.problems);
    }
    root.replaceChildren(...out);
    renderButtons();
  }

  function renderButtons() {
    const c = CFG.data ? change() : null;
    const ready = !!(CFG.plan && CFG.plan.ok && CFG.planned && c && JSON.stringify(c) === CFG.planned);
    $c("cfg-plan-btn").disabled = CFG.busy || !CFG.data || CFG.tab === "history";
    $c("cfg-apply-btn").disabled = CFG.busy || !ready;
  }

  function render() {
    $c("cfg-closed").hidden = true;
    $c("cfg-body").hidden = false;
    for (const tab of ["form", "raw", "history"]) {
      $c("cfg-tab-" + tab).classList.toggle("on", CFG.tab === tab);
      $c("cfg-" + tab).hidden = CFG.tab !== tab;
    }
    const d = CFG.data;
    $c("cfg-version").textContent = d ? `models.json ${d.models_path} · version ${d.version}`
      + (d.running !== d.version ? ` (ktd runs ${d.running}: changed by hand, not reloaded)` : "") : "";
    if (d && d.problem) CFG.error = { message: d.problem, code: "config_error" };
    if (d) {
      renderForm();
      renderRaw();
      renderHistory();
    }
    CFG.applied = null;
    renderPlan();
  }

  for (const tab of ["form", "raw", "history"]) {
    $c("cfg-tab-" + tab).addEventListener("click", () => {
      CFG.tab = tab;
      CFG.plan = null;
      CFG.planned = null;
      CFG.rollback = null;
      render();
    });
  }
  $c("cfg-open").addEventListener("click", () => K.config.load());
  $c("cfg-plan-btn").addEventListener("click", planIt);
  $c("cfg-apply-btn").addEventListener("click", applyIt);
  $c("cfg-raw").addEventListener("input", staleNote);
})();
