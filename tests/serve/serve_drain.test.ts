/**
 * Graceful stop of `k3 serve`: on SIGTERM it stops accepting, lets a running stream finish
 * within --drain-timeout, and exits 0; a stream still running when the drain timeout runs out
 * ends with one whole error event saying the server is shutting down (nothing written half).
 */
import assert from "node:assert/strict";
import { runK3, tinyModel } from "../support/helpers.ts";
import { startServe } from "../support/serve_child.ts";
import { MODEL_SEED } from "../support/serve_helpers.ts";

/** Starts `k3 serve` on `dir` with `extra` flags; its base URL once it listens. */
function spawnServe(dir: string, extra: string[]) {
  return startServe([dir, "--threads", "1", "--context", "2048", ...extra]);
}

/** Reads a streamed body until `until(text so far)` holds; returns the reader and the text. */
async function readUntil(body: ReadableStream<Uint8Array>, until: (text: string) => boolean) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let text = "";
  while (!until(text)) {
    const { value, done } = await reader.read();
    if (done) break;
    text += value;
  }
  return { reader, text };
}

async function rest(reader: ReadableStreamDefaultReader<string>): Promise<string> {
  let text = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return text;
    text += value;
  }
}

Deno.test("serve drain: SIGTERM lets a running stream finish, refuses new connections, exits 0", async () => {
  const dir = await tinyModel({ seed: MODEL_SEED });
  const { child, url, stderr } = await spawnServe(dir, ["--drain-timeout", "60"]);
  const r = await fetch(`${url}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "kimi-k3",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 150,
      stream: true,
    }),
  });
  assert.equal(r.status, 200);
  const { reader, text: head } = await readUntil(r.body!, (t) => t.includes('"delta"'));
  child.kill("SIGTERM");
  // Once the listener is closed a new connection is refused.
  let refused = false;
  for (let i = 0; i < 100 && !refused; i++) {
    try {
      await (await fetch(`${url}/health`)).body?.cancel();
      await new Promise((resolve) => setTimeout(resolve, 20));
    } catch {
      refused = true;
    }
  }
  const text = head + await rest(reader);
  assert.ok(refused, "new connections are refused while draining");
  const events = text.split("\n\n").filter((e) => e !== "");
  assert.equal(events.at(-1), "data: [DONE]");
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e.replace(/^data: /, "")));
  const last = chunks.findLast((c) => c.choices?.[0]?.finish_reason);
  assert.equal(last.choices[0].finish_reason, "length", "the stream ran to its end");
  const status = await child.status;
  assert.equal(status.code, 0);
  const log = await stderr;
  assert.match(log, /shutting down: no new connections; running requests have 60 s/);
  assert.match(log, /completion 150, .*, length/);
  // The signal was handled while the stream ran, not after it.
  assert.ok(log.indexOf("shutting down") < log.indexOf("completion 150"), log);
  const bad = await runK3(["serve", dir, "--drain-timeout", "soon"]);
  assert.equal(bad.code, 2, bad.stderr);
  assert.match(bad.stderr, /--drain-timeout wants a number/);
});

Deno.test("serve drain: a stream outlasting --drain-timeout ends with one whole error line", async () => {
  const dir = await tinyModel({ seed: MODEL_SEED });
  const { child, url, stderr } = await spawnServe(dir, ["--drain-timeout", "0.3"]);
  const r = await fetch(`${url}/api/generate`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "kimi-k3",
      prompt: "hi",
      raw: true,
      options: { num_predict: 1900 },
    }),
  });
  assert.equal(r.status, 200);
  assert.match(r.headers.get("content-type") ?? "", /^application\/x-ndjson/);
  const { reader, text: head } = await readUntil(r.body!, (t) => t.includes("\n"));
  const killed = performance.now();
  child.kill("SIGTERM");
  const text = head + await rest(reader);
  assert.ok(text.endsWith("\n"), "the last line is whole");
  const lines = text.slice(0, -1).split("\n").map((l) => JSON.parse(l));
  assert.ok(lines.slice(0, -1).every((l) => l.done === false));
  assert.deepEqual(Object.keys(lines.at(-1)), ["error"]);
  assert.match(lines.at(-1).error, /shutting down: .* drain timeout/);
  const status = await child.status;
  assert.equal(status.code, 0);
  const waited = performance.now() - killed;
  assert.ok(waited < 20_000, `stopped ${Math.round(waited)} ms after SIGTERM`);
  assert.match(await stderr, /, cancelled\n/);
});
