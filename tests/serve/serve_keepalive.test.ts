/**
 * A streamed answer that is silent (waiting in the queue, or its prompt prefilling) gets
 * keep-alives, so that a proxy's read timeout does not cut it: `: keep-alive` comments on the
 * OpenAI and Responses streams, `ping` events on Anthropic's. /health shows the progress of
 * the request that is running meanwhile.
 */
import assert from "node:assert/strict";
import { type Served, withServer } from "../support/serve_helpers.ts";

/**
 * Token ids as a completions prompt: long enough that its prefill takes a while; another
 * `salt`, another prompt (a retained state would make a repeat instant).
 */
function idsPrompt(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => (i * 53 + salt * 211 + 11) % 1000);
}

let salt = 0;

async function health(s: Served) {
  return await (await fetch(`${s.url}/health`)).json();
}

/** A prompt that keeps the one sequence of the batch busy: its answer, once it ends. */
async function blocker(s: Served, tokens: number): Promise<() => Promise<void>> {
  const done = fetch(`${s.url}/v1/completions`, {
    method: "POST",
    body: JSON.stringify({ model: "tiny", prompt: idsPrompt(tokens, ++salt), max_tokens: 2 }),
    headers: { "content-type": "application/json" },
  }).then((r) => r.text());
  for (let i = 0; i < 500 && (await health(s)).batch.running.length === 0; i++) {
    await new Promise((r) => setTimeout(r, 5));
  }
  return async () => void await done;
}

/**
 * Makes each layer of a prompt pass take `ms` longer, waiting without holding the event loop
 * (as a pass off the event loop thread does), so that the queue and the layers are seen.
 */
function slowPrefill(s: Served, ms: number): void {
  const forward = s.model.forward, run = forward.forwardMany.bind(forward);
  forward.forwardMany = (seqs, options) => {
    if (!seqs.some((q) => q.ids.length > 1)) return run(seqs, options);
    const inner = options?.betweenLayers;
    const betweenLayers = async () => {
      await inner?.();
      await new Promise((r) => setTimeout(r, ms));
    };
    return run(seqs, { ...options, betweenLayers });
  };
}

const HI = [{ role: "user", content: "hi" }];
const STREAMS = [
  {
    api: "OpenAI chat",
    path: "/v1/chat/completions",
    body: { model: "tiny", messages: HI, max_tokens: 2, stream: true },
    keepAlive: ": keep-alive\n\n",
    token: /"delta":\{"(reasoning_)?content":"[^"]/,
  },
  {
    api: "Responses",
    path: "/v1/responses",
    body: { model: "tiny", input: "hi", max_output_tokens: 16, stream: true },
    keepAlive: ": keep-alive\n\n",
    token: /\.delta\n/,
  },
  {
    api: "Anthropic",
    path: "/v1/messages",
    body: { model: "tiny", messages: HI, max_tokens: 2, stream: true },
    // message_start is followed by one ping in any case; the others are keep-alives.
    keepAlive: 'event: ping\ndata: {"type":"ping"}\n\n',
    token: /event: content_block_delta/,
  },
];

/** The raw text of a streamed answer. */
async function streamText(s: Served, path: string, body: unknown): Promise<string> {
  const res = await fetch(`${s.url}${path}`, {
    method: "POST",
    body: JSON.stringify(body),
    headers: { "content-type": "application/json", "anthropic-version": "2023-06-01" },
  });
  assert.equal(res.status, 200);
  return await res.text();
}

const count = (text: string, part: string) => text.split(part).length - 1;

Deno.test("serve: a stream queued behind another gets keep-alives (comments; Anthropic: ping); /health shows the running request's progress", async () => {
  await withServer({ session: { maxBatch: 1 }, keepAliveSeconds: 0.05 }, async (s) => {
    slowPrefill(s, 40);
    for (const c of STREAMS) {
      const finish = await blocker(s, 60);
      const queued = streamText(s, c.path, c.body);
      // While it waits, /health shows it queued and the other running, with its progress:
      // the layers of the pass that prefills its 60 prompt tokens.
      let h = await health(s);
      const seen: string[] = [];
      // Probed until a probe lands inside the pass (the loop is free while a layer computes,
      // so the first probes may all come during layer 0).
      const inside = (p: string) => /^60 [1-7]\/8$/.test(p);
      for (let i = 0; i < 400 && (h.batch.queue.length === 0 || !seen.some(inside)); i++) {
        const pass = h.batch.running[0]?.pass;
        if (pass) seen.push(`${pass.tokens} ${pass.layers_done}/${pass.layers}`);
        h = await health(s);
      }
      assert.equal(h.batch.queue.length, 1, `${c.api}: ${JSON.stringify(h.batch)}`);
      const running = h.batch.running[0];
      assert.equal(running.prompt_tokens, 60);
      assert.ok(running.prefilled <= 60 && running.generated <= 2, JSON.stringify(running));
      assert.ok(seen.some(inside), `${c.api}: passes seen ${seen}`);
      const text = await queued;
      await finish();
      const first = c.api === "Anthropic" ? 2 : 1;
      assert.ok(count(text, c.keepAlive) >= first, `${c.api}: no keep-alive in\n${text}`);
      // The keep-alives come while nothing else is sent: before the first token's event.
      const firstToken = text.search(c.token);
      assert.ok(firstToken > 0, `${c.api}: no token event in\n${text}`);
      assert.ok(text.lastIndexOf(c.keepAlive, firstToken) > 0, text);
    }
    // Ollama's NDJSON has no comment: it gets none.
    const finish = await blocker(s, 60);
    const ndjson = await streamText(s, "/api/generate", {
      model: "tiny",
      prompt: "hi",
      options: { num_predict: 2 },
    });
    await finish();
    for (const line of ndjson.trim().split("\n")) JSON.parse(line);
  });
});

Deno.test("serve: a lone streamed request gets keep-alives while its own prompt prefills", async () => {
  await withServer({ keepAliveSeconds: 0.02 }, async (s) => {
    const t0 = performance.now();
    const text = await streamText(s, "/v1/completions", {
      model: "tiny",
      prompt: idsPrompt(400, ++salt),
      max_tokens: 2,
      stream: true,
    });
    const ms = performance.now() - t0;
    assert.ok(
      count(text, ": keep-alive\n\n") >= 1,
      `no keep-alive in ${ms.toFixed(0)} ms:\n${text}`,
    );
    assert.ok(text.endsWith("data: [DONE]\n\n"), text);
  });
});
