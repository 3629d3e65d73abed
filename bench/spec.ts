/**
 * `make bench-spec`: speculative decoding with the trunk streamed (a benchmark, not a test).
 *
 * 1. Builds a `--shape k3` synthetic checkpoint (true K3 widths, 4 layers, 32 experts top-8)
 *    and its trunk pack, once, under build/bench-spec/.
 * 2. Loads it with the trunk streamed from the pack (0 pinned layers, 2 ring slots) and a
 *    small expert cache (16 slots), page cache dropped when root.
 * 3. Verify cost: one verify pass over 1 + k positions (the forward pass, then the replay of
 *    every position: the dearest rewind) against one decode step, for k = 1, 2, 4, 8, each
 *    from a copy of the same state; forward and replay timed apart.
 * 4. Tokens/s of decoding after the first token: plain; perfect drafts at k = 4 (the plain
 *    run's own tokens); n-gram drafts on a repetitive prompt (cost policy); drafts that
 *    never match, under the cost policy (what the default does) and verified every time
 *    (what it would cost without a policy). Trunk and expert GB read per generated token.
 *    Every speculative run is checked against plain decoding's tokens.
 * 5. The BF16 matmul kernel alone at a K3 shape (12288 x 7168, from resident memory larger than
 *    the caches) for T = 1, 2, 3, 5, 9: what one more position costs where compute is not
 *    hidden behind a disk read.
 * Every figure is the median of `--rounds` (3) rounds; the load average is printed with them.
 *
 * Honest scope: synthetic random weights. The n-gram drafter is right only when the random
 * model happens to repeat itself; real text repeats more. Routing is random too, so the
 * positions of a verify pass pick nearly independent experts (real routing is correlated
 * between neighbouring tokens, which would make the union smaller).
 *
 * Usage: deno run -A bench/spec.ts [WORK_DIR] [--gen N] [--rounds N] [--json FILE]
 */
import * as path from "node:path";
import { dropCaches, exists, median } from "./common.ts";
import { k3, k3Isa, k3Threads } from "../ffi/library.ts";
import { openCheckpoint } from "../lib/checkpoint/checkpoint.ts";
import { openTrunkPack } from "../lib/layout/pack.ts";
import { generate, type GenerateOptions } from "../lib/generate/decode.ts";
import { planMemory } from "../lib/memory/plan.ts";
import { Model } from "../lib/model/model.ts";
import { PassRecord } from "../lib/model/rewind.ts";
import type { SequenceState } from "../lib/model/state.ts";
import { NgramDrafter, ScriptedDrafter } from "../lib/speculate/drafter.ts";
import { CostPolicy, type DraftPolicy, FixedPolicy, PassCost } from "../lib/speculate/policy.ts";
import {
  newSpeculationStats,
  type SpeculateOptions,
  type SpeculationStats,
} from "../lib/speculate/speculate.ts";

const repo = path.resolve(import.meta.dirname!, "..");
const args = Deno.args;
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(name);
  const v = i >= 0 ? Number(args[i + 1]) : fallback;
  if (!(Number.isInteger(v) && v >= 1)) throw new Error(`${name} wants a whole number >= 1`);
  return v;
};
const work = path.resolve(
  args.find((a, i) => !a.startsWith("--") && !args[i - 1]?.startsWith("--")) ??
    path.join(repo, "build/bench-spec"),
);
const GEN = flag("--gen", 32);
const ROUNDS = flag("--rounds", 3);
const jsonOut = args.includes("--json") ? args[args.indexOf("--json") + 1] : undefined;
const modelDir = path.join(work, "model"), trunkDir = path.join(work, "trunk");
/** Expert cache slots: two tokens' worth of one layer's top-8. */
const CACHE_SLOTS = 16;
const KS = [1, 2, 4, 8];
const DRAFT_MAX = 4;

async function k3cli(argv: string[]): Promise<void> {
  const out = await new Deno.Command(path.join(repo, "k3"), {
    args: argv,
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  if (out.code !== 0) throw new Error(`k3 ${argv.join(" ")} exited ${out.code}`);
}

/** Trunk and expert bytes read so far. */
function bytesRead(model: Model): { trunk: number; experts: number } {
  const t = model.stream!.pool.totals();
  return { trunk: t.trunkBytes, experts: t.expertBytes };
}

interface PassCostRow {
  positions: number;
  /** Whole pass (forward + replay), forward alone, replay alone: one entry per round. */
  seconds: number[];
  forward: number[];
  replay: number[];
  trunk: number[];
  experts: number[];
}

/** One decode step and verify passes over 1 + k positions, each from a copy of `base`. */
async function verifyCosts(model: Model, base: SequenceState): Promise<PassCostRow[]> {
  const rows: PassCostRow[] = [1, ...KS.map((k) => 1 + k)].map((positions) => ({
    positions,
    seconds: [],
    forward: [],
    replay: [],
    trunk: [],
    experts: [],
  }));
  const ids = [17, 300, 42, 901, 5, 88, 640, 12, 3];
  // One pass so the ring's schedule and the JIT are in their steady state.
  await model.forward.forward(base.snapshot(), [ids[0]]);
  for (let r = 0; r < ROUNDS; r++) {
    for (const row of rows) {
      const state = base.snapshot();
      const record = new PassRecord(model.config, row.positions);
      const b0 = bytesRead(model), t0 = performance.now();
      if (row.positions === 1) await model.forward.forward(state, [ids[0]]);
      else {
        await model.forward.forwardMany([{
          state,
          ids: ids.slice(0, row.positions),
          logits: "all",
          record,
        }]);
      }
      const t1 = performance.now();
      if (row.positions > 1) record.advance(state, row.positions);
      const t2 = performance.now(), b1 = bytesRead(model);
      row.seconds.push((t2 - t0) / 1000);
      row.forward.push((t1 - t0) / 1000);
      row.replay.push((t2 - t1) / 1000);
      row.trunk.push(b1.trunk - b0.trunk);
      row.experts.push(b1.experts - b0.experts);
    }
  }
  return rows;
}

interface DecodeRun {
  tokens: number[];
  /** Tokens after the first, per second of decoding. */
  tokensPerSecond: number;
  trunkPerToken: number;
  expertsPerToken: number;
  stats: SpeculationStats;
}

/** Generates GEN tokens after `prompt`; timing and bytes from the first token on. */
async function decode(
  model: Model,
  prompt: number[],
  speculate?: (stats: SpeculationStats) => SpeculateOptions,
): Promise<DecodeRun> {
  const stats = newSpeculationStats();
  const options: GenerateOptions = { maxTokens: GEN, stopIds: [], speculate: speculate?.(stats) };
  const tokens: number[] = [];
  let t0 = 0, b0 = { trunk: 0, experts: 0 };
  for await (const s of generate(model, prompt, options)) {
    tokens.push(s.token);
    if (s.index === 0) {
      t0 = performance.now();
      b0 = bytesRead(model);
    }
  }
  const seconds = (performance.now() - t0) / 1000, b1 = bytesRead(model), n = tokens.length - 1;
  return {
    tokens,
    tokensPerSecond: n / seconds,
    trunkPerToken: (b1.trunk - b0.trunk) / n,
    expertsPerToken: (b1.experts - b0.experts) / n,
    stats,
  };
}

/** Median ms of one 12288 x 7168 BF16 matmul per T, over 4 matrices (704 MB) per round. */
function kernelCosts(Ts: number[]): Map<number, number> {
  const lib = k3();
  const rows = 12288, cols = 7168, mats = 4, bytes = rows * cols * 2;
  const p = lib.k3_alloc(BigInt(bytes * mats));
  if (p === null) throw new Error("cannot allocate the kernel benchmark's 704 MB");
  try {
    const w = new Uint16Array(Deno.UnsafePointerView.getArrayBuffer(p, bytes * mats));
    for (let i = 0; i < w.length; i++) w[i] = 0x3f80 + (i % 127) - 63;
    const times = new Map<number, number[]>(Ts.map((T) => [T, []]));
    for (let r = 0; r < 2 * ROUNDS + 1; r++) {
      for (const T of Ts) {
        const x = new Float32Array(T * cols).fill(0.01), y = new Float32Array(T * rows);
        const t0 = performance.now();
        for (let m = 0; m < mats; m++) {
          lib.k3_matmul_bf16(y, Deno.UnsafePointer.offset(p, m * bytes)!, x, rows, cols, T);
        }
        times.get(T)!.push((performance.now() - t0) / mats);
      }
    }
    return new Map(Ts.map((T) => [T, median(times.get(T)!)]));
  } finally {
    lib.k3_free(p);
  }
}

const gb = (b: number) => (b / 1e9).toFixed(3);
const load = () => Deno.loadavg().map((x) => x.toFixed(2)).join(" ");
const list = (xs: number[], d = 3) => xs.map((x) => x.toFixed(d)).join(" ");

async function main(): Promise<void> {
  await Deno.mkdir(work, { recursive: true });
  if (!(await exists(path.join(modelDir, "config.json")))) {
    console.error(`building the k3-shape checkpoint in ${modelDir} (several GB, once)...`);
    await k3cli(["make-tiny", modelDir, "--shape", "k3", "--layers", "4", "--experts", "32"]);
  }
  if (!(await exists(path.join(trunkDir, "trunk.json")))) await k3cli(["pack", modelDir, trunkDir]);

  const ckpt = await openCheckpoint(modelDir);
  const pack = await openTrunkPack(trunkDir, ckpt);
  const plan = planMemory(
    ckpt.config,
    ckpt.refs,
    { positions: 256, maxBatch: 64, verifyPositions: 1 + Math.max(...KS) },
    { pinLayers: 0, ringSlots: 2, cacheSlots: CACHE_SLOTS, trunkFrom: "pack" },
    Deno.memoryUsage().rss,
  );
  const dropped = dropCaches();
  const model = Model.load(ckpt, { plan, pack });
  const loads: string[] = [load()];
  try {
    const c = model.config;
    const prompt = [11, 200, 37, 901, 5, 640, 77, 12];
    const base = model.newState(512);
    await model.forward.forward(base, prompt);

    // 3. Verify cost against one decode step.
    const costs = await verifyCosts(model, base);
    loads.push(load());
    const step = median(costs[0].seconds);

    // 4. Tokens/s, median of rounds; each round runs every variant once, in turn.
    const repetitive = Array.from({ length: 24 }, (_, i) => [5, 17, 300, 42][i % 4]);
    const runs: Record<string, DecodeRun[]> = {};
    let truth: number[] = [];
    /** Drafts from the plain run: its own tokens, or each one off by one (never right). */
    const scripted = (wrong: boolean, policy: DraftPolicy) => (stats: SpeculationStats) => ({
      drafter: new ScriptedDrafter(
        (ctx, max) =>
          truth.slice(ctx.length - prompt.length, ctx.length - prompt.length + max)
            .map((t) => (wrong ? (t + 1) % c.vocabSize : t)),
        wrong ? "wrong" : "right",
      ),
      draftMax: DRAFT_MAX,
      policy,
      stats,
    });
    type Variant = [string, number[], ((s: SpeculationStats) => SpeculateOptions) | undefined];
    const variants: Variant[] = [
      ["plain", prompt, undefined],
      [`perfect drafts, k = ${DRAFT_MAX}`, prompt, scripted(false, new FixedPolicy(DRAFT_MAX))],
      ["plain, repetitive prompt", repetitive, undefined],
      ["n-gram, repetitive prompt (cost)", repetitive, (stats) => ({
        drafter: new NgramDrafter(),
        draftMax: DRAFT_MAX,
        policy: new CostPolicy(new PassCost()),
        stats,
      })],
      [
        "never match (cost policy)",
        prompt,
        (s) => scripted(true, new CostPolicy(new PassCost()))(s),
      ],
      [`never match (always ${DRAFT_MAX})`, prompt, scripted(true, new FixedPolicy(DRAFT_MAX))],
    ];
    for (let r = 0; r < ROUNDS; r++) {
      for (const [name, p, spec] of variants) {
        const run = await decode(model, p, spec);
        if (name === "plain") truth = run.tokens;
        (runs[name] ??= []).push(run);
        const ref = runs[p === prompt ? "plain" : "plain, repetitive prompt"]?.[r];
        if (ref && run.tokens.join() !== ref.tokens.join()) {
          throw new Error(`${name}: tokens differ from plain decoding (a bug)`);
        }
      }
      loads.push(load());
    }

    // 5. The kernel alone.
    const kernel = kernelCosts([1, 2, 3, 5, 9]);
    loads.push(load());

    const lines: string[] = [];
    lines.push(
      `bench-spec: ${modelDir} (synthetic, k3 widths, ${c.numLayers} layers, ${c.numExperts} ` +
        `experts top-${c.topK}), trunk from the pack: ${plan.trunk.pinned} pinned + ` +
        `${plan.trunk.ringSlots}-slot ring, ${plan.experts.slots} expert slots; ` +
        `threads ${k3Threads()} (${k3Isa()}); ${GEN} tokens per run; medians of ${ROUNDS}`,
      `page cache dropped before loading: ${dropped ? "yes" : "NO (not root)"}`,
      `load average (1/5/15 min): start ${loads[0]} | after verify ${loads[1]} | ` +
        `after each decode round ${loads.slice(2, -1).join(" | ")} | after the kernel ${
          loads.at(-1)
        }`,
      "",
      "verify pass over 1 + k positions vs one decode step (forward, then the replay of every position):",
      "  positions  seconds (rounds)              x decode  forward  replay   trunk GB  expert GB",
    );
    const json: Record<string, unknown> = {
      threads: k3Threads(),
      isa: k3Isa(),
      gen: GEN,
      rounds: ROUNDS,
      loads,
      page_cache_dropped: dropped,
    };
    json.verify = costs.map((row) => {
      const s = median(row.seconds);
      lines.push(
        `  ${String(row.positions).padEnd(9)}  ${s.toFixed(3).padStart(6)} (${list(row.seconds)})`
          .padEnd(42) +
          `${(s / step).toFixed(3).padStart(7)}  ${median(row.forward).toFixed(3).padStart(7)}  ` +
          `${median(row.replay).toFixed(3).padStart(6)}   ${gb(median(row.trunk)).padStart(7)}  ` +
          `${gb(median(row.experts)).padStart(8)}`,
      );
      return { ...row, ratio: s / step };
    });
    const five = costs.find((r) => r.positions === 5)!;
    const fiveRatio = median(five.seconds) / step;
    lines.push(
      `  goal: 1 + 4 positions <= 1.5 x a decode step: ${fiveRatio.toFixed(3)} ` +
        `(${fiveRatio <= 1.5 ? "met" : "MISSED"})`,
      "",
      "decoding after the first token (medians; GB read per generated token):",
      "  variant                            tok/s (rounds)               x plain  tok/pass  accept  trunk GB  expert GB",
    );
    const plainTps = median(runs["plain"].map((r) => r.tokensPerSecond));
    const plainRepTps = median(runs["plain, repetitive prompt"].map((r) => r.tokensPerSecond));
    json.decode = Object.entries(runs).map(([name, rs]) => {
      const tps = rs.map((r) => r.tokensPerSecond);
      const ref = name.includes("repetitive") ? plainRepTps : plainTps;
      const st = rs[rs.length - 1].stats;
      const passes = st.verifyPasses + st.decodeSteps;
      const perPass = passes ? (GEN - 1) / passes : 1;
      const acc = st.verified ? `${((100 * st.accepted) / st.verified).toFixed(0)}%` : "-";
      lines.push(
        `  ${name.padEnd(34)} ${median(tps).toFixed(3).padStart(6)} (${list(tps)})`.padEnd(70) +
          `${(median(tps) / ref).toFixed(3).padStart(7)}  ${perPass.toFixed(2).padStart(8)}  ` +
          `${acc.padStart(6)}  ${gb(median(rs.map((r) => r.trunkPerToken))).padStart(8)}  ` +
          `${gb(median(rs.map((r) => r.expertsPerToken))).padStart(9)}`,
      );
      return {
        name,
        tokens_per_second: tps,
        vs_plain: median(tps) / ref,
        trunk_per_token: rs.map((r) => r.trunkPerToken),
        experts_per_token: rs.map((r) => r.expertsPerToken),
        stats: rs.map((r) => r.stats),
      };
    });
    const perfect = median(runs[`perfect drafts, k = ${DRAFT_MAX}`].map((r) => r.tokensPerSecond)) /
      plainTps;
    const never = median(runs["never match (cost policy)"].map((r) => r.tokensPerSecond)) /
      plainTps;
    lines.push(
      `  goal: perfect drafts at k = ${DRAFT_MAX} >= 3 x plain: ${perfect.toFixed(3)} ` +
        `(${perfect >= 3 ? "met" : "MISSED"})`,
      `  goal: at most 3 % lost when drafts never match (cost policy): ` +
        `${((1 - never) * 100).toFixed(1)} % lost (${never >= 0.97 ? "met" : "MISSED"})`,
      "",
      `BF16 matmul 12288 x 7168 from memory (median of ${2 * ROUNDS + 1}), cost vs T = 1:`,
      "  " +
        [...kernel].map(([T, ms]) =>
          `T=${T} ${ms.toFixed(1)} ms (${(ms / kernel.get(1)!).toFixed(2)}x)`
        ).join("  "),
      "",
      "scope: synthetic random weights; n-gram drafts match only when the random model repeats " +
        "itself; routing is random, so verified positions share few experts.",
    );
    console.log(lines.join("\n"));
    json.kernel_ms = Object.fromEntries(kernel);
    json.goals = { verify_1_plus_4: fiveRatio, perfect_k4: perfect, never_match: never };
    if (jsonOut) await Deno.writeTextFile(jsonOut, JSON.stringify(json, null, 2) + "\n");
  } finally {
    model.close();
  }
}

await main();
