/**
 * `make bench-stream`: streaming throughput against the raw disk (a benchmark, not a test).
 *
 * 1. Builds a `--shape k3` synthetic checkpoint (true K3 widths, 4 layers, 32 experts) and
 *    its trunk pack, once, under build/bench-stream/.
 * 2. Measures raw O_DIRECT random-read bandwidth of the expert shard: 17.5 MB reads at random
 *    aligned offsets, one in flight, then 4 in flight (page cache dropped first).
 * 3. Runs the model under a budget that streams both the trunk (0 pinned, 2-slot ring) and
 *    the experts (a small cache), caches dropped, and reports achieved GB/s as a fraction of
 *    raw, the I/O share of wall clock and how much compute ran under I/O.
 *
 * Usage: deno run -A bench/stream.ts [WORK_DIR] [--gen N]
 */
import * as path from "node:path";
import { NativeBuffer } from "../ffi/native.ts";
import { IoClass, IoPool, targetIn } from "../lib/io/stream.ts";

const repo = path.resolve(import.meta.dirname!, "..");
const work = path.resolve(
  Deno.args.find((a) => !a.startsWith("--")) ?? path.join(repo, "build/bench-stream"),
);
const gen = Number(Deno.args[Deno.args.indexOf("--gen") + 1] ?? 4) || 4;
const model = path.join(work, "model"), trunk = path.join(work, "trunk");
const EXPERT_READ = 17_547_264; // one K3 expert
const PAGE = 4096;

async function k3(args: string[]): Promise<string> {
  const out = await new Deno.Command(path.join(repo, "k3"), {
    args,
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (out.code !== 0) throw new Error(`k3 ${args.join(" ")} exited ${out.code}`);
  return new TextDecoder().decode(out.stdout);
}

async function exists(p: string): Promise<boolean> {
  return (await Deno.stat(p).catch(() => null)) !== null;
}

/** Drops the page cache (root only, through sh: Deno refuses /proc writes); true when it worked. */
function dropCaches(): boolean {
  const out = new Deno.Command("sh", { args: ["-c", "sync && echo 3 > /proc/sys/vm/drop_caches"] })
    .outputSync();
  return out.code === 0;
}

/** Random 17.5 MB O_DIRECT reads of `file`, `inFlight` at a time; returns GB/s. */
function rawBandwidth(file: string, inFlight: number, reads: number): number {
  const size = Deno.statSync(file).size;
  const span = Math.ceil(EXPERT_READ / PAGE) * PAGE;
  const pool = new IoPool(inFlight);
  const bufs = Array.from({ length: inFlight }, () => NativeBuffer.alloc(span));
  let seed = 12345;
  const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  const t0 = performance.now();
  for (let done = 0; done < reads; done += inFlight) {
    const batch = bufs.slice(0, Math.min(inFlight, reads - done)).map((b) => {
      const off = Math.floor((rand() * (size - span)) / PAGE) * PAGE;
      return pool.read(
        IoClass.expert,
        file,
        off,
        span,
        targetIn(b.pointer, 0, span, b.bytes),
        "raw",
      );
    });
    for (const p of batch) pool.wait(p);
  }
  const seconds = (performance.now() - t0) / 1000;
  pool.close();
  for (const b of bufs) b.free();
  return (reads * span) / seconds / 1e9;
}

async function main(): Promise<void> {
  await Deno.mkdir(work, { recursive: true });
  if (!(await exists(path.join(model, "config.json")))) {
    console.error(`building the k3-shape checkpoint in ${model} (several GB, once)...`);
    await k3(["make-tiny", model, "--shape", "k3", "--layers", "4", "--experts", "32"]);
  }
  if (!(await exists(path.join(trunk, "trunk.json")))) await k3(["pack", model, trunk]);

  const shards = [...Deno.readDirSync(model)].filter((e) => e.name.endsWith(".safetensors"))
    .map((e) => path.join(model, e.name)).sort((a, b) =>
      Deno.statSync(b).size - Deno.statSync(a).size
    );
  const expertShard = shards[0];
  const dropped = dropCaches();
  const raw1 = rawBandwidth(expertShard, 1, 24);
  dropCaches();
  const raw4 = rawBandwidth(expertShard, 4, 48);

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
  const raw = Math.max(raw1, raw4);
  const lines = [
    `bench-stream: ${model} (k3 widths, 4 layers, 32 experts), trunk pack ${trunk}`,
    `page cache dropped before cold reads: ${
      dropped ? "yes" : "NO (not root: numbers may be warm)"
    }`,
    `raw O_DIRECT random 17.5 MB reads: 1 in flight ${raw1.toFixed(2)} GB/s, 4 in flight ${
      raw4.toFixed(2)
    } GB/s`,
    `run: ${rec.generated_ids.length} tokens, ${
      rec.seconds_per_token.map((s: number) => s.toFixed(2)).join(" ")
    } s/token; ` +
    `plan ${rec.memory.plan.trunk.pinned} pinned + ring ${rec.memory.plan.trunk.ringSlots}, ` +
    `${rec.memory.plan.experts.slots} expert slots`,
    `expert reads: ${(io.expert_bytes / 1e9).toFixed(2)} GB at ${expertGbps.toFixed(2)} GB/s = ` +
    `${((100 * expertGbps) / raw).toFixed(1)}% of raw (goal >= 90%)`,
    `all reads (trunk + experts share the disk): ${
      ((io.trunk_bytes + io.expert_bytes) / 1e9).toFixed(2)
    } GB ` +
    `in ${io.busy_seconds.toFixed(2)} s in flight = ${
      ((io.trunk_bytes + io.expert_bytes) / io.busy_seconds / 1e9).toFixed(2)
    } GB/s = ${
      ((100 * (io.trunk_bytes + io.expert_bytes)) / io.busy_seconds / 1e9 / raw).toFixed(1)
    }% of raw`,
    `trunk reads: ${(io.trunk_bytes / 1e9).toFixed(2)} GB at ${trunkGbps.toFixed(2)} GB/s = ` +
    `${((100 * trunkGbps) / raw).toFixed(1)}% of raw`,
    `I/O share of wall clock: ${(100 * io.io_share).toFixed(1)}%; compute hidden under I/O: ` +
    `${(100 * io.compute_hidden).toFixed(1)}% (goal >= 80%); forward waited ` +
    `${(io.trunk_wait_seconds + io.expert_wait_seconds).toFixed(2)} s of ${
      io.wall_seconds.toFixed(2)
    } s`,
    `peak RSS ${(rec.peak_rss_bytes / 1e9).toFixed(2)} GB`,
  ];
  console.log(lines.join("\n"));
}

await main();
