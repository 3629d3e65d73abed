/**
 * `make bench-full`: the full-size model under the small presets (a benchmark, not a test).
 *
 * 1. Builds the 93-layer full-size checkpoint (`make-tiny --shape full`: every tensor of
 *    the release with its real name, shape and dtype) once under build/bench-full/. Its
 *    trunk and routed experts are SPARSE HOLES: they read as zeros without touching the
 *    disk, so the read rates below are the kernel's hole reads, not a disk's. Only the
 *    embedding, lm_head, routers and norm gains hold data.
 * 2. Runs `ultra` and `laptop` (or --presets a,b) for --gen tokens each (default 4), --runs
 *    times (default 3),
 *    and prints per preset the medians of: plan and measured peak RSS (VmHWM), open time and
 *    load time (open to first step, minus the open), the first token (the prompt's prefill
 *    pass, and the expert GB it read), then per decode token the trunk and expert GB read
 *    and the seconds; with the load average before each run. The table also goes to
 *    WORK_DIR/result-ompN.md (N = OMP_NUM_THREADS).
 *    Then the last preset once more --runs times with its trunk read from a pack (`k3 pack`,
 *    made once under WORK_DIR/pack; sparse like the shards, so its reads are hole reads too),
 *    and the ratio of the s/token from the shards to the s/token from the pack (--no-pack
 *    skips it).
 * 3. Probes, in the same run: a STREAM-style memory read (lib/bench/kernels.ts, the bf16
 *    matmul over 2 GiB at OMP_NUM_THREADS) and a hole read (128 MiB pieces of a layer shard
 *    through the engine's reader pool, O_DIRECT as the trunk's reads from the shards and the
 *    pack are, and buffered from an unaligned offset for comparison); each decode token's
 *    weights (trunk + expert GB) per second is given as a share of the O_DIRECT one.
 * 4. Runs each once more inside a memory cgroup (with its report and load progress, kept in
 *    WORK_DIR/PRESET-cgroup.log) limited to 3 GB (ultra) and 8 GB (laptop,
 *    GB = 1e9) with swap off, where the machine allows it (root, cgroup v2 memory.max or v1
 *    memory.limit_in_bytes + memsw), and reports whether both finished and their peak usage.
 *
 * Usage: deno run -A bench/full.ts [WORK_DIR] [--gen N] [--runs N] [--presets ultra,laptop]
 *        [--no-cgroup] [--no-pack]
 */
import * as path from "node:path";
import { NativeBuffer } from "../ffi/native.ts";
import { streamReadGbps } from "../lib/cli/bench/kernels.ts";
import { IoClass, IoPool, type PendingRead, targetIn } from "../lib/io/stream.ts";
import { IO_READERS } from "../lib/model/model.ts";
import { exists, loadAverage, median } from "./common.ts";

const repo = path.resolve(import.meta.dirname!, "..");
const args = Deno.args;
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) || fallback : fallback;
};
const work = path.resolve(
  args.find((a, i) => !a.startsWith("--") && !args[i - 1]?.startsWith("--")) ??
    path.join(repo, "build/bench-full"),
);
const gen = flag("--gen", 4), runs = flag("--runs", 3), cgroups = !args.includes("--no-cgroup");
const withPack = !args.includes("--no-pack");
const model = path.join(work, "model");
const packDir = path.join(work, "pack");
const IDS = "11,200,37,901";
const LIMITS: Record<string, number> = { ultra: 3e9, laptop: 8e9 };
const presetNames = args[args.indexOf("--presets") + 1]?.split(",") ?? [];
const PRESETS: { name: string; limit: number }[] = (
  args.includes("--presets") ? presetNames : ["ultra", "laptop"]
).map((name) => ({ name, limit: LIMITS[name] ?? 8e9 }));

/** Runs a shell line (Deno refuses /proc and /sys writes without --allow-all); its stdout. */
function sh(line: string): { ok: boolean; out: string } {
  const r = new Deno.Command("sh", { args: ["-c", line], stderr: "piped" }).outputSync();
  const dec = new TextDecoder();
  return { ok: r.code === 0, out: dec.decode(r.code === 0 ? r.stdout : r.stderr).trim() };
}

/** One run's numbers. */
interface Sample {
  planBytes: number;
  peakBytes: number;
  openSeconds: number;
  loadSeconds: number;
  /** The first step: the prompt's prefill pass, which gives the first token. */
  firstSeconds: number;
  firstExpertGb: number;
  /** Means over the decode steps (one token each). */
  trunkGbPerToken: number;
  expertGbPerToken: number;
  secondsPerToken: number;
  load: string;
  tokens: number[];
}

/**
 * `k3 run` under `preset` (plus `extra` flags), optionally with its pid in cgroup dir `cg`
 * first.
 */
async function runPreset(
  preset: string,
  out: string,
  cg?: string,
  extra: string[] = [],
): Promise<Sample> {
  const load = loadAverage();
  const k3 = [
    path.join(repo, "k3"),
    "run",
    model,
    "--ids",
    IDS,
    "--gen",
    String(gen),
    "--ignore-eos",
    // The cgroup runs keep the report and the load progress (kept in WORK_DIR/PRESET-cgroup.log).
    ...(cg ? [] : ["--quiet"]),
    "--preset",
    preset,
    "--out",
    out,
    ...extra,
  ];
  const quoted = k3.map((a) => `'${a}'`).join(" ");
  const script = cg ? `echo $$ > '${cg}/cgroup.procs' && exec ${quoted}` : `exec ${quoted}`;
  const r = await new Deno.Command("sh", { args: ["-c", script], stdout: "null", stderr: "piped" })
    .output();
  if (cg) await Deno.writeFile(path.join(work, `${preset}-cgroup.log`), r.stderr);
  if (r.code !== 0) {
    const tail = new TextDecoder().decode(r.stderr).split("\n").slice(-6).join("\n");
    throw new Error(`${preset}${cg ? " (cgroup)" : ""} exited ${r.code}:\n${tail}`);
  }
  const rec = JSON.parse(await Deno.readTextFile(out));
  type Step = { seconds: number; trunk_gb_read: number; expert_gb_read: number };
  const [first, ...decode]: Step[] = rec.steps;
  const mean = (f: (s: Step) => number) =>
    decode.length ? decode.reduce((a, s) => a + f(s), 0) / decode.length : NaN;
  return {
    planBytes: rec.memory.plan.total_bytes,
    peakBytes: rec.peak_rss_bytes,
    openSeconds: rec.open_seconds,
    loadSeconds: rec.load_seconds - rec.open_seconds,
    firstSeconds: first.seconds,
    firstExpertGb: first.expert_gb_read,
    trunkGbPerToken: mean((s) => s.trunk_gb_read),
    expertGbPerToken: mean((s) => s.expert_gb_read),
    secondsPerToken: mean((s) => s.seconds),
    load,
    tokens: rec.generated_ids,
  };
}

/**
 * GB/s of reading `bytes` of holes from `file` in 128 MiB pieces (the ring's piece size)
 * through the engine's reader pool, two pieces in flight, the file's cached pages dropped
 * first: from a page-aligned offset (O_DIRECT, as the trunk's reads from the shards and the
 * pack are), or `unaligned` (buffered): the ceilings of this layout's reads.
 */
function holeReadGbps(file: string, bytes: number, unaligned = false): number {
  // Cold, as in the runs (the trunk is larger than the page cache): drop this file's pages.
  sh(`dd if='${file}' iflag=nocache count=0 status=none`);
  const piece = 128 << 20, pool = new IoPool(IO_READERS);
  const buf = NativeBuffer.alloc(2 * piece);
  const pending: PendingRead[] = [];
  const t0 = performance.now();
  try {
    for (let at = 0, i = 0; at < bytes; at += piece, i++) {
      if (pending.length === 2) pool.wait(pending.shift()!);
      const dst = Deno.UnsafePointer.offset(buf.pointer, (i % 2) * piece)!;
      pending.push(
        pool.read(
          IoClass.trunk,
          file,
          (1 << 30) + (unaligned ? 8 : 0) + at,
          piece,
          targetIn(dst, 0, piece, piece),
          "probe",
        ),
      );
    }
    for (const p of pending) pool.wait(p);
    return bytes / ((performance.now() - t0) / 1000) / 1e9;
  } finally {
    pool.close();
    buf.free();
  }
}

/** A memory cgroup limited to `limit` bytes with swap off, or why there is none. */
function makeCgroup(name: string, limit: number): { dir: string; kind: string } | string {
  const v2 = `/sys/fs/cgroup/${name}`;
  if (sh("test -f /sys/fs/cgroup/cgroup.controllers").ok) {
    const r = sh(
      `mkdir -p ${v2} && echo ${limit} > ${v2}/memory.max && ` +
        `echo 0 > ${v2}/memory.swap.max`,
    );
    return r.ok ? { dir: v2, kind: "cgroup v2 memory.max, memory.swap.max 0" } : r.out;
  }
  const v1 = `/sys/fs/cgroup/memory/${name}`;
  const r = sh(`mkdir -p ${v1} && echo ${limit} > ${v1}/memory.limit_in_bytes`);
  if (!r.ok) return `no memory cgroup here (${r.out})`;
  const swap = sh(`echo ${limit} > ${v1}/memory.memsw.limit_in_bytes`).ok
    ? "memsw.limit_in_bytes = limit (no swap)"
    : `no swap accounting; swap ${sh("swapon --show --noheadings").out ? "on" : "off"}`;
  return { dir: v1, kind: `cgroup v1 memory.limit_in_bytes, ${swap}` };
}

/** The cgroup's peak usage and limit hits, then the cgroup removed. */
function closeCgroup(dir: string): string {
  const read = (f: string) => {
    const r = sh(`cat ${dir}/${f}`);
    return r.ok ? r.out : undefined;
  };
  const peak = read("memory.max_usage_in_bytes") ?? read("memory.peak");
  const fails = read("memory.failcnt");
  const oom = read("memory.oom_control") ?? read("memory.events");
  const kills = /oom_kill (\d+)/.exec(oom ?? "")?.[1] ?? "?";
  sh(`rmdir ${dir}`);
  return `cgroup peak usage ${peak ? (Number(peak) / 1e9).toFixed(2) + " GB" : "?"} ` +
    `(page cache included), limit hits ${fails ?? "?"}, OOM kills ${kills}`;
}

async function main(): Promise<void> {
  await Deno.mkdir(work, { recursive: true });
  if (!(await exists(path.join(model, "config.json")))) {
    console.error(`building the 93-layer full-size checkpoint in ${model} (once; ~6 GB)...`);
    const r = await new Deno.Command(path.join(repo, "k3"), {
      args: ["make-tiny", model, "--shape", "full"],
      stdout: "inherit",
      stderr: "inherit",
    }).output();
    if (r.code !== 0) throw new Error("make-tiny --shape full failed");
  }
  const out = path.join(work, "run.json");
  const fmt = (n: number, d = 2) => n.toFixed(d);
  const pct = (x: number, of: number) => `${((100 * x) / of).toFixed(0)}%`;
  const threads = Deno.env.get("OMP_NUM_THREADS") ?? String(navigator.hardwareConcurrency);
  // The probes: medians of 3, before the runs (nothing else of ours running).
  const shard = path.join(model, "model-00002-of-00096.safetensors");
  const probeLoad = loadAverage();
  const streamGbps = median([0, 1, 2].map(() => streamReadGbps()));
  const holeGbps = median([0, 1, 2].map(() => holeReadGbps(shard, 4 * 2 ** 30)));
  const bufferedGbps = median([0, 1, 2].map(() => holeReadGbps(shard, 4 * 2 ** 30, true)));
  const lines: string[] = [
    `bench-full: ${model} (93 layers, 896 experts, full-size layout; the trunk and the experts ` +
    `are SPARSE HOLES, read as zeros without disk I/O, so read rates are the kernel's, not a ` +
    `disk's; only the embedding, lm_head, routers and norms hold data)`,
    `${gen} tokens per run (prompt ${IDS}), medians of ${runs} runs, OMP_NUM_THREADS ${threads}; ` +
    `trunk read from the shards unless the row says pack. GB = 1e9 bytes; peak RSS is VmHWM.`,
    `open: checkpoint index; load: plan + resident bytes + ring + cache, to the first step; ` +
    `first token: the prefill pass of the ${IDS.split(",").length}-token prompt; ` +
    `per token: means over the ${gen - 1} decode steps; weights GB/s: (trunk + expert GB) / ` +
    `s per decode token, as a share of the probes`,
    `probes (medians of 3, load average ${probeLoad}): STREAM-style read ${fmt(streamGbps)} ` +
    `GB/s (bf16 matmul over 2 GiB, ${threads} threads); hole read ${fmt(holeGbps)} GB/s ` +
    `O_DIRECT, ${fmt(bufferedGbps)} GB/s buffered (4 GiB of ${path.basename(shard)} in 128 ` +
    `MiB pieces, ${IO_READERS} readers)`,
    "",
    "| preset | plan GB | peak RSS GB | open s | load s | first token s (its expert GB) | " +
    "trunk GB/token | expert GB/token | s/token | weights GB/s (% hole read, % STREAM) | " +
    "load average before each run |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
  ];
  const reference: number[][] = [];
  const perToken: number[] = [];
  const row = async (name: string, preset: string, extra: string[] = []) => {
    const samples: Sample[] = [];
    for (let i = 0; i < runs; i++) {
      samples.push(await runPreset(preset, out, undefined, extra));
      console.error(`${name} run ${i + 1}/${runs} done`);
    }
    reference.push(samples[0].tokens);
    const m = (k: keyof Sample) => median(samples.map((s) => s[k] as number));
    const rate = median(
      samples.map((s) => (s.trunkGbPerToken + s.expertGbPerToken) / s.secondsPerToken),
    );
    perToken.push(m("secondsPerToken"));
    lines.push(
      `| ${name} | ${fmt(m("planBytes") / 1e9)} | ${fmt(m("peakBytes") / 1e9)} | ` +
        `${fmt(m("openSeconds"))} | ${fmt(m("loadSeconds"))} | ` +
        `${fmt(m("firstSeconds"), 1)} (${fmt(m("firstExpertGb"), 1)}) | ${
          fmt(m("trunkGbPerToken"))
        } | ` +
        `${fmt(m("expertGbPerToken"))} | ${fmt(m("secondsPerToken"))} | ` +
        `${fmt(rate)} (${pct(rate, holeGbps)}, ${pct(rate, streamGbps)}) | ` +
        `${samples.map((s) => s.load).join("; ")} |`,
    );
  };
  for (const p of PRESETS) await row(p.name, p.name);
  const last = PRESETS[PRESETS.length - 1].name;
  if (withPack) {
    if (!(await exists(path.join(packDir, "trunk.json")))) {
      console.error(`packing the trunk into ${packDir} (once; sparse like the shards)...`);
      const r = await new Deno.Command(path.join(repo, "k3"), {
        args: ["pack", model, packDir],
        stdout: "inherit",
        stderr: "inherit",
      }).output();
      if (r.code !== 0) throw new Error("k3 pack failed");
    }
    await row(`${last} (trunk from the pack)`, last, ["--trunk", packDir]);
    const shards = perToken[PRESETS.length - 1], pack = perToken[PRESETS.length];
    lines.push(
      "",
      `${last}: s/token from the shards / from the pack = ${fmt(shards)} / ${fmt(pack)} = ` +
        `${fmt(shards / pack)} (goal <= 1.20)`,
    );
  }
  const same = reference.every((t) => JSON.stringify(t) === JSON.stringify(reference[0]));
  lines.push("", `tokens: ${same ? "identical" : "DIFFERENT"} across presets (${reference[0]})`);
  if (cgroups) lines.push("", "under a memory cgroup (one run each):");
  for (const p of cgroups ? PRESETS : []) {
    const cg = makeCgroup(`k3-bench-${p.name}`, p.limit);
    if (typeof cg === "string") {
      lines.push(`  ${p.name}: not run: ${cg}`);
      continue;
    }
    let verdict: string;
    try {
      const s = await runPreset(p.name, out, cg.dir);
      verdict = `finished: peak RSS ${fmt(s.peakBytes / 1e9)} GB, plan ${
        fmt(s.planBytes / 1e9)
      } GB, ${fmt(s.secondsPerToken)} s/token`;
    } catch (e) {
      verdict = `FAILED: ${(e as Error).message.split("\n")[0]}`;
    }
    lines.push(
      `  ${p.name}, limit ${fmt(p.limit / 1e9, 1)} GB (${cg.kind}): ${verdict}; ${
        closeCgroup(cg.dir)
      }`,
    );
  }
  await Deno.remove(out).catch(() => {});
  const text = lines.join("\n") + "\n";
  const result = path.join(work, `result-omp${threads}.md`);
  await Deno.writeTextFile(result, text);
  console.log(text);
  console.error(`(also written to ${result})`);
}

await main();
