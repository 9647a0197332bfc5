// ktd dashboard: the session, the live stream, and what the page shows.

const UI = {
  session: null,
  view: null,
  series: {},
  interval: 10,
  selected: null,
  opened: new Set(),
  confirming: null,
  plan: null,
  planError: null,
  planFor: null,
  usage: null,
  logLines: [],
  es: null,
  lastHeard: 0,
  heartbeat: 15,
  retry: 1000,
  reconnectTimer: null,
};
const MAX_LOG_LINES = 2000;
const $ = (id) => document.getElementById(id);

function setConn(kind, text) {
  $("conn").className = "dot " + kind;
  $("conn-text").textContent = text;
}

// ------------------------------------------------------------ access

// /ui?token=KEY: the key leaves the address bar (and the history) before anything else runs.
function takeToken() {
  const params = new URLSearchParams(location.search);
  const token = params.get("token");
  if (token === null) return null;
  params.delete("token");
  const rest = params.toString();
  history.replaceState(null, "", location.pathname + (rest ? "?" + rest : "") + location.hash);
  return token;
}

async function login(key) {
  const res = await K.postJSON("api/login", { key });
  return res.ok ? res.body : null;
}

function showLogin(message) {
  if (UI.es) { UI.es.close(); UI.es = null; }
  $("dash").hidden = true;
  $("login").hidden = false;
  $("logout").hidden = true;
  $("reload-config").hidden = true;
  $("config-panel").hidden = true;
  $("login-error").textContent = message || "";
  setConn("down", "key needed");
  $("key").focus();
}

$("login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const session = await login($("key").value);
  if (!session) { $("login-error").textContent = "That key is not one of this frontend's keys."; return; }
  $("key").value = "";
  start(session);
});

$("logout").addEventListener("click", async () => {
  await K.postJSON("api/logout", {});
  showLogin("Signed out.");
});

$("reload-config").addEventListener("click", () => act("reload", null));

// ------------------------------------------------------------ the live stream

function start(session) {
  UI.session = session;
  UI.heartbeat = session.heartbeat || 15;
  $("login").hidden = true;
  $("dash").hidden = false;
  $("logout").hidden = !session.auth;
  $("reload-config").hidden = !session.control;
  $("config-panel").hidden = !session.control;
  connect();
  fetchUsage();
  fetchWaiting();
}

function heard() { UI.lastHeard = Date.now() / 1000; }

function connect() {
  clearTimeout(UI.reconnectTimer);
  if (UI.es) UI.es.close();
  const url = K.api("api/events") + (UI.selected ? "?logs=" + encodeURIComponent(UI.selected) : "");
  const es = new EventSource(url);
  UI.es = es;
  heard();
  setConn("wait", "connecting");
  const on = (name, fn) => es.addEventListener(name, (e) => {
    if (UI.es !== es) return;
    heard();
    fn(JSON.parse(e.data));
  });
  on("hello", (s) => {
    UI.heartbeat = s.heartbeat || UI.heartbeat;
    UI.retry = 1000;
    setConn("live", "live");
  });
  on("view", (m) => { K.setServerNow(m.now); UI.view = m.view; render(); });
  on("series", (m) => { UI.interval = m.interval; UI.series = m.series; renderPlots(); renderCards(); });
  on("sample", (points) => {
    const cutoff = K.now() - 3600;
    for (const [alias, p] of Object.entries(points)) {
      const list = (UI.series[alias] = UI.series[alias] || []);
      list.push(p);
      while (list.length && list[0][0] < cutoff) list.shift();
    }
    renderPlots();
    renderCards();
  });
  on("ping", (m) => K.setServerNow(m.now));
  on("logtail", (m) => { if (m.alias === UI.selected) { UI.logLines = []; appendLog(m.lines); } });
  on("log", (m) => { if (m.alias === UI.selected) appendLog(m.lines); });
  es.onerror = () => {
    if (UI.es !== es) return;
    setConn("wait", "reconnecting");
    // EventSource retries network errors itself; an answer that was not a stream
    // (401 after a key change, 503 while the frontend stops) ends it: try again here.
    if (es.readyState === EventSource.CLOSED) reconnectSoon();
  };
}

async function reconnectSoon() {
  clearTimeout(UI.reconnectTimer);
  const wait = UI.retry;
  UI.retry = Math.min(UI.retry * 2, 10000);
  UI.reconnectTimer = setTimeout(async () => {
    let res = null;
    try { res = await K.getJSON("api/session"); } catch (e) { res = null; }
    if (res && res.ok && res.body.auth && !res.body.ok) { showLogin("The key is no longer accepted."); return; }
    if (res && res.ok) start(res.body);
    else reconnectSoon();
  }, wait);
}

// A stream that went silent (a dead connection nobody closed) is replaced.
setInterval(() => {
  if (UI.es && Date.now() / 1000 - UI.lastHeard > 3 * UI.heartbeat + 2) {
    UI.es.close();
    UI.es = null;
    setConn("wait", "reconnecting");
    reconnectSoon();
  }
  if (UI.view) K.cards.tick($("cards"));
}, 1000);

// ------------------------------------------------------------ rendering

function render() {
  const v = UI.view;
  if (!v) return;
  const banner = $("banner");
  banner.hidden = v.daemon.up;
  banner.textContent = v.daemon.up ? "" : `The ktd daemon is not answering (${v.daemon.error}); showing what it said last.`;
  if (UI.es && UI.es.readyState === EventSource.OPEN) {
    setConn(v.daemon.up ? "live" : "down", v.daemon.up ? "live" : "daemon away");
  }
  renderCards();
  renderMachine();
  renderPlots();
  K.pulls.render($("pulls"), v.pulls);
}

function renderCards() {
  const v = UI.view;
  if (!v) return;
  const ctx = {
    selected: UI.selected,
    opened: UI.opened,
    control: UI.session && UI.session.control,
    confirming: UI.confirming,
    now: K.now(),
    select,
    setOpen: (alias, open) => { if (open) UI.opened.add(alias); else UI.opened.delete(alias); },
    act,
    edit: (alias) => K.config.edit(alias),
    evict: (alias) => {
      if (UI.confirming === alias) { UI.confirming = null; act("evict", alias); return; }
      UI.confirming = alias;
      setTimeout(() => { if (UI.confirming === alias) { UI.confirming = null; renderCards(); } }, 4000);
      renderCards();
    },
  };
  $("cards").replaceChildren(...v.models.map((c) => {
    const points = UI.series[c.alias];
    ctx.rate = points && points.length ? points[points.length - 1] : null;
    return K.cards.render(c, ctx);
  }));
  K.cards.tick($("cards"));
}

function renderMachine() {
  const v = UI.view;
  if (!v) return;
  $("cpu-model").textContent = v.machine ? v.machine.cpu_model : "";
  const plan = UI.planFor === UI.selected ? UI.plan : null;
  K.machine.render($("machine"), v.machine, v.models, plan, UI.selected);
  K.machine.renderPlan($("plan"), UI.selected, plan, UI.planFor === UI.selected ? UI.planError : null);
}

function renderPlots() {
  if (!UI.view) return;
  K.plots.render($("plots"), UI.view.models, UI.series, UI.view.loads || {}, UI.interval);
}

// The ledger changes by whole requests: read when the page starts, then each minute.
async function fetchUsage() {
  const res = await K.getJSON("api/usage");
  if (res.ok) UI.usage = res.body;
  K.usage.render($("usage"), UI.usage);
}
setInterval(() => { if (UI.session && !$("dash").hidden) fetchUsage(); }, 60000);

// Waiting requests come and go by the second: read each second while the page shows.
async function fetchWaiting() {
  const res = await K.getJSON("api/waiting");
  if (res.ok) K.waiting.render($("waiting"), res.body);
}
setInterval(() => { if (UI.session && !$("dash").hidden) fetchWaiting(); }, 1000);

function appendLog(lines) {
  const pre = $("logs");
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  UI.logLines.push(...lines);
  if (UI.logLines.length > MAX_LOG_LINES) UI.logLines.splice(0, UI.logLines.length - MAX_LOG_LINES);
  pre.textContent = UI.logLines.join("\n");
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

// ------------------------------------------------------------ selection and actions

function select(alias) {
  if (UI.selected === alias) return;
  UI.selected = alias;
  UI.logLines = [];
  $("logs").textContent = "";
  $("logs-alias").textContent = alias;
  UI.plan = null;
  UI.planError = null;
  UI.planFor = alias;
  renderCards();
  renderMachine();
  connect(); // the stream follows the selected model's log
  fetchPlan(alias);
}

async function fetchPlan(alias) {
  const res = await K.getJSON("api/plan?alias=" + encodeURIComponent(alias));
  if (UI.planFor !== alias) return;
  if (res.ok) { UI.plan = res.body.plan; UI.planError = null; }
  else { UI.plan = null; UI.planError = K.errorText(res); }
  renderMachine();
}

async function act(action, alias) {
  const res = await K.postJSON("api/action", alias ? { action, alias } : { action });
  K.toast(res.ok ? res.body.message : K.errorText(res), !res.ok);
  if (res.ok && UI.selected === alias) setTimeout(() => fetchPlan(alias), 500);
}

// ------------------------------------------------------------ start

(async function boot() {
  const token = takeToken();
  let res = await K.getJSON("api/session");
  if (!res.ok) { setConn("down", "frontend unreachable"); reconnectSoon(); return; }
  let session = res.body;
  if (token && session.auth && !session.ok) {
    const fresh = await login(token);
    if (!fresh) { showLogin("The key in the link was not accepted."); return; }
    session = fresh;
  }
  if (session.auth && !session.ok) { showLogin(""); return; }
  start(session);
})();
