/**
 * `make bench-serve`: `k3 serve` with 1, 2, 4 and 8 concurrent streaming clients (a benchmark,
 * not a test). Run it under `flock /work/locks/heavy` on a shared machine.
 *
 * Models:
 * - k3, experts cached: a true-width synthetic checkpoint (`make-tiny --shape k3`: K3's widths,
 *   4 layers, 32 experts of which 8 per token), made once under WORK_DIR/k3. The trunk is
 *   streamed (0 layers pinned, lm_head streamed, a 2-slot ring); the expert cache holds every
 *   expert, so after warm-up only the trunk is read.
 * - k3, experts streamed: the same with a cache of one token's experts per MoE layer (24
 *   slots), so the union of the experts the batch chose is read every pass.
 * - k3, trunk from disk (`--models k3-pack`, not run by default): as "experts cached", the
 *   trunk read from a pack (`k3 pack`, made once under WORK_DIR/k3-pack) with O_DIRECT, so
 *   every pass reads it from the disk rather than from the page cache.
 * - tiny: the built-in tiny model, everything resident.
 * - tiny, trunk streamed (`--models tiny-stream`, not run by default): the same with nothing
 *   pinned, so every pass reads the trunk (from the page cache) as a streamed plan does.
 *
 * Each client streams a completion of GEN tokens after its own 32-token prompt (token ids;
 * the stop ids get a logit bias of -100 so every client runs to GEN). For each client count:
 * total tokens/s (all clients' tokens / wall time from the first request to the last token),
 * per-client tokens/s (tokens after the first / time from the first to the last, median over
 * clients), time to first token (median), trunk and expert GB read per generated token (from
 * /health), mean sequences per pass, and the worst /health latency while they ran (probed
 * every 100 ms). Medians of ROUNDS rounds, with the load average before and after.
 *
 * Then, per model, /health while one long prompt (LONG_PROMPT tokens, one pass: the lone
 * prompt takes the plan's whole pass) runs: probed every 10 ms, its median, p99 and worst
 * latency, and how long the pass took. A forward pass must not hold the HTTP server.
 * Then one long prompt next to streams: three clients stream (32-token prompts) and, once each
 * has its first tokens, a fourth sends a LONG-token prompt (--long, default 4000; the server
 * runs with --context LONG + 64). Reported: the long prompt's time to first token, and the
 * streams' worst gap between tokens while it prefilled (from its request to its first token),
 * against their median gap before it came; once with the pass budget by measured cost (the
 * default) and once with the fixed `--pass-tokens 64`. Medians of ROUNDS.
 *
 * First, the kernels a decode pass of T sequences runs, at T = 1, 2, 4, 8: a BF16 trunk matrix
 * (7168 -> 12288, read once for all T) and an MXFP4 expert matrix (3584 -> 3072): their cost
 * relative to T = 1 bounds what batching can gain when the weights are already in memory.
 *
 * Usage: deno run -A bench/serve.ts [WORK_DIR] [--gen N] [--rounds R] [--clients 1,2,4,8]
 *        [--models k3,k3-stream,k3-pack,tiny,tiny-stream] [--long N (0: no long-prompt row)]
 */
import * as path from "node:path";
import { k3 as lib } from "../ffi/library.ts";
import { exists, loadAverage, median } from "./common.ts";

const repo = path.resolve(import.meta.dirname!, "..");
const args = Deno.args;
const flag = (name: string, fallback: string) => {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : fallback;
};
const work = path.resolve(
  args.find((a, i) => !a.startsWith("--") && !args[i - 1]?.startsWith("--")) ??
    path.join(repo, "build/bench-serve"),
);
const ROUNDS = Number(flag("rounds", "3"));
const CLIENTS = flag("clients", "1,2,4,8").split(",").map(Number);
const MODELS = flag("models", "k3,k3-stream,tiny").split(",");
const PROMPT_TOKENS = 32;
/** The long prompt of the /health-during-a-pass row: fits the servers' --context 512. */
const LONG_PROMPT = 480;
const LONG_TOKENS = Number(flag("long", "4000"));
const LONG_STREAMS = 3;

interface ModelSetup {
  name: string;
  dir: string;
  flags: string[];
  gen: number;
  note: string;
}

async function k3(cmd: string[]): Promise<void> {
  const out = await new Deno.Command(path.join(repo, "k3"), {
    args: cmd,
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  if (out.code !== 0) throw new Error(`k3 ${cmd.join(" ")} exited ${out.code}`);
}

/** A running `k3 serve`. */
interface Server {
  url: string;
  stop(): Promise<void>;
}

/** Starts `k3 serve DIR FLAGS --port 0` and waits for its URL. */
async function startServe(dir: string, flags: string[]): Promise<Server> {
  const child = new Deno.Command(path.join(repo, "k3"), {
    args: ["serve", dir, "--port", "0", ...flags],
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  const errors: string[] = [];
  (async () => {
    for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) {
      errors.push(chunk);
    }
  })();
  let text = "";
  while (true) {
    const { value, done } = await lines.read();
    if (done) throw new Error(`k3 serve exited before listening:\n${errors.join("")}`);
    text += value;
    const m = /listening on (http:\/\/\S+)\/v1/.exec(text);
    if (m) {
      (async () => {
        while (!(await lines.read()).done);
      })();
      const plan = errors.join("").split("\n").filter((l) => /^\s|memory plan|batch of/.test(l));
      console.log(plan.map((l) => `    ${l}`).join("\n"));
      return {
        url: m[1],
        stop: async () => {
          child.kill("SIGTERM");
          await child.status;
        },
      };
    }
  }
}

async function health(url: string) {
  // A pooled connection the server just closed (idle keep-alive) fails once: ask again.
  for (let attempt = 0;; attempt++) {
    try {
      return await (await fetch(`${url}/health`)).json();
    } catch (e) {
      if (attempt >= 2) throw e;
    }
  }
}

/**
 * The JSON events of an SSE answer, in order: `[DONE]` and comments (the server's keep-alives
 * while a prompt waits or prefills) are skipped.
 */
async function* sseEvents(r: Response): AsyncGenerator<{ usage?: { completion_tokens: number } }> {
  let buffer = "";
  for await (const chunk of r.body!.pipeThrough(new TextDecoderStream())) {
    buffer += chunk;
    let at;
    while ((at = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      if (!event.startsWith("data: ")) continue;
      const data = event.slice("data: ".length);
      if (data !== "[DONE]") yield JSON.parse(data);
    }
  }
}

/**
 * POSTs a streamed completion of `prompt` (token ids, greedy under `bias`) with its usage
 * event, and returns the response once it is OK.
 */
async function streamCompletion(
  url: string,
  prompt: number[],
  gen: number,
  bias: Record<string, number>,
  signal?: AbortSignal,
): Promise<Response> {
  const r = await fetch(`${url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({
      model: "kimi-k3",
      prompt,
      max_tokens: gen,
      stream: true,
      stream_options: { include_usage: true },
      logit_bias: bias,
    }),
    signal,
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  return r;
}

/** One streaming client: times of its tokens (one SSE chunk per token step). */
async function client(url: string, prompt: number[], gen: number, bias: Record<string, number>) {
  const t0 = performance.now();
  const r = await streamCompletion(url, prompt, gen, bias);
  const times: number[] = [];
  let tokens = 0;
  for await (const body of sseEvents(r)) {
    if (body.usage) tokens = body.usage.completion_tokens;
    else times.push(performance.now());
  }
  return { t0, times, tokens };
}

interface Sample {
  total: number;
  perClient: number;
  ttft: number;
  trunkGb: number;
  expertGb: number;
  sequences: number;
  healthMs: number;
}

/** One round of `n` concurrent clients. */
async function round(
  server: Server,
  n: number,
  gen: number,
  bias: Record<string, number>,
  salt: number,
): Promise<Sample> {
  const before = await health(server.url);
  let probing = true;
  const healthMs: number[] = [];
  const probe = (async () => {
    while (probing) {
      const h0 = performance.now();
      await health(server.url);
      healthMs.push(performance.now() - h0);
      await new Promise((r) => setTimeout(r, 100));
    }
  })();
  const prompts = Array.from(
    { length: n },
    (_, c) =>
      Array.from({ length: PROMPT_TOKENS }, (_, i) => (i * 31 + c * 97 + salt * 13 + 5) % 1000),
  );
  const t0 = performance.now();
  const runs = await Promise.all(prompts.map((p) => client(server.url, p, gen, bias)));
  const end = Math.max(...runs.map((r) => r.times.at(-1) ?? r.t0));
  probing = false;
  await probe;
  const after = await health(server.url);
  const tokens = runs.reduce((a, r) => a + r.tokens, 0);
  const io = (k: string) => ((after.io?.[k] ?? 0) - (before.io?.[k] ?? 0)) / 1e9 / tokens;
  const p0 = before.batch.passes, p1 = after.batch.passes;
  const passes = p1.passes - p0.passes;
  return {
    total: tokens / ((end - t0) / 1000),
    perClient: median(
      runs.map((r) =>
        r.times.length > 1 ? (r.times.length - 1) / ((r.times.at(-1)! - r.times[0]) / 1000) : 0
      ),
    ),
    ttft: median(runs.map((r) => (r.times[0] ?? NaN) - r.t0)),
    trunkGb: io("trunk_bytes"),
    expertGb: io("expert_bytes"),
    sequences: passes
      ? (p1.mean_sequences * p1.passes - p0.mean_sequences * p0.passes) / passes
      : 0,
    healthMs: Math.max(...healthMs),
  };
}

/** The p-th percentile (0..1) of `xs`, nearest rank. */
function percentile(xs: number[], p: number): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(p * s.length) - 1))] ?? NaN;
}

interface PassHealth {
  probes: number;
  p50: number;
  p99: number;
  worst: number;
  passMs: number;
}

/** /health latency (probed every 10 ms) while one long prompt's pass runs. */
async function healthDuringPass(server: Server, salt: number): Promise<PassHealth> {
  const prompt = Array.from({ length: LONG_PROMPT }, (_, i) => (i * 53 + salt * 211 + 11) % 1000);
  let done = false;
  const t0 = performance.now();
  const request = fetch(`${server.url}/v1/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "kimi-k3", prompt, max_tokens: 1 }),
  }).then(async (r) => {
    const text = await r.text();
    done = true;
    if (!r.ok) throw new Error(`HTTP ${r.status}: ${text}`);
  });
  const ms: number[] = [];
  while (!done) {
    const h0 = performance.now();
    const h = await health(server.url);
    if (!done && h.batch.sequences > 0) ms.push(performance.now() - h0);
    await new Promise((r) => setTimeout(r, 10));
  }
  await request;
  const passMs = performance.now() - t0;
  return {
    probes: ms.length,
    p50: percentile(ms, 0.5),
    p99: percentile(ms, 0.99),
    worst: Math.max(...ms),
    passMs,
  };
}

/** A streaming client that pushes each token's time into `times` until done or aborted. */
async function streamInto(
  url: string,
  prompt: number[],
  gen: number,
  bias: Record<string, number>,
  times: number[],
  signal?: AbortSignal,
): Promise<void> {
  try {
    const r = await streamCompletion(url, prompt, gen, bias, signal);
    // One event per token step; a usage event carries none.
    for await (const body of sseEvents(r)) if (!body.usage) times.push(performance.now());
  } catch (e) {
    if (!signal?.aborted) throw e;
  }
}

interface LongSample {
  ttft: number;
  worstGap: number;
  gapBefore: number;
}

/** One round: LONG_STREAMS streams, then the long prompt; see the module comment. */
async function longRound(server: Server, bias: Record<string, number>, salt: number) {
  const stop = new AbortController();
  const times: number[][] = Array.from({ length: LONG_STREAMS }, () => []);
  const streams = times.map((t, c) =>
    streamInto(
      server.url,
      Array.from({ length: PROMPT_TOKENS }, (_, i) => (i * 31 + c * 97 + salt * 13 + 5) % 1000),
      LONG_TOKENS,
      bias,
      t,
      stop.signal,
    )
  );
  while (times.some((t) => t.length < 4)) await new Promise((r) => setTimeout(r, 5));
  const long = Array.from({ length: LONG_TOKENS }, (_, i) => (i * 7 + salt * 11 + 3) % 1000);
  const mine: number[] = [];
  const t0 = performance.now();
  await streamInto(server.url, long, 1, bias, mine);
  const first = mine[0] ?? NaN;
  stop.abort();
  await Promise.all(streams);
  const gaps = (t: number[], from: number, to: number) =>
    t.slice(1).map((x, i) => [t[i], x]).filter(([a, b]) => b > from && a < to).map(([a, b]) =>
      b - a
    );
  return {
    ttft: first - t0,
    worstGap: Math.max(...times.flatMap((t) => gaps(t, t0, first))),
    gapBefore: median(times.flatMap((t) => gaps(t, 0, t0).slice(1))),
  };
}

/** The long-prompt rows of one model: by-cost and fixed pass budget, medians of ROUNDS. */
async function longPromptRows(m: ModelSetup, bias: Record<string, number>): Promise<string[]> {
  const out: string[] = [];
  const context = ["--context", String(LONG_TOKENS + 64)];
  for (
    const [name, extra] of [["by cost (default)", []], ["--pass-tokens 64", [
      "--pass-tokens",
      "64",
    ]]] as const
  ) {
    const server = await startServe(m.dir, [...m.flags, ...context, ...extra]);
    try {
      const samples: LongSample[] = [];
      for (let r = 0; r < ROUNDS; r++) samples.push(await longRound(server, bias, r));
      const med = (k: keyof LongSample) => median(samples.map((s) => s[k]));
      out.push(
        `| ${m.name} | ${name} | ${LONG_TOKENS} | ${(med("ttft") / 1000).toFixed(2)} | ` +
          `${med("worstGap").toFixed(0)} | ${med("gapBefore").toFixed(0)} | ${loadAverage()} |`,
      );
      console.log(`  long prompt: ${out.at(-1)}`);
    } finally {
      await server.stop();
    }
  }
  return out;
}

async function setups(): Promise<ModelSetup[]> {
  const out: ModelSetup[] = [];
  const k3dir = path.join(work, "k3");
  if (MODELS.some((m) => m.startsWith("k3")) && !(await exists(path.join(k3dir, "config.json")))) {
    await Deno.mkdir(k3dir, { recursive: true });
    console.log(`building a --shape k3 checkpoint in ${k3dir} (about 7 GB, once)`);
    await k3(["make-tiny", k3dir, "--shape", "k3", "--seed", "3"]);
  }
  const streamed = ["--pin-layers", "0", "--lm-head", "stream", "--ring-slots", "2"];
  const common = ["--max-batch", "8", "--context", "512", "--retain", "0"];
  const gen = Number(flag("gen", "12"));
  if (MODELS.includes("k3")) {
    out.push({
      name: "k3, experts cached",
      dir: k3dir,
      flags: [...common, ...streamed, "--cache-slots", "96"],
      gen,
      note:
        "true widths, 4 layers, trunk streamed (0 pinned, lm_head streamed), all 96 experts cached",
    });
  }
  if (MODELS.includes("k3-stream")) {
    out.push({
      name: "k3, experts streamed",
      dir: k3dir,
      flags: [...common, ...streamed, "--cache-slots", "24"],
      gen,
      note: "the same, expert cache of 24 slots (one token's experts per MoE layer)",
    });
  }
  if (MODELS.includes("k3-pack")) {
    // The trunk from a pack (`k3 pack`): O_DIRECT reads that bypass the page cache, so every
    // pass reads the trunk from the disk, as on a machine where it does not fit in memory.
    const pack = path.join(work, "k3-pack");
    if (!(await exists(path.join(pack, "trunk.json")))) await k3(["pack", k3dir, pack]);
    out.push({
      name: "k3, trunk from disk",
      dir: k3dir,
      flags: [...common, ...streamed, "--cache-slots", "96", "--trunk", pack],
      gen,
      note: "as 'experts cached', the trunk read from a pack with O_DIRECT (past the page cache)",
    });
  }
  const tiny = path.join(work, "tiny");
  if (MODELS.some((m) => m.startsWith("tiny")) && !(await exists(path.join(tiny, "config.json")))) {
    await Deno.mkdir(tiny, { recursive: true });
    await k3(["make-tiny", tiny, "--seed", "5"]);
  }
  if (MODELS.includes("tiny")) {
    out.push({
      name: "tiny",
      dir: tiny,
      flags: common,
      gen: Number(flag("gen", "64")),
      note: "the tiny synthetic model, resident",
    });
  }
  if (MODELS.includes("tiny-stream")) {
    out.push({
      name: "tiny, trunk streamed",
      dir: tiny,
      flags: [...common, ...streamed],
      gen: Number(flag("gen", "64")),
      note: "the tiny model with its trunk streamed: every pass reads it again",
    });
  }
  return out;
}

/** A logit bias under which the stop ids never win: every client runs to its token count. */
function stopBias(m: ModelSetup): Record<string, number> {
  const cfg = JSON.parse(Deno.readTextFileSync(path.join(m.dir, "config.json")));
  const stops = [cfg.eos_token_id].flat().filter((x: unknown) => typeof x === "number");
  const bias: Record<string, number> = {};
  for (const id of [...stops, cfg.vocab_size - 256 + 1, cfg.vocab_size - 256 + 2]) {
    if (id < cfg.vocab_size) bias[String(id)] = -100;
  }
  return bias;
}

/** Median ms of `fn` over 5 calls (after one warm-up). */
function timed(fn: () => void): number {
  fn();
  const ms: number[] = [];
  for (let r = 0; r < 5; r++) {
    const t0 = performance.now();
    fn();
    ms.push(performance.now() - t0);
  }
  return median(ms);
}

/** The BF16 and MXFP4 matrix kernels at T = 1, 2, 4, 8 (native buffers, random weights). */
function kernelScaling(): string[] {
  const out: string[] = [
    "| kernel | T=1 ms | T=2 | T=4 | T=8 | T=8 / T=1 |",
    "|---|---|---|---|---|---|",
  ];
  const native = (bytes: number, fill: (v: Uint8Array) => void) => {
    const p = lib().k3_alloc(BigInt(bytes))!;
    fill(new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(p, bytes)));
    return p;
  };
  const rand = (v: Uint8Array) => {
    let x = 7;
    for (let i = 0; i < v.length; i++) v[i] = (x = (x * 1103515245 + 12345) >>> 0) >>> 24;
  };
  const row = (name: string, run: (T: number) => void) => {
    const ms = [1, 2, 4, 8].map((T) => timed(() => run(T)));
    out.push(
      `| ${name} | ${ms.map((m) => m.toFixed(2)).join(" | ")} | ${(ms[3] / ms[0]).toFixed(2)} |`,
    );
  };
  {
    const rows = 12288, cols = 7168;
    // BF16 with the exponent kept small (finite weights): every second byte 0x3c.
    const w = native(rows * cols * 2, (v) => {
      rand(v);
      for (let i = 1; i < v.length; i += 2) v[i] = 0x3c;
    });
    const x = new Float32Array(8 * cols).fill(0.01), y = new Float32Array(8 * rows);
    row("BF16 7168->12288 (trunk)", (T) => lib().k3_matmul_bf16(y, w, x, rows, cols, T));
    lib().k3_free(w);
  }
  {
    const rows = 3072, cols = 3584, group = 32;
    const packed = native(rows * cols / 2, rand);
    const scales = native(rows * cols / group, (v) => v.fill(127));
    const x = new Float32Array(8 * cols).fill(0.01), y = new Float32Array(8 * rows);
    row("MXFP4 3584->3072 (expert)", (T) => {
      lib().k3_matmul_mxfp4(y, packed, scales, x, rows, cols, group, T);
    });
    lib().k3_free(packed);
    lib().k3_free(scales);
  }
  return out;
}

async function main() {
  console.log(`bench-serve: load average ${loadAverage()} (1, 5, 15 min)`);
  const kernels = kernelScaling();
  console.log(`\nkernels, median ms of one call [load ${loadAverage()}]\n${kernels.join("\n")}`);
  const table: string[] = ["kernels (ms per call)", ...kernels];
  const passRows: string[] = [
    `\n/health during one ${LONG_PROMPT}-token prompt pass (probed every 10 ms)`,
    "| model | probes | median ms | p99 ms | worst ms | pass ms |",
    "|---|---|---|---|---|---|",
  ];
  const longRows: string[] = [];
  for (const m of await setups()) {
    console.log(`\n${m.name}: ${m.note}; ${m.gen} tokens per client, medians of ${ROUNDS}`);
    const server = await startServe(m.dir, m.flags);
    try {
      const bias = stopBias(m);
      await round(server, 1, Math.min(4, m.gen), bias, 99); // warm-up: caches, JIT
      const rows: Record<number, Sample> = {};
      for (const n of CLIENTS) {
        const samples: Sample[] = [];
        for (let r = 0; r < ROUNDS; r++) samples.push(await round(server, n, m.gen, bias, r));
        const med = (k: keyof Sample) => median(samples.map((s) => s[k]));
        rows[n] = {
          total: med("total"),
          perClient: med("perClient"),
          ttft: med("ttft"),
          trunkGb: med("trunkGb"),
          expertGb: med("expertGb"),
          sequences: med("sequences"),
          healthMs: med("healthMs"),
        };
        const s = rows[n];
        console.log(
          `  ${n} client(s): ${s.total.toFixed(2)} tok/s total (${
            (s.total / rows[CLIENTS[0]].total).toFixed(2)
          }x), ${s.perClient.toFixed(2)} per client, ttft ${s.ttft.toFixed(0)} ms, ` +
            `trunk ${s.trunkGb.toFixed(3)} GB/token, experts ${s.expertGb.toFixed(3)} GB/token, ` +
            `${s.sequences.toFixed(2)} sequences/pass, /health worst ${s.healthMs.toFixed(0)} ms` +
            ` [load ${loadAverage()}]`,
        );
      }
      table.push(`\n${m.name} (${m.note})`);
      table.push(
        "| clients | total tok/s | x 1 client | per client tok/s | TTFT ms | trunk GB/token | " +
          "expert GB/token | seqs/pass | /health worst ms |",
      );
      table.push("|---|---|---|---|---|---|---|---|---|");
      for (const n of CLIENTS) {
        const s = rows[n];
        table.push(
          `| ${n} | ${s.total.toFixed(2)} | ${(s.total / rows[CLIENTS[0]].total).toFixed(2)} | ` +
            `${s.perClient.toFixed(2)} | ${s.ttft.toFixed(0)} | ${s.trunkGb.toFixed(3)} | ` +
            `${s.expertGb.toFixed(3)} | ${s.sequences.toFixed(2)} | ${s.healthMs.toFixed(0)} |`,
        );
      }
      const h = await healthDuringPass(server, 1);
      console.log(
        `  /health during a ${LONG_PROMPT}-token pass of ${h.passMs.toFixed(0)} ms: ${h.probes} ` +
          `probes, median ${h.p50.toFixed(1)} ms, p99 ${h.p99.toFixed(1)} ms, worst ` +
          `${h.worst.toFixed(1)} ms [load ${loadAverage()}]`,
      );
      passRows.push(
        `| ${m.name} | ${h.probes} | ${h.p50.toFixed(1)} | ${h.p99.toFixed(1)} | ` +
          `${h.worst.toFixed(1)} | ${h.passMs.toFixed(0)} |`,
      );
    } finally {
      await server.stop();
    }
    if (LONG_TOKENS > 0) longRows.push(...await longPromptRows(m, stopBias(m)));
  }
  if (longRows.length > 0) {
    table.push(
      `\none ${LONG_TOKENS}-token prompt while ${LONG_STREAMS} clients stream (medians of ${ROUNDS})`,
      "| model | pass budget | prompt tokens | its TTFT s | streams' worst gap ms | " +
        "their median gap before ms | load average after |",
      "|---|---|---|---|---|---|---|",
      ...longRows,
    );
  }
  table.push(...passRows);
  console.log(table.join("\n"));
  console.log(
    `\nload average at the end ${loadAverage()}; synthetic weights (no real checkpoint here)`,
  );
}

await main();
