/**
 * The HTTP transport of `k3 serve` under abuse, which must never take the server down: descriptor
 * exhaustion under a low `ulimit -n`, the connection cap, idle, slow-header and slow-body
 * connections, broken body framing. Each is followed by a healthy request.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { Model } from "../../lib/model/model.ts";
import { type K3Server, type ServerOptions, startServer } from "../../lib/serve/server.ts";
import { Session } from "../../lib/generate/session.ts";
import { stopIdsOf } from "../../lib/engine/open.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { tinyModel } from "../support/helpers.ts";

const enc = new TextEncoder(), dec = new TextDecoder();
const CHAT = "/v1/chat/completions";
const BODY = JSON.stringify({
  model: "tiny",
  messages: [{ role: "user", content: "hi" }],
  max_tokens: 2,
});

async function withServer(
  options: Partial<ServerOptions>,
  fn: (server: K3Server) => Promise<void>,
): Promise<void> {
  const dir = await tinyModel({ seed: 5 });
  const model = await Model.open(dir);
  const tokenizer = await Tokenizer.load(dir);
  const server = await startServer(
    { session: new Session(model), tokenizer, stopIds: stopIdsOf(model, tokenizer) },
    {
      hostname: "127.0.0.1",
      port: 0,
      maxBodyBytes: 1 << 20,
      contextTokens: 4096,
      modelNames: ["tiny"],
      log: () => {},
      ...options,
    },
  );
  try {
    await fn(server);
  } finally {
    await server.shutdown();
    tokenizer.free();
    model.close();
  }
}

/** A chat completion through fetch: the server still answers properly. */
async function healthy(base: string, what: string, model = "tiny"): Promise<void> {
  const r = await fetch(`${base}${CHAT}`, {
    method: "POST",
    body: BODY.replace('"tiny"', JSON.stringify(model)),
    headers: { "content-type": "application/json" },
  });
  assert.equal(r.status, 200, `healthy after ${what}`);
  assert.equal((await r.json()).choices[0].message.role, "assistant", what);
}

/** Everything the server sends on `conn` until it closes it (or `ms` pass: then null). */
async function untilClosed(conn: Deno.Conn, ms: number): Promise<string | null> {
  const chunks: string[] = [];
  const buf = new Uint8Array(65536);
  const timer = setTimeout(() => conn.close(), ms);
  try {
    for (;;) {
      const n = await conn.read(buf);
      if (n === null) break;
      chunks.push(dec.decode(buf.subarray(0, n)));
    }
  } catch {
    return null; // our timer closed it: the server did not
  } finally {
    clearTimeout(timer);
  }
  try {
    conn.close();
  } catch { /* closed */ }
  return chunks.join("");
}

const statusOf = (text: string | null) => Number(/^HTTP\/1\.1 (\d{3})/.exec(text ?? "")?.[1]);

Deno.test("serve transport: idle, slow-header and slow-body connections time out; bad framing is a 400", async () => {
  await withServer({ headerTimeoutMs: 300, bodyTimeoutMs: 300 }, async (server) => {
    const port = server.port, base = server.url;
    const connect = () => Deno.connect({ hostname: "127.0.0.1", port });

    // Idle: never sends a byte. Closed without a response.
    let t0 = performance.now();
    const idle = await untilClosed(await connect(), 5000);
    assert.equal(idle, "", "an idle connection is closed");
    assert.ok(performance.now() - t0 < 3000);
    await healthy(base, "an idle connection");

    // Slow header: a byte every 50 ms, never finishing the head (slowloris).
    const slow = await connect();
    let stop = false;
    (async () => {
      const head = enc.encode(`POST ${CHAT} HTTP/1.1\r\nhost: x\r\nx-pad: ${"a".repeat(200)}`);
      for (let i = 0; i < head.length && !stop; i++) {
        await slow.write(head.subarray(i, i + 1)).catch(() => (stop = true));
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    t0 = performance.now();
    const slowText = await untilClosed(slow, 5000);
    stop = true;
    assert.equal(statusOf(slowText), 408, `slow head: ${slowText}`);
    assert.ok(performance.now() - t0 < 3000, "closed at the header deadline");
    await healthy(base, "a slow head");

    // Slow body: the head, then part of the body, then nothing.
    const stall = await connect();
    await stall.write(enc.encode(
      `POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${BODY.length}\r\n\r\n${
        BODY.slice(0, 10)
      }`,
    ));
    const stallText = await untilClosed(stall, 5000);
    assert.equal(statusOf(stallText), 408, `slow body: ${stallText}`);
    assert.match(stallText!, /"message":"the request body did not arrive in time"/);
    await healthy(base, "a slow body");

    // Framing errors: each a 400 (or 413) with an OpenAI error body, then the connection ends.
    const cases: [string, string, number, RegExp][] = [
      [
        "a body shorter than its Content-Length",
        `content-length: ${BODY.length + 50}\r\n\r\n${BODY}`,
        400,
        /ended after \d+ of the \d+ bytes its Content-Length declares/,
      ],
      [
        "an absurd chunk size",
        `transfer-encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFFFFFFFF\r\n${BODY}`,
        400,
        /bad chunk size/,
      ],
      [
        "a chunk size over the body limit",
        `transfer-encoding: chunked\r\n\r\nfffffffffff\r\n${BODY}`,
        413,
        /over the limit/,
      ],
      ["a chunk that is not hex", `transfer-encoding: chunked\r\n\r\nzz\r\n`, 400, /chunk size/],
      [
        "a chunk longer than its size",
        `transfer-encoding: chunked\r\n\r\n2\r\n${BODY}\r\n0\r\n\r\n`,
        400,
        /longer than its size/,
      ],
      [
        "Content-Length and Transfer-Encoding",
        `content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n`,
        400,
        /both/,
      ],
      ["two Content-Lengths", `content-length: 5, 6\r\n\r\nhello`, 400, /not one byte count/],
      ["a negative Content-Length", `content-length: -5\r\n\r\n`, 400, /not one byte count/],
      ["a folded header", `x-a: 1\r\n  folded\r\ncontent-length: 0\r\n\r\n`, 400, /folded/],
      ["gzip framing", `transfer-encoding: gzip\r\n\r\n`, 400, /not supported/],
    ];
    for (const [what, rest, status, says] of cases) {
      const c = await connect();
      await c.write(
        enc.encode(`POST ${CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n${rest}`),
      );
      await c.closeWrite().catch(() => {});
      const text = await untilClosed(c, 5000);
      assert.equal(statusOf(text), status, `${what}: ${text}`);
      assert.match(text!, says, `${what}: ${text}`);
      assert.match(text!, /"error":\{"message":/, `${what}: an OpenAI error body`);
      await healthy(base, what);
    }
    // A request line that is not HTTP, and a head over the limit.
    for (
      const [what, bytes, status] of [
        ["garbage", "\x16\x03\x01 hello\r\n\r\n", 400],
        ["HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 400],
        ["a 64 KB header", `GET /health HTTP/1.1\r\nx-big: ${"b".repeat(64 << 10)}\r\n\r\n`, 431],
      ] as const
    ) {
      const c = await connect();
      await c.write(enc.encode(bytes)).catch(() => {});
      const text = await untilClosed(c, 5000);
      assert.equal(statusOf(text), status, `${what}: ${text?.slice(0, 200)}`);
      await healthy(base, what);
    }
    // Keep-alive still works: two requests on one connection, chunked body included.
    const ka = await connect();
    const chunked = `${BODY.length.toString(16)}\r\n${BODY}\r\n0\r\n\r\n`;
    await ka.write(enc.encode(
      `GET /health HTTP/1.1\r\nhost: x\r\n\r\nPOST ${CHAT} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n${chunked}`,
    ));
    const both = await untilClosed(ka, 10000);
    assert.equal(both?.match(/HTTP\/1\.1 200 OK/g)?.length, 2, both ?? "");
  });
});

Deno.test("serve transport: connections over the cap get a 503, then service goes on", async () => {
  await withServer({ maxConnections: 4, headerTimeoutMs: 5000 }, async (server) => {
    const port = server.port;
    const held = await Promise.all(
      [0, 1, 2, 3].map(() => Deno.connect({ hostname: "127.0.0.1", port })),
    );
    await new Promise((r) => setTimeout(r, 100));
    const over = await untilClosed(await Deno.connect({ hostname: "127.0.0.1", port }), 3000);
    assert.equal(statusOf(over), 503, over ?? "");
    assert.match(over!, /too_many_connections/);
    for (const c of held) c.close();
    await new Promise((r) => setTimeout(r, 100));
    await healthy(server.url, "the cap");
  });
});

Deno.test("serve transport: `k3 serve` under `ulimit -n 96` keeps serving when descriptors run out", async () => {
  const dir = await tinyModel({ seed: 5 });
  const repo = path.resolve(import.meta.dirname!, "..", "..");
  const child = new Deno.Command("sh", {
    args: [
      "-c",
      'ulimit -n 96 && exec "$0" serve "$1" --port 0 --threads 1 --header-timeout 1',
      path.join(repo, "k3"),
      dir,
    ],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const stderr = new Response(child.stderr).text();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const held: Deno.Conn[] = [];
  try {
    let out = "";
    while (!/listening on (\S+)/.test(out)) {
      const { value, done } = await lines.read();
      if (done) break;
      out += value;
    }
    const url = /listening on (\S+)\/v1/.exec(out)?.[1];
    assert.ok(url, `the server started: ${out}`);
    const port = Number(new URL(url).port);
    // About twice the descriptor limit of idle sockets (what killed it before).
    for (let i = 0; i < 200; i++) {
      try {
        held.push(await Deno.connect({ hostname: "127.0.0.1", port }));
      } catch {
        break; // the listen backlog is full
      }
    }
    assert.ok(held.length >= 96, `opened ${held.length} sockets`);
    // While they are all still held open by the client: idle ones time out (1 s) in turns,
    // and the server answers a healthy request.
    const t0 = performance.now();
    let status = 0;
    while (performance.now() - t0 < 30000) {
      try {
        const r = await fetch(`${url}/health`, { signal: AbortSignal.timeout(10000) });
        status = r.status;
        await r.body?.cancel();
        if (status === 200) break;
      } catch { /* not yet */ }
    }
    assert.equal(status, 200, "healthy while descriptors are exhausted");
    for (const c of held.splice(0)) c.close();
    await healthy(url, "descriptor exhaustion", path.basename(dir));
  } finally {
    for (const c of held) c.close();
    child.kill("SIGTERM");
    await lines.cancel();
  }
  const code = (await child.status).code;
  const err = await stderr;
  assert.equal(code, 0, err);
  assert.doesNotMatch(err, /Uncaught|Too many open files \(os error 24\)\n\s+at /);
  assert.match(err, /out of file descriptors/, "the exhaustion was reached and logged");
});
