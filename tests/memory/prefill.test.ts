/**
 * Layer-major prefill: a long prompt goes through the model layer by layer in one pass, each
 * trunk piece read once for all its tokens and each routed expert at most once per layer,
 * and the bytes are those of today's prefill in passes of a fixed chunk.
 *
 * Here on a small synthetic model, streamed (no layer pinned, lm_head streamed, an expert
 * cache far smaller than the experts a prompt picks), so that every read shows in the I/O
 * counters: the reference is the same model planned the old way (passes of at most 64
 * tokens, each a full forward over the trunk and its experts). The full-size layout's
 * check (widths, budgets, the CLI paths) is tests/memory/prefill_full.test.ts.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { generate } from "../../lib/generate/decode.ts";
import { Batcher, Cancelled } from "../../lib/generate/batch.ts";
import { Session } from "../../lib/generate/session.ts";
import { conversationState } from "../../lib/chat/turn.ts";
import type { HistoryMessage } from "../../lib/chat/history.ts";
import { renderChatIds } from "../../lib/text/chat.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { type MemoryRequest, planMemory } from "../../lib/memory/plan.ts";
import { takeSnapshot } from "../../lib/memory/stats.ts";
import { expertBlockBytes } from "../../lib/memory/sources.ts";
import { ForwardAborted } from "../../lib/model/forward.ts";
import { Model } from "../../lib/model/model.ts";
import { runRecorded, sameBytes, tinyModel } from "../support/helpers.ts";
import { sameState } from "../support/spec_helpers.ts";

/** Six layers (two MLA), a bank of three rows, 64 experts top-4: enough to pick many. */
const SHAPE = { seed: 29, layers: 6, experts: 64, topK: 4, mlaLayers: [2, 5], blockSize: 2 };
const PROMPT = Array.from({ length: 600 }, (_, i) => (i * 389 + 7) % 1000);
/** Streamed: every block through a one-slot ring, a cache of 6 of the 320 experts. */
const STREAMED: MemoryRequest = { pinLayers: 0, ringSlots: 1, cacheSlots: 6, lmHead: "stream" };

/** The model planned for PROMPT: passes of `chunk` (today), or one layer-major pass. */
async function openPlanned(chunk: number, layerMajor: boolean): Promise<Model> {
  const ckpt = await openCheckpoint(await tinyModel(SHAPE));
  const plan = planMemory(
    ckpt.config,
    ckpt.refs,
    {
      positions: PROMPT.length + 4,
      maxBatch: chunk,
      prefill: layerMajor ? PROMPT.length : undefined,
    },
    STREAMED,
    0,
  );
  return Model.load(ckpt, { plan, trace: true });
}

/** Greedy steps after PROMPT, with the trunk and expert bytes the prefill read. */
async function run(model: Model, steps = 3) {
  const before = takeSnapshot(model);
  const logits: Float32Array[] = [], tokens: number[] = [];
  const reads: { trunk: number; experts: number }[] = [];
  let last = before, prefilled = 0;
  for await (const s of generate(model, PROMPT, { maxTokens: steps, stopIds: [] })) {
    if (s.index === 0) prefilled = model.stream!.trace!.records.length;
    const now = takeSnapshot(model);
    reads.push({
      trunk: now.io!.trunkBytes - last.io!.trunkBytes,
      experts: now.io!.expertBytes - last.io!.expertBytes,
    });
    last = now;
    tokens.push(s.token);
    logits.push(s.logits);
  }
  // The (layer, expert) pairs the prefill asked for: the trace up to the first token.
  const pairs = new Set(
    model.stream!.trace!.records.slice(0, prefilled).flatMap((r) =>
      r.ids.map((id) => `${r.layer}:${id}`)
    ),
  );
  return { tokens, logits, reads, pairs: pairs.size };
}

Deno.test("a 600-token prompt: one trunk read, each expert once per layer, today's bytes", async () => {
  const today = await openPlanned(64, false);
  const models = [today];
  try {
    assert.equal(today.forward.maxTokens, 64, "the reference runs passes of 64 tokens");
    const want = await run(today);
    // Today every one of the 10 passes reads the whole trunk again.
    assert.ok(want.reads[0].trunk > 5 * want.reads[1].trunk, JSON.stringify(want.reads));
    // One expert's read: its block from the page below it (O_DIRECT), at most a cache slot.
    const expertBytes = today.stream!.cache!.slotBytes;
    assert.ok(expertBytes < expertBlockBytes(today.checkpoint.refs) + 2 * 4096);
    for (const chunk of [1, 7, 64]) {
      const model = await openPlanned(chunk, true);
      models.push(model);
      assert.equal(model.forward.maxTokens, PROMPT.length, "the plan holds the whole prompt");
      assert.equal(model.forward.chunk, chunk);
      const got = await run(model);
      assert.deepEqual(got.tokens, want.tokens, `chunk ${chunk}: tokens`);
      got.logits.forEach((l, i) =>
        assert.ok(sameBytes(l, want.logits[i]), `chunk ${chunk}: step ${i}`)
      );
      const [prefill, decode] = got.reads;
      // One pass over the trunk, as a decode step reads; plus at most what the ring reads
      // ahead of the next pass (here the ring is a large share of this small trunk).
      const ring = model.stream!.trunk.plan;
      assert.ok(
        prefill.trunk <= decode.trunk + ring.ringSlots * ring.slotBytes,
        `chunk ${chunk}: prefill read ${prefill.trunk} trunk bytes, a decode step ${decode.trunk}`,
      );
      assert.ok(
        prefill.experts <= got.pairs * expertBytes,
        `chunk ${chunk}: ${prefill.experts} expert bytes for ${got.pairs} distinct experts`,
      );
      // The cache holds 6 experts: without grouping, the 600 tokens' picks would re-read.
      assert.ok(got.pairs > 6 * SHAPE.layers, `${got.pairs} distinct experts`);
    }
  } finally {
    for (const m of models) m.close();
  }
});

Deno.test("an abort between layers stops the pass and puts the state back as it was", async () => {
  const model = await openPlanned(16, true);
  try {
    const want = model.newState(PROMPT.length + 4);
    await model.forward.forward(want, PROMPT.slice(0, 100));
    const wantLogits = await model.forward.forward(want, PROMPT.slice(100));

    // Aborted at the boundary after layer 2: the call throws, the state is as before the call
    // and goes on to the same bytes.
    const state = model.newState(PROMPT.length + 4);
    await model.forward.forward(state, PROMPT.slice(0, 100));
    const stop = new AbortController();
    let layers = 0;
    await assert.rejects(
      () =>
        model.forward.forwardMany([{ state, ids: PROMPT.slice(100) }], {
          betweenLayers: () => {
            if (++layers === 3) stop.abort();
            return Promise.resolve();
          },
          signal: stop.signal,
        }),
      (e) => e instanceof ForwardAborted && e.layer === 2,
    );
    assert.equal(layers, 3, "no layer ran after the abort");
    assert.equal(state.position, 100);
    assert.ok(sameBytes(await model.forward.forward(state, PROMPT.slice(100)), wantLogits));
    sameState(state, want, "after an abort between layers");

    // Aborted before the call: nothing moved, the state goes on to the same bytes.
    const whole = model.newState(PROMPT.length + 4);
    await model.forward.forward(whole, PROMPT.slice(0, 100));
    await assert.rejects(
      () =>
        model.forward.forwardMany([{ state: whole, ids: PROMPT.slice(100) }], {
          signal: stop.signal,
        }),
      ForwardAborted,
    );
    assert.ok(sameBytes(await model.forward.forward(whole, PROMPT.slice(100)), wantLogits));
    sameState(whole, want, "after an abort before the pass");

    // A lone prompt in a batcher: cancelled mid-pass, it stops within a layer.
    const batcher = new Batcher(model.forward, { passTokens: 8 });
    const gone = new AbortController();
    const lane = batcher.lane(gone.signal);
    let seen = 0;
    const inner = model.forward.forwardMany.bind(model.forward);
    model.forward.forwardMany = (seqs, options) =>
      inner(seqs, {
        ...options,
        betweenLayers: async () => {
          if (++seen === 2) gone.abort();
          await options?.betweenLayers?.();
        },
      });
    const cut = model.newState(PROMPT.length + 4);
    await assert.rejects(() => lane.forwardMany([{ state: cut, ids: PROMPT }]), Cancelled);
    assert.equal(seen, 2, "the pass stopped at the layer after the cancel");
    assert.equal(batcher.stats.passes, 0);
    assert.equal(cut.position, 0, "the cancelled pass left the state as it was");
  } finally {
    model.close();
  }
});

Deno.test("a Session (serve, chat, mod.ts) runs a lone prompt as one pass: the same reads and bytes", async () => {
  const today = await openPlanned(64, false);
  const model = await openPlanned(16, true);
  try {
    const want = await run(today);
    // serve and mod.ts: a request no other stream waits beside.
    const session = new Session(model, { retain: 0 });
    const before = takeSnapshot(model);
    const tokens: number[] = [], logits: Float32Array[] = [];
    let prefill = 0;
    for await (const s of session.generate(PROMPT, { maxTokens: 3, stopIds: [] })) {
      if (s.index === 0) prefill = takeSnapshot(model).io!.trunkBytes - before.io!.trunkBytes;
      tokens.push(s.token);
      logits.push(s.logits);
    }
    assert.deepEqual(tokens, want.tokens);
    logits.forEach((l, i) => assert.ok(sameBytes(l, want.logits[i]), `session step ${i}`));
    const stats = session.batcher.stats;
    assert.equal(stats.passes, 3, "one prefill pass, then a decode step each");
    assert.equal(stats.prefillTokens, PROMPT.length);
    const ring = model.stream!.trunk.plan;
    assert.ok(prefill <= want.reads[1].trunk + ring.ringSlots * ring.slotBytes, `${prefill}`);

    // chat: a conversation's state is one forward call, a later turn's new message too.
    const dir = await tinyModel(SHAPE);
    const tokenizer = await Tokenizer.load(dir);
    const messages: HistoryMessage[] = [{ role: "user", content: "a b c ".repeat(120) }];
    const t0 = takeSnapshot(model);
    const { state, prefilled } = await conversationState(session, tokenizer, messages, {});
    const read = takeSnapshot(model).io!.trunkBytes - t0.io!.trunkBytes;
    assert.ok(prefilled > 200, `${prefilled} tokens`);
    assert.ok(read <= want.reads[1].trunk + ring.ringSlots * ring.slotBytes, `${read}`);
    const { ids } = renderChatIds(tokenizer, messages, { addGenerationPrompt: false });
    const fresh = today.newState(ids.length + 1);
    await today.forward.forward(fresh, ids);
    assert.ok(sameBytes(state.lastLogits!, fresh.lastLogits!), "chat state: today's bytes");
  } finally {
    today.close();
    model.close();
  }
});

/** `k3 serve` on `dir` with `flags`, as a child; its /v1 URL once it listens. */
async function spawnServe(dir: string, flags: string[]) {
  const repo = path.resolve(import.meta.dirname!, "..", "..");
  const child = new Deno.Command(path.join(repo, "k3"), {
    args: ["serve", dir, "--port", "0", "--threads", "1", ...flags],
    stdout: "piped",
    stderr: "null",
  }).spawn();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!/listening on (\S+)/.test(out)) {
    const { value, done } = await lines.read();
    if (done) break;
    out += value;
  }
  return { child, lines, url: /listening on (\S+)/.exec(out)?.[1] };
}

Deno.test("k3 run, --prefill-chunk and k3 serve (one client): one pass, the same tokens", async () => {
  const dir = await tinyModel(SHAPE);
  const flags = [
    "--pin-layers",
    "0",
    "--ring-slots",
    "1",
    "--cache-slots",
    "6",
    "--lm-head",
    "stream",
  ];
  const gen = "3";
  const runs = [];
  for (const chunk of [[], ["--prefill-chunk", "64"], ["--prefill-chunk", "5"]]) {
    runs.push(await runRecorded(dir, PROMPT.join(","), gen, [...flags, ...chunk]));
  }
  const [one] = runs;
  for (const r of runs) {
    assert.equal(r.record.memory.plan.pass_tokens, PROMPT.length, "the prompt is one pass");
    assert.deepEqual(r.ids, one.ids);
    assert.ok(sameBytes(r.logits, one.logits), "a chunk changed the logits");
    assert.equal(r.record.steps[0].expert_gb_read, one.record.steps[0].expert_gb_read);
    // One pass over the trunk, as a decode step; plus what the ring read ahead meanwhile
    // (how far it got depends on timing, so the chunks' counts differ by that much).
    const [prefill, decode] = r.record.steps, ring = r.record.memory.plan.trunk;
    assert.ok(
      prefill.trunk_gb_read * 1e9 <= decode.trunk_gb_read * 1e9 + ring.ringSlots * ring.slotBytes,
      JSON.stringify(r.record.steps),
    );
  }

  const served = await spawnServe(dir, [...flags, "--context", "700"]);
  try {
    assert.ok(served.url, "k3 serve is listening");
    const base = served.url!.replace(/\/v1$/, "");
    const res = await fetch(`${served.url}/completions`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "kimi-k3", prompt: PROMPT, max_tokens: Number(gen) }),
    });
    const body = await res.json();
    assert.equal(res.status, 200, JSON.stringify(body));
    assert.deepEqual(body.k3.completion_ids, one.ids.slice(0, body.k3.completion_ids.length));
    const health = await (await fetch(`${base}/health`)).json();
    const passes = health.batch.passes;
    assert.equal(passes.prefill_tokens, PROMPT.length);
    assert.equal(
      passes.passes,
      Number(gen),
      `one prefill pass, then a step each: ${JSON.stringify(passes)}`,
    );
  } finally {
    served.child.kill("SIGTERM");
    await served.lines.cancel();
    await served.child.status;
  }
});
