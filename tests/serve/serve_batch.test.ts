/**
 * Batching seen through the official `openai` client: `k3 serve` batches concurrent
 * requests (continuous batching) and each still gets the tokens it gets alone, greedy or
 * seeded, whatever joins or leaves; a long prompt prefills in chunks between the other
 * streams' steps; a full batch makes requests wait; `n` choices share one prefill and equal
 * seeded solo runs. The solo reference is the in-process decode loop on a fresh state.
 */
import assert from "node:assert/strict";
import OpenAI from "openai";
import { Sampler, type SamplingOptions } from "../../lib/text/sampler.ts";
import {
  type K3Field,
  k3Of,
  type Served,
  soloIds,
  untilStop,
  withServer,
} from "../support/serve_helpers.ts";

/** Token-id prompts (completions take them as they are), different per `salt`. */
function idsPrompt(n: number, salt: number): number[] {
  return Array.from({ length: n }, (_, i) => (i * 53 + salt * 211 + 11) % 1000);
}

/** Seeded sampling with penalties, as the API and the Sampler name it. */
function sampling(seed: number): { api: Record<string, number>; sampler: SamplingOptions } {
  return {
    api: { temperature: 1, top_p: 0.9, presence_penalty: 0.5, seed },
    sampler: { temperature: 1, topP: 0.9, presencePenalty: 0.5, seed },
  };
}

interface Ask {
  prompt: number[];
  maxTokens: number;
  seed?: number;
  stream: boolean;
}

/** The solo ids of `a` (cut at a stop id, as the server cuts). */
async function solo(s: Served, a: Ask): Promise<number[]> {
  const picker = a.seed === undefined ? undefined : new Sampler(sampling(a.seed).sampler);
  return untilStop(await soloIds(s, a.prompt, a.maxTokens, picker), s.stopIds);
}

/**
 * One completions request through the client; `onChunk(i)` hears each streamed chunk. The
 * result's completion ids come from the k3 field (the usage chunk when streamed).
 */
async function ask(
  s: Served,
  a: Ask,
  onChunk?: (i: number) => boolean | void,
  signal?: AbortSignal,
): Promise<K3Field> {
  const body = {
    model: "tiny",
    prompt: a.prompt,
    max_tokens: a.maxTokens,
    ...(a.seed === undefined ? {} : sampling(a.seed).api),
  };
  if (!a.stream) return k3Of(await s.openai.completions.create(body, { signal }));
  const stream = await s.openai.completions.create(
    { ...body, stream: true, stream_options: { include_usage: true } },
    { signal },
  );
  let k3: K3Field | undefined, i = 0;
  for await (const chunk of stream) {
    k3 = (chunk as { k3?: K3Field }).k3 ?? k3;
    if (onChunk?.(i++)) break;
  }
  return k3!;
}

async function health(s: Served) {
  return await (await fetch(`${s.url}/health`)).json();
}

Deno.test("serve: 1, 2, 4 and 8 concurrent requests each equal the request alone (greedy and seeded)", async () => {
  await withServer({}, async (s) => {
    for (const n of [1, 2, 4, 8]) {
      const asks: Ask[] = Array.from({ length: n }, (_, i) => ({
        prompt: idsPrompt(4 + 9 * i, n + i),
        maxTokens: 32 + 4 * (i % 3),
        seed: i % 2 ? 40 + i : undefined,
        stream: i % 2 === 0,
      }));
      const want: number[][] = [];
      for (const a of asks) want.push(await solo(s, a));
      const before = (await health(s)).batch.passes.passes;
      const got = await Promise.all(asks.map((a) => ask(s, a)));
      got.forEach((g, i) => assert.deepEqual(g.completion_ids, want[i], `n ${n}, request ${i}`));
      const h = await health(s);
      assert.ok(h.batch.passes.passes > before);
      // The identity is only worth something if the requests really shared passes.
      if (n > 1) {
        assert.ok(h.batch.passes.max_sequences >= 2, `n ${n}: ${JSON.stringify(h.batch.passes)}`);
      }
    }
    assert.equal((await health(s)).batch.passes.max_sequences, 8, "8 requests shared a pass");
  });
});

Deno.test("serve: requests joining and leaving mid-stream (one disconnects) equal the request alone", async () => {
  await withServer({ session: { passTokens: 16 } }, async (s) => {
    const asks: Ask[] = [
      { prompt: idsPrompt(6, 1), maxTokens: 300, stream: true }, // the others join it
      { prompt: idsPrompt(70, 2), maxTokens: 30, seed: 3, stream: true },
      { prompt: idsPrompt(33, 3), maxTokens: 8, stream: false },
      { prompt: idsPrompt(12, 4), maxTokens: 400, seed: 4, stream: true }, // leaves early
      { prompt: idsPrompt(45, 5), maxTokens: 20, seed: 5, stream: true },
    ];
    const want: number[][] = [];
    for (const a of asks) want.push(await solo(s, a));
    const runs: (Promise<K3Field | null> | undefined)[] = [];
    const gone = new AbortController();
    let received = 0;
    const launch = (k: number) => {
      if (k >= asks.length || runs[k]) return;
      const next = (i: number) => {
        // Request k > 0 starts once request 0 has streamed 4k chunks, so it joins a running
        // batch; it then leaves as it ends (or, request 3, as its client hangs up).
        if (k === 0 && i % 4 === 3) launch((i + 1) / 4);
        if (k === 3) received = i + 1;
        return k === 3 && i === 9; // request 3 hangs up after 10 chunks
      };
      runs[k] = ask(s, asks[k], next, k === 3 ? gone.signal : undefined).catch(() => null);
    };
    launch(0);
    for (let k = 0; k < asks.length; k++) {
      while (!runs[k]) await new Promise((r) => setTimeout(r, 2));
      const got = await runs[k];
      if (k === 3) continue;
      assert.deepEqual(got!.completion_ids, want[k], `request ${k}`);
    }
    for (let i = 0; i < 200 && (await health(s)).batch.sequences > 0; i++) {
      await new Promise((r) => setTimeout(r, 10));
    }
    const h = await health(s);
    assert.equal(h.batch.sequences, 0, "every request left the batch");
    const cancelled = h.recent.find((t: { finish: string }) => t.finish === "cancelled");
    assert.ok(cancelled, "the disconnected request ended as cancelled");
    assert.ok(
      cancelled.completion_tokens < 200 && cancelled.completion_tokens >= received,
      `the disconnected request generated ${cancelled.completion_tokens} (received ${received})`,
    );
    assert.ok(h.batch.passes.max_sequences >= 3, JSON.stringify(h.batch.passes));
  });
});

Deno.test("serve: a long prefill runs in chunks between a stream's steps; /health answers meanwhile", async () => {
  await withServer({}, async (s) => {
    const long: Ask = { prompt: idsPrompt(2000, 7), maxTokens: 2, stream: false };
    // Every pass: did it run a prompt chunk, and did it run a decode step with it?
    const passes: { prefill: boolean; decode: boolean }[] = [];
    const forward = s.model.forward, run = forward.forwardMany.bind(forward);
    forward.forwardMany = (seqs, options) => {
      passes.push({
        prefill: seqs.some((q) => q.ids.length > 1),
        decode: seqs.some((q) => q.ids.length === 1),
      });
      return run(seqs, options);
    };
    // The same prefill alone first: how long the whole prompt takes in one go.
    const t0 = performance.now();
    await soloIds(s, long.prompt, 1);
    const alone = performance.now() - t0;

    // A stream that is decoding when the long prompt arrives.
    const gaps: number[] = [];
    let last = 0, longDone = false, longStarted = false;
    let startLong!: () => void;
    const started = new Promise<void>((r) => (startLong = r));
    const short = ask(s, { prompt: idsPrompt(5, 8), maxTokens: 3000, stream: true }, (i) => {
      const now = performance.now();
      if (longStarted && !longDone && last) gaps.push(now - last);
      last = now;
      if (i === 5) startLong();
      return longDone && gaps.length > 0;
    });
    await started;
    longStarted = true;
    const healthMs: number[] = [];
    const probe = (async () => {
      while (!longDone) {
        const h0 = performance.now();
        await health(s);
        healthMs.push(performance.now() - h0);
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    const t1 = performance.now();
    const from = passes.length;
    const result = await ask(s, long);
    const during = passes.slice(from).filter((p) => p.prefill);
    const prefill = performance.now() - t1;
    longDone = true;
    await short;
    await probe;
    assert.equal(result.completion_ids.length, 2);
    const worst = Math.max(...gaps), worstHealth = Math.max(...healthMs);
    const summary = `long prompt alone ${alone.toFixed(0)} ms, batched ${prefill.toFixed(0)} ms; ` +
      `the stream's ${gaps.length} gaps meanwhile: worst ${worst.toFixed(0)} ms; ` +
      `/health worst ${worstHealth.toFixed(0)} ms of ${healthMs.length}`;
    console.log(summary);
    // The prompt ran in chunks of the pass budget, each in a pass with the stream's step.
    assert.ok(during.length >= 2000 / 64, `${during.length} prefill passes`);
    assert.deepEqual(during.filter((p) => !p.decode), [], "no prefill pass without the stream");
    // Unchunked, the stream would stall for the whole prefill (and so would /health).
    // Generous (the machine may be shared): half of it, or two seconds on a fast machine.
    const bound = Math.max(alone / 2, 2000);
    assert.ok(gaps.length >= 10, `the stream kept going: ${summary}`);
    assert.ok(worst < bound, summary);
    assert.ok(worstHealth < bound, summary);
  });
});

Deno.test("serve: a full batch makes a request wait; --max-batch bounds n; a queued cancel leaves", async () => {
  await withServer({ session: { maxBatch: 2 } }, async (s) => {
    const asks: Ask[] = [0, 1, 2].map((i) => ({
      prompt: idsPrompt(5 + i, 20 + i),
      // Long enough that /health, asked at the first request's 10th chunk, is answered while
      // the first two still run (40 tokens were over in ~110 ms, too soon on a loaded machine).
      maxTokens: 200,
      seed: i,
      stream: true,
    }));
    const want: number[][] = [];
    for (const a of asks) want.push(await solo(s, a));
    let seen: { sequences: number; queue: unknown[] } | undefined;
    const runs = asks.map((a, k) =>
      ask(s, a, (i) => {
        if (k === 0 && i === 10) {
          health(s).then((h) => (seen = h.batch));
        }
      })
    );
    const got = await Promise.all(runs);
    got.forEach((g, i) => assert.deepEqual(g.completion_ids, want[i], `request ${i}`));
    assert.ok(seen, "health was read");
    assert.equal(seen!.sequences, 2, "two generate at once");
    assert.equal(seen!.queue.length, 1, "the third waits");
    const h = await health(s);
    assert.equal(h.batch.max_batch, 2);
    assert.equal(h.batch.passes.max_sequences, 2);
    const timing = got.map((g) => g.timing);
    assert.ok(Math.max(...timing.map((t) => (t as unknown as { queue_ms: number }).queue_ms)) > 0);

    await assert.rejects(
      s.openai.completions.create({ model: "tiny", prompt: "x", max_tokens: 2, n: 3 }),
      (e) => e instanceof OpenAI.BadRequestError && /--max-batch/.test(e.message),
    );
  });
});

Deno.test("serve: n = 3 returns three choices that equal seeded solo runs (seed, seed+1, seed+2), prefilled once", async () => {
  await withServer({}, async (s) => {
    const messages = [{ role: "user" as const, content: "Name three colours." }];
    const seed = 21;
    const request = {
      model: "tiny",
      messages,
      max_tokens: 12,
      n: 3,
      ...sampling(seed).api,
    };
    const before = (await health(s)).batch.passes.prefill_tokens;
    const whole = await s.openai.chat.completions.create(request);
    const after = (await health(s)).batch.passes.prefill_tokens;
    assert.equal(whole.choices.length, 3);
    assert.deepEqual(whole.choices.map((c) => c.index), [0, 1, 2]);
    const k3 = k3Of(whole) as K3Field & { choices: K3Field[] };
    const promptIds = k3.prompt_ids;
    assert.equal(after - before, promptIds.length, "the prompt was prefilled once");
    const want: number[][] = [];
    for (let i = 0; i < 3; i++) {
      const picker = new Sampler(sampling(seed + i).sampler);
      want.push(untilStop(await soloIds(s, promptIds, 12, picker), s.stopIds));
    }
    assert.deepEqual(k3.choices.map((c) => c.completion_ids), want);
    assert.notDeepEqual(want[0], want[1], "the seeds differ, so do the choices");
    assert.equal(
      whole.usage?.completion_tokens,
      want.reduce((a, w) => a + w.length, 0),
      "usage counts every choice",
    );
    assert.equal(whole.usage?.prompt_tokens, promptIds.length);

    // Streamed: chunks carry their choice's index and add up to the whole answer.
    const stream = await s.openai.chat.completions.create({
      ...request,
      stream: true,
      stream_options: { include_usage: true },
    });
    const text = ["", "", ""], reasoning = ["", "", ""], finish: (string | null)[] = [];
    let usage: OpenAI.CompletionUsage | undefined;
    for await (const chunk of stream) {
      usage = chunk.usage ?? usage;
      for (const c of chunk.choices) {
        const d = c.delta as { content?: string; reasoning_content?: string };
        text[c.index] += d.content ?? "";
        reasoning[c.index] += d.reasoning_content ?? "";
        if (c.finish_reason) finish[c.index] = c.finish_reason;
      }
    }
    whole.choices.forEach((c, i) => {
      const m = c.message as unknown as { content: string; reasoning_content: string | null };
      assert.equal(text[i], m.content, `choice ${i} content`);
      assert.equal(reasoning[i], m.reasoning_content ?? "", `choice ${i} reasoning`);
      assert.equal(finish[i], c.finish_reason);
    });
    assert.equal(usage?.completion_tokens, whole.usage?.completion_tokens);

    // Completions too.
    const text3 = await s.openai.completions.create({
      model: "tiny",
      prompt: idsPrompt(9, 2),
      max_tokens: 6,
      n: 3,
      ...sampling(seed).api,
    });
    const k3t = k3Of(text3) as K3Field & { choices: K3Field[] };
    for (let i = 0; i < 3; i++) {
      const picker = new Sampler(sampling(seed + i).sampler);
      const ids = untilStop(await soloIds(s, idsPrompt(9, 2), 6, picker), s.stopIds);
      assert.deepEqual(k3t.choices[i].completion_ids, ids, `completion choice ${i}`);
      assert.equal(text3.choices[i].index, i);
    }
  });
});
