#!/usr/bin/env node
"use strict";
/**
 * ktd-node: a few of ktctl's commands on the Node client, JSON out (as `ktctl --json`).
 * An example of the library, and what the tests drive (tests/clients/test_node_client.py).
 *
 *   ktd-node [--socket PATH] ping | status [ALIAS] | load ALIAS [--timeout S]
 *            | evict ALIAS [--force] | sleep ALIAS | wake ALIAS | usage [--since DAY] [--key K]
 *            | wait ALIAS [--state S]... [--timeout S] | events [TOPIC...] [--count N] | schema
 *
 * Exit codes as ktctl's: 0 ok, 1 failed, 2 usage, 3 ktd unreachable, 4 unknown model,
 * 5 timed out (wait).
 */

const { Client, DaemonUnreachable, KtdError } = require("./index.js");

function parse(argv) {
  const opts = { positional: [], state: [] };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "--force") opts.force = true;
    else if (["--socket", "--timeout", "--since", "--key", "--state", "--count"].includes(a)) {
      const value = argv[++i];
      if (value === undefined) throw new Error(`${a} needs a value`);
      if (a === "--state") opts.state.push(value);
      else opts[a.slice(2)] = value;
    } else if (a.startsWith("--")) throw new Error(`unknown option ${a}`);
    else opts.positional.push(a);
  }
  return opts;
}

function seconds(text) {
  if (text === undefined) return undefined;
  const value = Number(text);
  if (!(value > 0)) throw new Error(`not a positive number of seconds: ${text}`);
  return value;
}

async function run(client, command, args, opts) {
  const [alias] = args;
  const timeout = seconds(opts.timeout);
  switch (command) {
    case "ping":
      return client.ping();
    case "status":
      return { engines: await client.status(alias) };
    case "load": {
      const states = [];
      const engine = await client.load(alias, {
        timeout,
        onProgress: (ev) => ev.state && states.push(ev.state),
      });
      return { engine, states };
    }
    case "evict":
      return { evicted: await client.evict(alias, { force: Boolean(opts.force), timeout }) };
    case "sleep":
      return { engine: await client.sleep(alias, { timeout }) };
    case "wake":
      return { engine: await client.wake(alias, { timeout }) };
    case "usage":
      return { usage: await client.usage({ since: opts.since ?? "", key: opts.key }) };
    case "wait":
      return { engine: await client.wait(alias, { states: opts.state.length ? opts.state : ["ready"], timeout }) };
    case "schema":
      return (await client.schema()).schema;
    case "events": {
      const count = Number(opts.count ?? Infinity);
      const sub = await client.subscribe(args.length ? args : [""]);
      process.stderr.write("ktd-node: subscribed\n"); // greeted: nothing from now on is missed
      let seen = 0;
      for await (const ev of sub) {
        process.stdout.write(JSON.stringify(ev) + "\n");
        if (++seen >= count) break;
      }
      return undefined;
    }
    default:
      throw new Error(`unknown command ${command}`);
  }
}

async function main(argv) {
  let opts;
  try {
    opts = parse(argv);
    if (!opts.positional.length) throw new Error("a command is needed");
  } catch (err) {
    process.stderr.write(`ktd-node: ${err.message}\n`);
    return 2;
  }
  const [command, ...args] = opts.positional;
  const client = new Client({ socket: opts.socket });
  try {
    const doc = await run(client, command, args, opts);
    if (doc !== undefined) process.stdout.write(JSON.stringify(doc, null, 2) + "\n");
    return 0;
  } catch (err) {
    const code = err instanceof KtdError || err instanceof DaemonUnreachable ? err.code : "internal";
    const message = err instanceof KtdError ? err.reason : err.message;
    const detail = err instanceof KtdError ? err.detail : {};
    process.stdout.write(JSON.stringify({ error: { code, message, detail } }, null, 2) + "\n");
    process.stderr.write(`ktd-node: ${code}: ${message}\n`);
    if (err instanceof DaemonUnreachable) return 3;
    if (code === "unknown_model" || code === "not_kt") return 4;
    if (command === "wait" && code === "timeout") return 5;
    return 1;
  } finally {
    client.close();
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
