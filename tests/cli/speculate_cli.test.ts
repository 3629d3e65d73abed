/**
 * Speculation everywhere a user generates: `k3 run --speculate`, `k3 chat --speculate`, the
 * Session default and per-request choice, and mod.ts. Same tokens and logits as without it;
 * the run report counts drafts, tokens per pass and trunk GB per token; bad flags exit 2.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { openModel } from "../../mod.ts";
import { Session } from "../../lib/generate/session.ts";
import {
  newSpeculationStats,
  parseSpeculateField,
  type SpeculationConfig,
} from "../../lib/speculate/speculate.ts";
import OpenAI from "openai";
import { type K3Server, startServer } from "../../lib/serve/server.ts";
import { generateText } from "../../lib/generate/text.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { TextStream } from "../../lib/text/stream.ts";
import { Sampler } from "../../lib/text/sampler.ts";
import { Model } from "../../lib/model/model.ts";
import { runK3, runRecorded, sameBytes, tinyModel } from "../support/helpers.ts";
import { SYNTH_VOCAB_SIZE } from "../../lib/synth/tiny.ts";

const K3 = path.resolve(import.meta.dirname!, "..", "..", "k3");
/**
 * Every id of the tiny vocabulary once, then a repetitive tail: whatever the model emits has
 * occurred before, so the n-gram drafter always has a draft to verify.
 */
const VOCAB = SYNTH_VOCAB_SIZE;
const PROMPT = [...Array.from({ length: VOCAB }, (_, i) => (i * 7) % VOCAB), 5, 17, 300, 5, 17];
const IDS = PROMPT.join(",");

/** `k3 run` on the prompt above, 12 tokens, with `flags`. */
function run(dir: string, flags: string[]) {
  return runRecorded(dir, IDS, "12", flags);
}

Deno.test("run --speculate ngram: the same ids and logits, and the speculation report", async () => {
  const dir = await tinyModel({ seed: 11 });
  const budgets = [[], ["--pin-layers", "0", "--ring-slots", "1", "--cache-slots", "2"]];
  const variants = [["--draft-policy", "always"], ["--draft-max", "2", "--draft-policy", "always"]];
  for (const [n, budget] of budgets.entries()) {
    const plain = await run(dir, budget);
    assert.equal(plain.record.speculation, null);
    const flags = variants[n];
    const spec = await run(dir, [...budget, "--speculate", "ngram", ...flags]);
    assert.deepEqual(spec.record.generated_ids, plain.record.generated_ids, flags.join(" "));
    assert.ok(sameBytes(spec.logits, plain.logits), `${flags.join(" ")}: logits`);
    const s = spec.record.speculation;
    assert.equal(s.method, "ngram");
    assert.match(spec.stderr, /speculation ngram, draft max \d .*drafts proposed \d+, verified/);
    assert.match(spec.stderr, /tokens per pass; trunk \d+\.\d+ GB read per generated token/);
    assert.ok(s.verified > 0 && s.verify_passes > 0, JSON.stringify(s));
    assert.equal(s.verify_passes + s.decode_steps, 11, "one pass per token after the first");
    if (budget.length) assert.ok(spec.record.decode.trunk_bytes > 0, "the trunk streamed");
  }
});

Deno.test("run: speculation flags are checked (exit 2)", async () => {
  const dir = await tinyModel({ seed: 11 });
  for (
    const [flags, message] of [
      [["--draft-max", "3"], /--draft-max needs --speculate/],
      [["--speculate", "model"], /unknown method 'model'/],
      [["--speculate", "ngram", "--draft-max", "0"], /--draft-max wants a whole number from 1/],
      [["--speculate", "ngram", "--draft-policy", "never"], /--draft-policy wants cost or always/],
      [["--speculate", "ngram", "--recompute"], /cannot run with --recompute/],
    ] as const
  ) {
    const r = await runK3(["run", dir, "--ids", IDS, "--gen", "2", ...flags]);
    assert.equal(r.code, 2, `${flags.join(" ")}: ${r.stderr}`);
    assert.match(r.stderr, message);
  }
});

Deno.test("chat --speculate ngram answers exactly as without it", async () => {
  const dir = await tinyModel({ seed: 11 });
  const answer = async (flags: string[]) => {
    const child = new Deno.Command(K3, {
      args: ["chat", dir, "--max-tokens", "10", "--thinking", "off", ...flags],
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const w = child.stdin.getWriter();
    await w.write(new TextEncoder().encode("say it again and again and again\n"));
    await w.close();
    const out = await child.output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    return new TextDecoder().decode(out.stdout);
  };
  const plain = await answer([]);
  assert.ok(plain.length > 0);
  assert.equal(await answer(["--speculate", "ngram", "--draft-policy", "always"]), plain);
});

Deno.test("Session: a default speculation, and a request that turns it off or on", async () => {
  const dir = await tinyModel({ seed: 11 });
  const model = await Model.open(dir);
  const tokenizer = await Tokenizer.load(dir);
  try {
    const always = { method: "ngram", draftMax: 3, policy: "always" } as const;
    // One session, so the long prompt is prefilled once and then resumed.
    const session = new Session(model, { speculation: always });
    const text = async (speculation?: SpeculationConfig | null) => {
      const stats = newSpeculationStats();
      const out = await generateText(session, PROMPT, {
        maxTokens: 12,
        picker: new Sampler({ temperature: 0.7, seed: 3 }),
        stopIds: [],
        stream: new TextStream(tokenizer),
        speculation,
        speculationStats: stats,
      });
      return { ids: out.ids, stats };
    };
    const off = await text(null);
    const byDefault = await text();
    const byRequest = await text({ ...always, draftMax: 2 });
    for (const r of [byDefault, byRequest]) assert.deepEqual(r.ids, off.ids);
    assert.ok(byDefault.stats.verified > 0 && byRequest.stats.verified > 0);
    assert.equal(off.stats.verified + off.stats.decodeSteps, 0, "null turns speculation off");
  } finally {
    tokenizer.free();
    model.close();
  }
});

Deno.test("mod.ts: speculation from openModel or per call gives the same tokens", async () => {
  const dir = await tinyModel({ seed: 11 });
  const always: SpeculationConfig = { method: "ngram", draftMax: 4, policy: "always" };
  const model = await openModel(dir, { speculation: always });
  try {
    const ids = PROMPT;
    const collect = async (params: Parameters<typeof model.generate>[1]) => {
      const out: number[] = [];
      for await (const s of model.generate(ids, params)) out.push(s.token);
      return out;
    };
    const stats = newSpeculationStats();
    const plain = await collect({ maxTokens: 10, speculation: null });
    const spec = await collect({ maxTokens: 10, speculationStats: stats });
    assert.deepEqual(spec, plain);
    assert.equal(stats.verifyPasses + stats.decodeSteps, 9, "it went through the speculative loop");
    assert.ok(stats.verified > 0, "drafts were verified");
    const lower = await collect({ maxTokens: 10, speculation: { method: "ngram", draftMax: 1 } });
    assert.deepEqual(lower, plain);

    // complete and chat report the counters when they speculate, and only then.
    const text = "1, 2, 3, 1, 2, 3, 1, 2,";
    const on = await model.complete(text, { maxTokens: 8, stopAtEos: false }).result;
    const off = await model.complete(text, { maxTokens: 8, stopAtEos: false, speculation: null })
      .result;
    assert.deepEqual(on.ids, off.ids);
    assert.ok(on.speculation && on.speculation.verifyPasses + on.speculation.decodeSteps > 0);
    assert.equal(off.speculation, undefined);
    const messages = [{ role: "user" as const, content: "a b a b a b" }];
    const chatOn = await model.chat(messages, { maxTokens: 8 }).result;
    const chatOff = await model.chat(messages, { maxTokens: 8, speculation: null }).result;
    assert.deepEqual(chatOn.ids, chatOff.ids);
    assert.ok(chatOn.speculation);

    await assert.rejects(
      () => collect({ maxTokens: 2, speculation: { method: "ngram", draftMax: 0 } }),
      /speculation: draftMax must be a whole number from 1 to 16, got 0/,
    );
  } finally {
    model.close();
  }
  // A model opened without speculation refuses a call that asks for it (the plan has no room).
  const plainModel = await openModel(dir);
  try {
    await assert.rejects(async () => {
      for await (const _ of plainModel.generate([1, 2], { maxTokens: 2, speculation: always })) {
        // never reached
      }
    }, /opened without it; pass openModel's speculation option/);
  } finally {
    plainModel.close();
  }
  await assert.rejects(
    // deno-lint-ignore no-explicit-any
    () => openModel(dir, { speculation: { method: "eagle" as any, draftMax: 4 } }),
    /openModel: speculation: method must be one of ngram, got "eagle"/,
  );
});

Deno.test("serve: a server default and a per-request `speculate` field, same answers", async () => {
  const dir = await tinyModel({ seed: 11 });
  const model = await Model.open(dir);
  const tokenizer = await Tokenizer.load(dir);
  const always = { method: "ngram", draftMax: 3, policy: "always" } as const;
  const servers: K3Server[] = [];
  // What each request asked the session for (the wiring from the body to the engine).
  const asked: (SpeculationConfig | null | undefined)[] = [];
  try {
    const start = async (speculation?: SpeculationConfig) => {
      const session = new Session(model, { speculation });
      const generate = session.generate.bind(session);
      session.generate = (prompt, options, onStart) => {
        asked.push(options.speculation);
        return generate(prompt, options, onStart);
      };
      const server = await startServer(
        { session, tokenizer, stopIds: [] },
        {
          hostname: "127.0.0.1",
          port: 0,
          maxBodyBytes: 1 << 20,
          contextTokens: 4096,
          modelNames: ["tiny"],
          log: () => {},
        },
      );
      servers.push(server);
      return new OpenAI({ baseURL: `${server.url}/v1`, apiKey: "none", maxRetries: 0 });
    };
    const plainServer = await start(), specServer = await start(always);
    const ask = async (client: OpenAI, extra: Record<string, unknown> = {}) => {
      const r = await client.completions.create({
        model: "tiny",
        prompt: "abc abc abc abc abc abc",
        max_tokens: 12,
        temperature: 0.8,
        seed: 4,
        ...extra,
      } as OpenAI.CompletionCreateParamsNonStreaming);
      return r.choices[0].text;
    };
    const reference = await ask(plainServer);
    assert.ok(reference.length > 0);
    assert.equal(await ask(specServer), reference, "server default");
    assert.equal(await ask(specServer, { speculate: "off" }), reference, "turned off");
    assert.equal(
      await ask(plainServer, { speculate: { draft_max: 2, policy: "always" } }),
      reference,
      "per request",
    );
    assert.deepEqual(asked, [undefined, undefined, null, {
      method: "ngram",
      draftMax: 2,
      policy: "always",
    }]);
    await assert.rejects(
      () => ask(plainServer, { speculate: { draft_max: 99 } }),
      (e: unknown) =>
        e instanceof OpenAI.APIError && e.status === 400 && /draft_max/.test(e.message),
    );
  } finally {
    for (const s of servers) await s.shutdown();
    tokenizer.free();
    model.close();
  }
});

Deno.test("the `speculate` request field: every accepted form and the refusals", () => {
  assert.equal(parseSpeculateField(undefined), undefined);
  for (const off of [null, false, "off"]) assert.equal(parseSpeculateField(off), null);
  for (const on of [true, "ngram", {}]) {
    assert.deepEqual(parseSpeculateField(on), {
      method: "ngram",
      draftMax: 4,
      ...(typeof on === "object" ? { policy: "cost" } : {}),
    });
  }
  assert.deepEqual(parseSpeculateField({ draft_max: 8, policy: "always" }), {
    method: "ngram",
    draftMax: 8,
    policy: "always",
  });
  for (
    const bad of ["model", 3, [1], { draft_max: 0 }, { draft_max: 2.5 }, { policy: "x" }, { k: 1 }]
  ) {
    assert.throws(() => parseSpeculateField(bad), /speculate: /, JSON.stringify(bad));
  }
});
