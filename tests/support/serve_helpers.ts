/**
 * Fixtures for the server tests: a server on the tiny model (127.0.0.1, a free port) with the
 * official clients pointed at it, the independent references (`k3 run` in a child process, the
 * in-process decode loop), and a scripted engine whose answers are fixed token lists (for the
 * exact shape of tool calls, which a random-weight model never writes).
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { stopIdsOf } from "../../lib/engine/open.ts";
import { generate, type GenerateOptions, type TokenPicker } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import type { Engine } from "../../lib/serve/runner.ts";
import { type K3Server, type ServerOptions, startServer } from "../../lib/serve/server.ts";
import { Session, type SessionOptions } from "../../lib/generate/session.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { runK3, tempDir, tinyModel } from "./helpers.ts";

export const MODEL_SEED = 5;

/** Everything a test needs around one running server. */
export interface Served {
  server: K3Server;
  url: string;
  openai: OpenAI;
  anthropic: Anthropic;
  model: Model;
  tokenizer: Tokenizer;
  dir: string;
  logs: string[];
  stopIds: number[];
  session: Session;
}

export interface TestServerOptions extends Partial<ServerOptions> {
  /** Answer with these token lists (one per request, in order) instead of the model. */
  script?: number[][];
  /** How the Session batches (max batch, pass budget). */
  session?: SessionOptions;
}

/** Starts a server on the tiny model for `fn`, and always stops it. */
export async function withServer(
  options: TestServerOptions,
  fn: (s: Served) => Promise<void>,
): Promise<void> {
  const dir = await tinyModel({ seed: MODEL_SEED });
  const model = await Model.open(dir);
  const tokenizer = await Tokenizer.load(dir);
  const stopIds = stopIdsOf(model, tokenizer);
  const logs: string[] = [];
  const session = options.script
    ? scriptedSession(options.script, tokenizer.vocabSize)
    : new Session(model, options.session);
  const engine: Engine = { session, tokenizer, stopIds };
  const server = await startServer(engine, {
    hostname: "127.0.0.1",
    port: 0,
    maxBodyBytes: 1 << 20,
    contextTokens: 4096,
    modelNames: ["tiny"],
    log: (line) => logs.push(line),
    ...options,
  });
  const key = options.apiKey ?? "none";
  const openai = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: key, maxRetries: 0 });
  const anthropic = new Anthropic({ baseURL: server.url, apiKey: key, maxRetries: 0 });
  try {
    await fn({
      server,
      url: server.url,
      openai,
      anthropic,
      model,
      tokenizer,
      dir,
      logs,
      stopIds,
      session,
    });
  } finally {
    await server.shutdown();
    tokenizer.free();
    model.close();
  }
}

/** The k3 extension field of a response (token ids and timing). */
export interface K3Field {
  prompt_ids: number[];
  completion_ids: number[];
  prefill_ids?: number[];
  malformed_tool_calls?: string[];
  timing: { seq: number; queued_behind: number; finish: string; completion_tokens: number };
}

export function k3Of(response: unknown): K3Field {
  return (response as { k3: K3Field }).k3;
}

/** Greedy (or `picker`) ids from the in-process decode loop on a fresh state. */
export async function soloIds(
  s: Served,
  prompt: number[],
  maxTokens: number,
  picker?: TokenPicker,
): Promise<number[]> {
  const ids: number[] = [];
  for await (
    const step of generate(s.model, prompt, { maxTokens, stopIds: s.stopIds, picker })
  ) ids.push(step.token);
  return ids;
}

/** `ids` cut after the first stop id (what a generation that honours stops returns). */
export function untilStop(ids: number[], stopIds: number[]): number[] {
  const at = ids.findIndex((id) => stopIds.includes(id));
  return at < 0 ? ids : ids.slice(0, at + 1);
}

/**
 * `k3 run --ids PROMPT --gen N` in a child process: the generated ids and, with `logits`,
 * every step's fp32 logits from --dump-logits.
 */
export async function runIds(
  dir: string,
  prompt: number[],
  gen: number,
  options: { logits?: boolean } = {},
): Promise<{ ids: number[]; logits: Float32Array[] }> {
  const tmp = tempDir();
  const out = path.join(tmp, "run.json");
  const dump = path.join(tmp, "logits.bin");
  const args = ["run", dir, "--ids", prompt.join(","), "--gen", String(gen), "--out", out];
  if (options.logits) args.push("--dump-logits", dump);
  const run = await runK3(args);
  assert.equal(run.code, 0, run.stderr);
  const ids: number[] = JSON.parse(await Deno.readTextFile(out)).generated_ids;
  const logits: Float32Array[] = [];
  if (options.logits) {
    const bytes = await Deno.readFile(dump);
    const all = new Float32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
    const vocab = all.length / gen;
    for (let i = 0; i < gen; i++) logits.push(all.subarray(i * vocab, (i + 1) * vocab));
  }
  return { ids, logits };
}

/** Plain float64 log softmax of one step's logits (the reference for logprobs). */
export function logSoftmax(logits: Float32Array): Float64Array {
  let max = -Infinity;
  for (const l of logits) max = Math.max(max, l);
  let sum = 0;
  for (const l of logits) sum += Math.exp(l - max);
  const lse = max + Math.log(sum);
  return Float64Array.from(logits, (l) => l - lse);
}

/**
 * A stand-in for the Session: each request gets the next token list, one token per step,
 * honouring maxTokens, stop ids and cancellation. The logits put the scripted id on top.
 */
export function scriptedSession(script: number[][], vocab: number): Session {
  let next = 0;
  const fake = {
    queueDepth: 0,
    async *generate(
      _prompt: number[],
      options: Omit<GenerateOptions, "state" | "onPrefill" | "recompute">,
      onStart?: (reuse: { promptTokens: number; reusedTokens: number }) => void,
    ) {
      const ids = script[next++ % script.length];
      onStart?.({ promptTokens: _prompt.length, reusedTokens: 0 });
      const stops = new Set(options.stopIds ?? []);
      for (let index = 0; index < Math.min(ids.length, options.maxTokens); index++) {
        if (options.signal?.aborted) return;
        const logits = new Float32Array(vocab);
        logits[ids[index]] = 10;
        const stop = stops.has(ids[index]);
        yield { index, token: ids[index], logits, seconds: 0, fed: 1, stop };
        if (stop) return;
        await Promise.resolve();
      }
    },
  };
  return fake as unknown as Session;
}

let scriptTokenizer: Promise<Tokenizer> | undefined;

/**
 * The ids a model would generate for XTML `text` (control names become special ids), with
 * the tiny model's tokenizer: scripts for {@link scriptedSession}.
 */
export async function xtmlIds(text: string): Promise<number[]> {
  scriptTokenizer ??= tinyModel({ seed: MODEL_SEED }).then((dir) => Tokenizer.load(dir));
  return (await scriptTokenizer).encode(text, { allowSpecial: true });
}

/** A fetch with a JSON body; returns the status and the parsed body. */
export async function postJson(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; body: any; headers: Headers }> {
  const r = await fetch(url, {
    method: "POST",
    body: typeof body === "string" ? body : JSON.stringify(body),
    headers: { "content-type": "application/json", ...headers },
  });
  const text = await r.text();
  let parsed: unknown = text;
  try {
    parsed = JSON.parse(text);
  } catch {
    // an SSE body or plain text stays a string
  }
  return { status: r.status, body: parsed, headers: r.headers };
}
