// keyspread from TypeScript: types generated from openapi/openapi.json by openapi-typescript,
// calls made with openapi-fetch. It applies a rebalance, so a server it runs against sees
// keys move (staged, 30 s ahead); every name it makes starts with one prefix, random unless
// given, so it runs on a server that holds other accounts, as often as you like.
//
//   node dist/driver.js http://127.0.0.1:8080 [NAME_PREFIX]    # KEYSPREAD_TOKEN=... if set
//
// Prints one line per step; at the first answer that is not what the contract says, prints
// one line saying what and why on stderr and exits 1.

import { randomBytes } from "node:crypto";
import createClient from "openapi-fetch";
import type { components, paths } from "./api.js";

type Assignment = components["schemas"]["Assignment"];
type Problem = components["schemas"]["Problem"];

const [baseUrl, prefix = `ts-${randomBytes(3).toString("hex")}-`] = process.argv.slice(2);
if (!baseUrl) {
  console.error("usage: node dist/driver.js BASE_URL [NAME_PREFIX]");
  process.exit(2);
}
// On loopback with no token configured, mutations need no Authorization header.
const token = process.env.KEYSPREAD_TOKEN;
const client = createClient<paths>({
  baseUrl,
  headers: token ? { Authorization: `Bearer ${token}` } : {},
});

/** What the run stops with: one line, no stack. */
class Failed extends Error {}

function expect(condition: boolean, what: string): asserts condition {
  if (!condition) {
    throw new Failed(what);
  }
}

/** `what` answered `response`: its status, and the problem's detail when there is one. */
function answered(what: string, response: Response, error?: unknown): string {
  const detail = (error as Problem | undefined)?.detail;
  return `${what}: ${response.status} ${response.statusText}${detail ? `: ${detail}` : ""}`;
}

function step(what: string): void {
  console.log(`ok    ${what}`);
}

/** The whole seconds of a `Cache-Control: max-age=N` header. */
function maxAge(response: Response): number {
  const found = /max-age=(\d+)/.exec(response.headers.get("Cache-Control") ?? "");
  expect(found !== null, `no max-age in ${response.headers.get("Cache-Control")}`);
  return Number(found[1]);
}

async function lookup(account: string, etag?: string) {
  const header = etag === undefined ? {} : { "If-None-Match": etag };
  return client.GET("/keys/{account}", { params: { path: { account }, header } });
}

/**
 * A hot account: three keys on distinct shards, one allocate call, sent with an
 * Idempotency-Key so a retry after a lost answer is answered, not applied, again.
 */
async function allocateHot(account: string): Promise<Assignment> {
  const header = { "Idempotency-Key": crypto.randomUUID() };
  const made = await client.POST("/keys/{account}", {
    params: { path: { account }, header },
    body: { fanout: 3 },
  });
  expect(made.response.status === 201 && made.data !== undefined, answered(`allocate ${account}`, made.response, made.error));
  const hot = made.data;
  expect(hot.fanout === 3 && hot.hash_keys.length === 3, `allocate: ${JSON.stringify(hot)}`);
  expect(hot.hash_key === hot.hash_keys[0], `allocate: hash_key is not hash_keys[0]`);
  const retried = await client.POST("/keys/{account}", {
    params: { path: { account }, header },
    body: { fanout: 3 },
  });
  expect(
    retried.response.status === 201 && retried.response.headers.get("idempotent-replayed") === "true",
    `allocate with the same key: ${retried.response.status} without Idempotent-Replayed`,
  );
  expect(retried.data?.hash_keys.join() === hot.hash_keys.join(), "allocate with the same key: other keys");
  const again = await client.POST("/keys/{account}", { params: { path: { account } } });
  expect(again.response.status === 200, `allocate again: ${again.response.status}`);
  expect(again.data?.hash_keys.join() === hot.hash_keys.join(), "allocate again: other keys");
  step(
    `allocate ${account} fanout 3 -> 201, keys ${hot.hash_keys.join(", ")}; ` +
      `sent again with its Idempotency-Key -> 201 replayed; again -> 200`,
  );
  return hot;
}

/** Lookups carry an ETag; sending it back answers 304 while the keys hold. */
async function revalidate(hot: Assignment): Promise<void> {
  const first = await lookup(hot.account);
  const etag = first.response.headers.get("ETag");
  expect(first.response.status === 200 && etag !== null, `lookup: ${first.response.status}`);
  expect(first.data?.hash_keys.join() === hot.hash_keys.join(), "lookup: other keys");
  const cached = await lookup(hot.account, etag);
  expect(cached.response.status === 304, `lookup If-None-Match: ${cached.response.status}`);
  step(`lookup ${hot.account} -> 200 ETag ${etag}; with If-None-Match -> 304`);
}

/** Records of one sub-key stay in order under one of the account's keys. */
async function subKey(hot: Assignment): Promise<void> {
  const { data, response } = await client.GET("/shard-of", {
    params: { query: { account: hot.account, sub_key: "order-1", shards: 4 } },
  });
  expect(response.status === 200 && data !== undefined, `shard-of: ${response.status}`);
  // The jump hash of "order-1" over 3 keys is 2 (DESIGN.md's test vectors).
  expect(data.index === 2 && data.hash_key === hot.hash_keys[2], `shard-of: ${JSON.stringify(data)}`);
  const id = `shardId-${String(data.shard_index).padStart(12, "0")}`;
  expect(data.shard_id === id, `shard-of: ${data.shard_id}, wanted ${id}`);
  step(`shard-of account=${hot.account} sub_key=order-1 shards=4 -> key 2 on ${data.shard_id}`);
}

/** Preview a rebalance onto 3 shards, apply it staged, and see `next` on a lookup. */
async function stagedRebalance(): Promise<void> {
  for (let i = 1; i <= 6; i++) {
    const made = await client.POST("/keys/{account}", { params: { path: { account: `${prefix}${i}` } } });
    expect(made.response.status === 201, answered(`allocate ${prefix}${i}`, made.response, made.error));
  }
  // On a server that holds other accounts, 3 shards may already be even: the first shard
  // count whose plan moves something.
  let shards = 3;
  let preview = await client.GET("/rebalance/preview", { params: { query: { shards } } });
  while (preview.data?.moves.length === 0 && shards < 64) {
    shards += 1;
    preview = await client.GET("/rebalance/preview", { params: { query: { shards } } });
  }
  expect(preview.data !== undefined, answered("preview", preview.response, preview.error));
  const plan = preview.data;
  const move = plan.moves[0];
  expect(move !== undefined, `preview: no shard count up to 64 needs a move`);
  expect(plan.switch_at === undefined, "preview: a switch_at before any apply");
  const before = await lookup(move.account);
  const etag = before.response.headers.get("ETag");
  expect(etag !== null, "lookup before the apply: no ETag");
  step(`rebalance preview shards=${shards} -> ${plan.moves.length} move(s), ${move.account} key ${move.index} first`);

  const applied = await client.POST("/rebalance", { body: { plan_id: plan.plan_id, switch_after_s: 30 } });
  expect(applied.response.status === 200 && applied.data !== undefined, answered("apply", applied.response, applied.error));
  const switchAt = applied.data.switch_at;
  expect(switchAt !== undefined, "apply: no switch_at");
  expect(applied.data.moves.every((m) => m.switch_at === switchAt), "apply: moves switch apart");
  const secondsAhead = (Date.parse(switchAt) - Date.now()) / 1000;
  expect(secondsAhead > 20 && secondsAhead <= 31, `apply: switch_at ${switchAt} is not 30 s ahead`);

  const now = await lookup(move.account, etag);
  expect(now.response.status === 200 && now.data !== undefined, `lookup after apply: ${now.response.status}`);
  const { hash_keys, next } = now.data;
  expect(next !== undefined && next.switch_at === switchAt, `lookup: next ${JSON.stringify(next)}`);
  expect(hash_keys[move.index] === move.from && next.hash_keys[move.index] === move.to, "lookup: keys");
  expect(maxAge(now.response) <= 30, "lookup: max-age outlives the switch");
  step(`rebalance apply switch_after_s=30 -> 200; lookup ${move.account} -> next until ${switchAt}`);
}

/** A consumer worker joins a stream's group and is told which shards to read. */
async function heartbeat(): Promise<void> {
  const name = `${prefix}orders`;
  const put = await client.PUT("/streams/{name}", {
    params: { path: { name } },
    body: { shard_count: 4 },
  });
  expect(put.response.status === 201, answered(`put stream ${name}`, put.response, put.error));
  const worker = `${prefix}worker-1`;
  const beat = await client.PUT("/streams/{name}/workers/{worker}", {
    params: { path: { name, worker } },
    body: { ttl_s: 30 },
  });
  expect(beat.response.status === 200 && beat.data !== undefined, answered("heartbeat", beat.response, beat.error));
  const leases = beat.data.leases;
  expect(leases.length === 4, `heartbeat: ${JSON.stringify(beat.data)}`);
  expect(leases.every((l) => l.state === "held" && l.epoch === 1 && l.checkpoint === null), "leases");
  expect(Date.parse(beat.data.expires_at) > Date.now(), `expires_at ${beat.data.expires_at}`);
  step(`heartbeat ${worker} on ${name} -> holds ${leases.map((l) => l.shard_id).join(", ")}`);
  const left = await client.DELETE("/streams/{name}/workers/{worker}", { params: { path: { name, worker } } });
  expect(left.response.status === 204, answered("leave", left.response, left.error));
  step(`leave ${worker} -> 204`);
}

async function release(account: string): Promise<void> {
  const gone = await client.DELETE("/keys/{account}", { params: { path: { account } } });
  expect(gone.response.status === 204, answered(`release ${account}`, gone.response, gone.error));
  const after = await lookup(account);
  expect(after.response.status === 404 && after.error !== undefined, `lookup after release: ${after.response.status}`);
  step(`release ${account} -> 204; lookup -> 404: ${after.error.detail}`);
}

/** The cause of a failed fetch, as one line: `connect ECONNREFUSED 127.0.0.1:8080`. */
function unreachable(error: unknown): string | undefined {
  const cause = error instanceof Error ? (error.cause as { message?: string } | undefined) : undefined;
  return cause?.message;
}

try {
  const hot = await allocateHot(`${prefix}hot`);
  await revalidate(hot);
  await subKey(hot);
  await stagedRebalance();
  await heartbeat();
  await release(hot.account);
  step("done");
} catch (error) {
  const cause = unreachable(error);
  if (error instanceof Failed) {
    console.error(`failed: ${error.message}`);
  } else if (cause !== undefined) {
    console.error(`failed: cannot reach keyspread at ${baseUrl}: ${cause}`);
  } else {
    console.error(`failed: ${error instanceof Error ? error.message : String(error)}`);
  }
  process.exit(1);
}
