/**
 * `make bench-stream`: streaming throughput against the raw disk (a benchmark, not a test).
 *
 * 1. Builds a `--shape k3` synthetic checkpoint (true K3 widths, 4 layers, 32 experts) and
 *    its trunk pack, once, under build/bench-stream/.
 * 2. Measures the raw O_DIRECT bandwidth the way the engine reads experts: whole experts
 *    chosen at random from the expert shards, each cut into the engine's pieces
 *    (EXPERT_PIECES), through a reader pool of the engine's size with its queue kept full;
 *    and once with a single reader thread. The page cache is dropped before each round;
 *    three rounds, the median is the reference.
 * 3. Runs the model under a budget that streams both the trunk (0 pinned, 2-slot ring) and
 *    the experts (a small cache), caches dropped, and reports:
 *    - achieved expert GB/s = expert bytes / seconds with at least one expert read running
 *      (time an expert read shared the disk with a trunk piece still counts against the
 *      experts), as a fraction of the raw bandwidth at the same concurrency;
 *    - the same for the trunk, the I/O share of the run's window, and the share of compute
 *      (time the engine was not blocked on a read) that ran with a read in flight.
 *
 * Usage: deno run -A bench/stream.ts [WORK_DIR] [--gen N]
 */
import * as path from "node:path";
import { dropCaches, exists, median } from "./common.ts";
import { NativeBuffer } from "../ffi/native.ts";
import { openCheckpoint } from "../lib/checkpoint/checkpoint.ts";
import { IoClass, IoPool } from "../lib/io/stream.ts";
import { IO_READERS } from "../lib/model/model.ts";
import { EXPERT_PIECES, expertSlotBytes, placeExpert, readPieces } from "../lib/memory/experts.ts";

const repo = path.resolve(import.meta.dirname!, "..");
const work = path.resolve(
  Deno.args.find((a) => !a.startsWith("--")) ?? path.join(repo, "build/bench-stream"),
);
const gen = Number(Deno.args[Deno.args.indexOf("--gen") + 1] ?? 4) || 4;
const model = path.join(work, "model"), trunk = path.join(work, "trunk");
/** The engine's reader pool size (raw bandwidth is measured at the same concurrency). */
const ENGINE_READERS = IO_READERS;
const RAW_ROUNDS = 3;

async function k3(args: string[]): Promise<string> {
  const out = await new Deno.Command(path.join(repo, "k3"), {
    args,
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (out.code !== 0) throw new Error(`k3 ${args.join(" ")} exited ${out.code}`);
  return new TextDecoder().decode(out.stdout);
}

/** One expert's read as the engine issues it: file, offset, bytes. */
interface ExpertRun {
  file: string;
  offset: number;
  bytes: number;
}

/** Every routed expert's read, in a fixed pseudo-random order. */
async function expertRuns(dir: string): Promise<{ runs: ExpertRun[]; slotBytes: number }> {
  const ckpt = await openCheckpoint(dir);
  const runs: ExpertRun[] = [];
  for (const l of ckpt.refs.layers) {
    for (let e = 0; e < (l.moe?.experts.count ?? 0); e++) {
      const p = placeExpert(l.moe!.experts.get(e));
      if (p.run) {
        runs.push({
          file: p.run.file,
          offset: p.run.start - p.base,
          bytes: p.base + p.run.end - p.run.start,
        });
      }
    }
  }
  let seed = 12345;
  const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  for (let i = runs.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [runs[i], runs[j]] = [runs[j], runs[i]];
  }
  return { runs, slotBytes: expertSlotBytes(ckpt.refs) };
}

/** Reads `runs` (O_DIRECT, the engine's pieces) through `readers` threads; returns GB/s. */
function rawBandwidth(runs: ExpertRun[], slotBytes: number, readers: number): number {
  const pool = new IoPool(readers);
  const slots = 2 * readers;
  const buffer = NativeBuffer.alloc(slots * slotBytes);
  const t0 = performance.now();
  const pending = runs.flatMap((r, i) =>
    readPieces(
      pool,
      IoClass.expert,
      r.file,
      r.offset,
      r.bytes,
      Deno.UnsafePointer.offset(buffer.pointer, (i % slots) * slotBytes)!,
      slotBytes,
      EXPERT_PIECES,
      "raw",
    )
  );
  for (const p of pending) pool.wait(p);
  const seconds = (performance.now() - t0) / 1000;
  const bytes = runs.reduce((n, r) => n + r.bytes, 0);
  pool.close();
  buffer.free();
  return bytes / seconds / 1e9;
}

const pct = (x: number, of: number) => `${((100 * x) / of).toFixed(1)}%`;

/** Median raw GB/s over RAW_ROUNDS rounds of 1 and ENGINE_READERS reader threads. */
async function measureRaw(): Promise<{ one: number[]; engine: number[]; dropped: boolean }> {
  const { runs, slotBytes } = await expertRuns(model);
  const one: number[] = [], engine: number[] = [];
  let dropped = true;
  for (let r = 0; r < RAW_ROUNDS; r++) {
    // A different stretch of the shuffled experts each round, so no round rereads another's.
    const pick = (n: number, from: number) =>
      Array.from({ length: n }, (_, i) => runs[(from + i) % runs.length]);
    dropped = dropCaches() && dropped;
    one.push(rawBandwidth(pick(12, 60 * r), slotBytes, 1));
    dropped = dropCaches() && dropped;
    engine.push(rawBandwidth(pick(48, 60 * r + 12), slotBytes, ENGINE_READERS));
  }
  return { one, engine, dropped };
}

async function main(): Promise<void> {
  await Deno.mkdir(work, { recursive: true });
  if (!(await exists(path.join(model, "config.json")))) {
    console.error(`building the k3-shape checkpoint in ${model} (several GB, once)...`);
    await k3(["make-tiny", model, "--shape", "k3", "--layers", "4", "--experts", "32"]);
  }
  if (!(await exists(path.join(trunk, "trunk.json")))) await k3(["pack", model, trunk]);

  const raw = await measureRaw();
  const raw1 = median(raw.one), rawN = median(raw.engine);

  dropCaches();
  const out = path.join(work, "run.json");
  await k3([
    "run",
    model,
    "--trunk",
    trunk,
    "--ids",
    "11,200,37,901,5",
    "--gen",
    String(gen),
    "--ignore-eos",
    "--pin-layers",
    "0",
    "--ring-slots",
    "2",
    "--cache-slots",
    "16",
    "--out",
    out,
  ]);
  const rec = JSON.parse(await Deno.readTextFile(out));
  const io = rec.memory.io;
  const expertGbps = io.expert_bytes / Math.max(1e-9, io.expert_seconds) / 1e9;
  const trunkGbps = io.trunk_bytes / Math.max(1e-9, io.trunk_seconds) / 1e9;
  const allBytes = io.trunk_bytes + io.expert_bytes;
  const allGbps = allBytes / Math.max(1e-9, io.busy_seconds) / 1e9;
  const list = (xs: number[]) => xs.map((x) => x.toFixed(2)).join(" ");
  const lines = [
    `bench-stream: ${model} (k3 widths, 4 layers, 32 experts), trunk pack ${trunk}`,
    `page cache dropped before cold reads: ${
      raw.dropped ? "yes" : "NO (not root: numbers may be warm)"
    }`,
    `raw O_DIRECT, random whole experts in ${EXPERT_PIECES} pieces (median of ${RAW_ROUNDS}): ` +
    `1 reader ${raw1.toFixed(2)} GB/s (${list(raw.one)}), ${ENGINE_READERS} readers ` +
    `(as the engine) ${rawN.toFixed(2)} GB/s (${list(raw.engine)})`,
    `run: ${rec.generated_ids.length} tokens, ${
      rec.seconds_per_token.map((s: number) => s.toFixed(2)).join(" ")
    } s/token; ` +
    `plan ${rec.memory.plan.trunk.pinned} pinned + ring ${rec.memory.plan.trunk.ringSlots}, ` +
    `${rec.memory.plan.experts.slots} expert slots`,
    `expert reads: ${(io.expert_bytes / 1e9).toFixed(2)} GB in ${
      io.expert_seconds.toFixed(2)
    } s with an expert read running = ${expertGbps.toFixed(2)} GB/s = ` +
    `${pct(expertGbps, rawN)} of raw at ${ENGINE_READERS} readers (goal >= 90%)`,
    `trunk reads: ${(io.trunk_bytes / 1e9).toFixed(2)} GB at ${trunkGbps.toFixed(2)} GB/s = ` +
    `${pct(trunkGbps, rawN)} of raw`,
    `all reads: ${(allBytes / 1e9).toFixed(2)} GB in ${io.busy_seconds.toFixed(2)} s in flight = ` +
    `${allGbps.toFixed(2)} GB/s = ${pct(allGbps, rawN)} of raw`,
    `I/O share of the run: ${pct(io.io_share, 1)}; compute hidden under I/O: ` +
    `${pct(io.compute_hidden, 1)} (goal >= 80%; of ${
      io.compute_seconds.toFixed(2)
    } s not blocked on a read); ` +
    `forward waited ${(io.trunk_wait_seconds + io.expert_wait_seconds).toFixed(2)} s of ${
      io.window_seconds.toFixed(2)
    } s`,
    `peak RSS ${(rec.peak_rss_bytes / 1e9).toFixed(2)} GB`,
  ];
  console.log(lines.join("\n"));
}

await main();
