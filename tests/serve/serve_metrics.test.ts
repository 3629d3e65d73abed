/**
 * GET /metrics: parsed by a Prometheus text-format parser, and every counter and histogram
 * moves as requests run (on the tiny model under a memory plan, so that trunk and expert reads
 * and the expert cache count, with speculation on, so that drafts count), and the queue depth
 * gauge shows waiting requests.
 */
import assert from "node:assert/strict";
import parsePrometheusTextFormat from "parse-prometheus-text-format";
import { stopIdsOf } from "../../lib/engine/open.ts";
import { Session } from "../../lib/generate/session.ts";
import { startServer } from "../../lib/serve/server.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { tinyModel } from "../support/helpers.ts";
import { MODEL_SEED, postJson } from "../support/serve_helpers.ts";
import { openUnder } from "../support/spec_helpers.ts";

interface Family {
  name: string;
  type: string;
  metrics: { value?: string; count?: string; labels?: Record<string, string> }[];
}

async function scrape(url: string): Promise<Map<string, Family>> {
  const r = await fetch(`${url}/metrics`);
  assert.equal(r.status, 200);
  assert.match(r.headers.get("content-type") ?? "", /^text\/plain; version=0\.0\.4/);
  const families = parsePrometheusTextFormat(await r.text()) as Family[];
  return new Map(families.map((f) => [f.name, f]));
}

/** A counter's total over its labels, or a histogram's observation count. */
function total(f: Family | undefined): number {
  if (!f) return NaN;
  return f.metrics.reduce((a, m) => a + Number(f.type === "HISTOGRAM" ? m.count : m.value), 0);
}

function labelled(f: Family | undefined, labels: Record<string, string>): number {
  const m = f?.metrics.find((m) => Object.entries(labels).every(([k, v]) => m.labels?.[k] === v));
  return Number(m?.value ?? 0);
}

Deno.test("serve metrics: every counter moves as requests run, parsed as Prometheus text", async () => {
  const dir = await tinyModel({ seed: MODEL_SEED });
  const model = await openUnder(dir, { pinLayers: 0, ringSlots: 1, cacheSlots: 64 });
  const tokenizer = await Tokenizer.load(dir);
  const session = new Session(model, {
    retain: 2,
    maxBatch: 1,
    speculation: { method: "ngram", draftMax: 4, policy: "always" },
    draftLimit: 4,
  });
  const server = await startServer({ session, tokenizer, stopIds: stopIdsOf(model, tokenizer) }, {
    hostname: "127.0.0.1",
    port: 0,
    maxBodyBytes: 1 << 20,
    contextTokens: 256,
    modelNames: ["tiny"],
    log: () => {},
  });
  try {
    const before = await scrape(server.url);
    const counters = [...before.values()].filter((f) => f.type !== "GAUGE");
    assert.ok(counters.length >= 18, `${counters.length} counters and histograms`);
    const chat = {
      model: "tiny",
      messages: [{ role: "user", content: "la la la la la la la la la la la la" }],
      max_tokens: 12,
    };
    // The same prompt twice: the second resumes the first's retained state.
    for (let i = 0; i < 2; i++) {
      assert.equal((await postJson(`${server.url}/v1/chat/completions`, chat)).status, 200);
    }
    // Speculation: a token biased to always win repeats, so its n-gram drafts are accepted.
    const biased = await postJson(`${server.url}/v1/completions`, {
      model: "tiny",
      prompt: "la la la",
      max_tokens: 16,
      logit_bias: { "300": 100 },
    });
    assert.equal(biased.status, 200);
    const bad = await postJson(`${server.url}/v1/chat/completions`, { ...chat, top_k: "x" });
    assert.equal(bad.status, 400);
    // Three at once through a batch of one: two wait, and a scrape in between sees them.
    let deepest = 0;
    const running = [0, 1, 2].map((i) =>
      postJson(`${server.url}/api/chat`, {
        model: "tiny",
        stream: false,
        messages: [{ role: "user", content: `request ${i}` }],
        options: { num_predict: 8 },
      })
    );
    let done = false;
    const all = Promise.all(running).finally(() => done = true);
    while (!done) {
      deepest = Math.max(deepest, total((await scrape(server.url)).get("k3_queue_depth")));
    }
    for (const r of await all) assert.equal(r.status, 200);
    assert.ok(deepest >= 1, `queue depth seen ${deepest}`);

    const after = await scrape(server.url);
    const stale = counters.filter((f) => !(total(after.get(f.name)) > total(f)))
      .map((f) => `${f.name}: ${total(f)} -> ${total(after.get(f.name))}`);
    assert.deepEqual(stale, [], "every counter and histogram moved");
    const requests = after.get("k3_http_requests_total");
    assert.equal(labelled(requests, { api: "/v1/chat/completions", status: "200" }), 2);
    assert.equal(labelled(requests, { api: "/v1/completions", status: "200" }), 1);
    assert.equal(labelled(requests, { api: "/v1/chat/completions", status: "400" }), 1);
    assert.equal(labelled(requests, { api: "/api/chat", status: "200" }), 3);
    assert.ok(labelled(requests, { api: "/metrics", status: "200" }) >= 2);
    const generated = after.get("k3_generated_tokens_total");
    assert.equal(labelled(generated, { api: "/api/chat" }), 24);
    const ratio = total(after.get("k3_expert_cache_hit_ratio"));
    assert.ok(ratio > 0 && ratio < 1, `expert cache hit ratio ${ratio}`);
    assert.equal(total(after.get("k3_queue_depth")), 0);
  } finally {
    await server.shutdown();
    model.close();
    tokenizer.free();
  }
});
