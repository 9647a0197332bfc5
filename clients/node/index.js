"use strict";
/**
 * ktd-client: ktd's control socket from Node.js (docs/protocol.md is the protocol).
 *
 * A DEALER on ktd's ROUTER (ipc), msgpack messages tagged by `op` (requests) and
 * `type` (replies), matched by `id`; events from its XPUB socket. Replies are plain
 * objects: fields this client does not know (a newer daemon's) are carried along,
 * never refused, and so are states and error codes it does not know.
 *
 *   const { Client } = require("ktd-client");
 *   const ktd = new Client();                      // $KTD_SOCKET, else the runtime dir
 *   const engine = await ktd.load("qwen3", { onProgress: (ev) => console.log(ev.phase) });
 *   console.log(engine.url);
 *   for await (const ev of ktd.events(["engine."])) console.log(ev.alias, ev.state);
 *   ktd.close();
 */

const fs = require("node:fs");
const net = require("node:net");
const path = require("node:path");
const zmq = require("zeromq");
const { encode, decode } = require("@msgpack/msgpack");

/** The protocol this client speaks (docs/protocol.md, "Versions"). */
const PROTOCOL = Object.freeze({ major: 1, minor: 1 });
/**
 * Request op -> the reply types that answer it (an `error` answers any): the schema's
 * `x-ktd-reply-types`, copied into `replies.json` by `python -m ktd.protocol_schema
 * --write`, so that the pairing is the protocol's and written in no client by hand.
 */
const REPLIES = Object.freeze(require("./replies.json").replies);
/** What a daemon of protocol 1.0 can do: its Pong names no features. */
const FEATURES_1_0 = Object.freeze(["claims", "keep_alive", "keys", "machine", "sleep", "usage", "welcome"]);
/** The events socket greets each subscription with this frame (XPUB_WELCOME_MSG). */
const WELCOME = Buffer.from("ktd.welcome");
/** Extra time on top of a deadline the daemon enforces (it may still tear an engine down). */
const DAEMON_GRACE_MS = 30_000;

class ClientError extends Error {
  constructor(message) {
    super(message);
    this.name = this.constructor.name;
  }
}

/** ktd is not running, not listening there, or did not answer in time. */
class DaemonUnreachable extends ClientError {
  get code() {
    return "unreachable";
  }
}

/** The daemon went away while a reply was awaited (it exited or restarted). */
class ConnectionLost extends DaemonUnreachable {}

/** ktd answered something this client cannot read, or a reply of the wrong kind. */
class ProtocolError extends ClientError {
  get code() {
    return "protocol";
  }
}

/** An error reply: `code` is stable (match on it), `message` is for people. */
class KtdError extends ClientError {
  constructor(code, message, detail = {}) {
    super(`${code}: ${message}`);
    this.errorCode = code;
    this.reason = message;
    this.detail = detail;
  }
  get code() {
    return this.errorCode;
  }
}

/** The control socket's path: the argument, else $KTD_SOCKET, else ktd's runtime dir. */
function controlPath(socket = undefined, env = process.env) {
  const given = socket ?? env.KTD_SOCKET;
  if (given) return String(given).replace(/^ipc:\/\//, "");
  let dir = env.KTD_RUNTIME_DIR;
  if (!dir) {
    if (process.getuid() === 0) dir = "/run/ktd";
    else if (env.XDG_RUNTIME_DIR) dir = path.join(env.XDG_RUNTIME_DIR, "ktd");
    else dir = `/tmp/ktd-${process.getuid()}`;
  }
  return path.join(dir, "control.sock");
}

const START_HINT = "start it with `ktd serve` or `systemctl start ktd`, or try `ktd up --demo`";

/**
 * Reject unless something listens on the unix socket `file`: zmq's connect never
 * fails, so without this a missing daemon would only show as a timeout.
 */
async function probe(file, what = "control") {
  let st;
  try {
    st = fs.statSync(file);
  } catch (err) {
    if (err.code === "ENOENT") {
      throw new DaemonUnreachable(`ktd is not running: no ${what} socket at ${file} (${START_HINT})`);
    }
    throw new DaemonUnreachable(`cannot reach ktd at ${file}: ${err.message}`);
  }
  if (!st.isSocket()) throw new DaemonUnreachable(`cannot reach ktd: ${file} is not a socket`);
  await new Promise((resolve, reject) => {
    const conn = net.connect(file);
    conn.setTimeout(1000, () => {
      conn.destroy();
      resolve(); // a full backlog: busy, but running
    });
    conn.on("connect", () => {
      conn.destroy();
      resolve();
    });
    conn.on("error", (err) => {
      if (err.code === "ECONNREFUSED") {
        reject(new DaemonUnreachable(`ktd is not running: ${file} is a stale socket, nothing listens on it (${START_HINT})`));
      } else if (err.code === "EACCES") {
        reject(new DaemonUnreachable(`cannot reach ktd: permission denied on ${file} (run as root or as a member of ktd's group)`));
      } else {
        reject(new DaemonUnreachable(`cannot reach ktd at ${file}: ${err.message}`));
      }
    });
  });
}

/**
 * A subscription to ktd's events: an async iterable of event objects
 * (`{topic, time, alias, state, phase, lines, in_flight, ...}`). `ready` resolves once
 * the daemon greeted it, so nothing published after that is missed. A greeting after
 * that one means the subscription was made again (the daemon restarted): events in
 * between were missed, and the iterator yields `{gap: true}` so the caller reads the
 * state afresh.
 */
class Subscription {
  constructor(file, topics, { exact = false } = {}) {
    this.topics = [...topics];
    this._exact = exact ? new Set(this.topics) : null;
    this.socket = new zmq.Subscriber({ linger: 0 });
    for (const t of this.topics) this.socket.subscribe(t);
    this.socket.subscribe(WELCOME);
    this.socket.connect(`ipc://${file}`);
    this._queue = [];
    this.ready = this._firstGreeting();
  }

  async _firstGreeting() {
    // Up to a second, as ktctl waits; a greeting that comes later is a gap (the
    // caller may have read a state before the subscription was in place).
    this.socket.receiveTimeout = 1000;
    try {
      for (;;) {
        const frames = await this.socket.receive();
        if (frames[0].equals(WELCOME)) return;
        this._queue.push(frames); // an event that overtook the greeting
      }
    } catch (err) {
      if (err.code !== "EAGAIN") throw err;
    } finally {
      this.socket.receiveTimeout = -1;
    }
  }

  /** The next event (or `{gap: true}`), or null after `timeoutMs`. */
  async next(timeoutMs = -1) {
    await this.ready;
    for (;;) {
      let frames = this._queue.shift();
      if (!frames) {
        this.socket.receiveTimeout = timeoutMs;
        try {
          frames = await this.socket.receive();
        } catch (err) {
          if (err.code === "EAGAIN") return null;
          throw err;
        }
      }
      if (frames[0].equals(WELCOME)) return { gap: true }; // subscribed anew: events were missed
      const topic = frames[0].toString();
      if (this._exact && !this._exact.has(topic)) continue;
      try {
        return decode(frames[frames.length - 1]);
      } catch {
        continue; // not an event this client can read: never fatal for a follower
      }
    }
  }

  async *[Symbol.asyncIterator]() {
    for (;;) {
      const ev = await this.next();
      if (ev !== null) yield ev;
    }
  }

  close() {
    this.socket.close();
  }
}

/**
 * One connection to ktd's control socket. Every method sends one request and resolves
 * with its reply's content; an error reply rejects with `KtdError` (match `err.code`:
 * `unknown_model`, `load_failed`, `busy`, `timeout`, ...), a daemon that is not
 * running or does not answer within `timeout` ms with `DaemonUnreachable`.
 */
class Client {
  constructor({ socket = undefined, timeout = 5000 } = {}) {
    this.socketPath = controlPath(socket);
    this.eventsPath = path.join(path.dirname(this.socketPath), "events.sock");
    this.timeout = timeout;
    this._nextId = 1;
    this._pending = new Map();
    this._sock = null;
    this._sending = Promise.resolve();
    this._subs = new Set();
  }

  async _connect() {
    if (this._sock) return this._sock;
    await probe(this.socketPath);
    if (this._sock) return this._sock;
    const sock = new zmq.Dealer({
      linger: 0,
      immediate: true, // queued only on a completed connection: a hung daemon times out
      receiveHighWaterMark: 0,
      reconnectInterval: 100,
      reconnectMaxInterval: 1000,
    });
    sock.connect(`ipc://${this.socketPath}`);
    this._sock = sock;
    this._receiving = this._receive(sock);
    this._watching = this._watch(sock);
    return sock;
  }

  async _receive(sock) {
    try {
      for await (const frames of sock) {
        let reply;
        try {
          reply = decode(frames[frames.length - 1]);
        } catch {
          continue; // not msgpack: nobody's reply
        }
        const waiter = reply && typeof reply === "object" ? this._pending.get(reply.id) : undefined;
        if (!waiter) continue; // a late reply of a request that timed out
        this._pending.delete(reply.id);
        waiter.resolve(reply);
      }
    } catch (err) {
      if (!sock.closed) this._failAll(new ConnectionLost(`lost the connection to ktd: ${err.message}`));
    }
  }

  async _watch(sock) {
    try {
      for await (const event of sock.events) {
        if (event.type === "disconnect") {
          this._failAll(new ConnectionLost(`lost the connection to ktd at ${this.socketPath} (did ktd exit or restart?)`));
        }
      }
    } catch {
      // closed
    }
  }

  _failAll(err) {
    for (const [id, waiter] of this._pending) {
      this._pending.delete(id);
      waiter.reject(err);
    }
  }

  /**
   * Send any request (`{op, ...fields}`) and resolve with the reply object. `timeoutMs`:
   * how long to wait for it (default the client's; Infinity while the daemon stays
   * connected). Error replies reject with KtdError, a reply of a type that does not
 * answer `msg.op` (`REPLIES`) with ProtocolError.
   */
  async request(msg, { timeoutMs = this.timeout } = {}) {
    const sock = await this._connect();
    const id = this._nextId++;
    const frame = encode({ op: msg.op, id, ...msg }, { ignoreUndefined: true });
    const reply = new Promise((resolve, reject) => {
      this._pending.set(id, { resolve, reject });
    });
    reply.catch(() => {}); // rejected while the send is still queued: awaited below all the same
    // zeromq.js allows one send at a time: sends are chained.
    const sent = this._sending.then(async () => {
      sock.sendTimeout = Math.min(this.timeout, Number.isFinite(timeoutMs) ? timeoutMs : this.timeout);
      try {
        await sock.send(frame);
      } catch (err) {
        if (err.code === "EAGAIN") {
          await probe(this.socketPath); // gone since? say so precisely
          throw new DaemonUnreachable(`ktd did not accept a connection on ${this.socketPath} within ${this.timeout / 1000}s (is it hung?)`);
        }
        throw err;
      }
    });
    this._sending = sent.catch(() => {});
    let timer;
    try {
      await sent;
      const limit = Number.isFinite(timeoutMs)
        ? new Promise((_, reject) => {
            timer = setTimeout(
              () => reject(new DaemonUnreachable(`no reply from ktd at ${this.socketPath} within ${timeoutMs / 1000}s (is it hung?)`)),
              timeoutMs,
            );
          })
        : null;
      const got = await (limit ? Promise.race([reply, limit]) : reply);
      if (got.type === "error") throw new KtdError(got.code, got.message, got.detail ?? {});
      const kinds = REPLIES[msg.op]; // an op the table does not know (a newer one): as it is
      if (kinds && !kinds.includes(got.type)) {
        throw new ProtocolError(`ktd answered ${got.type} to ${msg.op}, where ${kinds.join(" or ")} was expected`);
      }
      return got;
    } finally {
      clearTimeout(timer);
      this._pending.delete(id);
    }
  }

  _long(timeout) {
    return timeout == null ? Infinity : timeout * 1000 + Math.max(this.timeout, DAEMON_GRACE_MS);
  }

  /** `{version, pid, protocol: {major, minor}, features}`; a 1.0 daemon says no protocol. */
  async ping() {
    const { type, id, ...pong } = await this.request({ op: "ping" });
    const protocol = pong.protocol ?? { major: 1, minor: 0 };
    const features = pong.features ?? (protocol.major === 1 && protocol.minor === 0 ? [...FEATURES_1_0] : []);
    return { ...pong, protocol, features };
  }

  /** Every engine ktd knows (or only `alias`: an unknown one rejects `unknown_model`). */
  async status(alias = undefined) {
    return (await this.request({ op: "status", alias })).engines;
  }

  /** Every models.json entry, served or not. */
  async models() {
    return (await this.request({ op: "models" })).models;
  }

  /**
   * Load `alias` and resolve with its engine once it is ready. `timeout` (seconds) bounds
   * the load (the daemon's deadline); `onProgress(event)` gets its `engine.`/`log.`
   * events meanwhile (subscribed before the request is sent, so none is missed). A load
   * that ends anything but ready rejects with KtdError `load_failed`.
   */
  async load(alias, { timeout = undefined, onProgress = undefined } = {}) {
    const reply = await this._watched({ op: "load", alias, wait: true, timeout }, alias, this._long(timeout), onProgress);
    const engine = reply.engine;
    if (engine.state !== "ready") {
      const why = engine.reason ? `: ${engine.reason}` : "";
      throw new KtdError("load_failed", `${alias} is ${engine.state}${why}`, { alias, engine, log_tail: engine.log_tail ?? [] });
    }
    return engine;
  }

  async _watched(msg, alias, timeoutMs, onProgress) {
    if (!onProgress) return this.request(msg, { timeoutMs });
    const sub = await this.subscribe([`engine.${alias}`, `log.${alias}`], { exact: true });
    let done = false;
    const pump = (async () => {
      while (!done) {
        const ev = await sub.next(200);
        if (ev && !ev.gap && !done) onProgress(ev);
      }
    })();
    try {
      return await this.request(msg, { timeoutMs });
    } finally {
      done = true;
      await pump.catch(() => {});
      sub.close();
    }
  }

  /** Stop `alias` (or every engine with `{all: true}`); resolves with the aliases evicted. */
  async evict(alias = undefined, { all = false, force = false, timeout = undefined } = {}) {
    if ((alias == null) === !all) throw new TypeError("evict needs exactly one of alias or {all: true}");
    const reply = await this.request({ op: "evict", alias, all, force, timeout }, { timeoutMs: this._long(timeout) });
    return reply.evicted;
  }

  /** Put `alias` to sleep (GPU memory released, experts kept in host RAM); its engine. */
  async sleep(alias, { timeout = undefined, onProgress = undefined } = {}) {
    return (await this._watched({ op: "sleep", alias, timeout }, alias, this._long(timeout), onProgress)).engine;
  }

  /** Wake an asleep `alias`; resolves with its engine once ready. */
  async wake(alias, { timeout = undefined, onProgress = undefined } = {}) {
    return (await this._watched({ op: "wake", alias, timeout }, alias, this._long(timeout), onProgress)).engine;
  }

  /** The usage ledger's rows from `since` ("YYYY-MM-DD"; "" all), of one key or all. */
  async usage({ since = "", key = undefined } = {}) {
    return (await this.request({ op: "usage", since, key })).rows;
  }

  /** The daemon's protocol and its JSON Schema (a 1.0 daemon rejects `bad_request`). */
  async schema() {
    const reply = await this.request({ op: "schema" });
    return { protocol: reply.protocol, schema: reply.schema };
  }

  /**
   * Resolve with `alias`'s engine once it is in one of `states` (`["ready"]`): the
   * events first, then the status (so nothing is missed), the status again after a
   * gap. Rejects `timeout` after `timeout` seconds, `load_failed` if it fails meanwhile.
   */
  async wait(alias, { states = ["ready"], timeout = undefined } = {}) {
    const wanted = new Set(states);
    const deadline = timeout == null ? Infinity : Date.now() + timeout * 1000;
    const sub = await this.subscribe([`engine.${alias}`], { exact: true });
    try {
      let [engine] = await this.status(alias);
      let state = engine.state;
      while (!wanted.has(state)) {
        const left = deadline - Date.now();
        if (left <= 0) {
          throw new KtdError("timeout", `${alias} is ${state}, not ${[...wanted].join(" or ")}, after ${timeout}s`, { alias, state });
        }
        const ev = await sub.next(Math.min(left, 1000));
        if (ev === null) continue;
        if (ev.gap) {
          [engine] = await this.status(alias);
          state = engine.state;
          continue;
        }
        if (ev.state == null) continue;
        state = ev.state;
        if (state === "failed" && !wanted.has("failed")) {
          throw new KtdError("load_failed", `${alias} failed while waited for${ev.reason ? `: ${ev.reason}` : ""}`, { alias, state, reason: ev.reason });
        }
        if (wanted.has(state)) [engine] = await this.status(alias);
      }
      return engine;
    } finally {
      sub.close();
    }
  }

  /** A Subscription to these topic prefixes (exact topics with `{exact: true}`), greeted. */
  async subscribe(topics = [""], { exact = false } = {}) {
    await probe(this.eventsPath, "events");
    const sub = new Subscription(this.eventsPath, topics, { exact });
    this._subs.add(sub);
    await sub.ready;
    return sub;
  }

  /** Every event whose topic starts with one of `topics` (default all), as they come. */
  async *events(topics = [""]) {
    const sub = await this.subscribe(topics);
    try {
      for await (const ev of sub) if (!ev.gap) yield ev;
    } finally {
      sub.close();
    }
  }

  /** Close the connection and every subscription (nothing lingers). */
  close() {
    this._failAll(new ConnectionLost("client closed"));
    for (const sub of this._subs) sub.close();
    this._subs.clear();
    if (this._sock) {
      this._sock.close();
      this._sock = null;
    }
  }
}

module.exports = {
  Client,
  Subscription,
  ClientError,
  DaemonUnreachable,
  ConnectionLost,
  ProtocolError,
  KtdError,
  PROTOCOL,
  REPLIES,
  FEATURES_1_0,
  controlPath,
};
