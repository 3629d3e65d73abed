/**
 * `make bench-prefill`: what a long prompt costs at full size (a benchmark, not a test).
 *
 * 1. Builds the 93-layer full-size layout twice under WORK_DIR (once each, ~6 GB of disk and
 *    3-4 minutes apiece): `uniform` and `skewed` routing (`make-tiny --shape full --routing`). The trunk and the experts are
 *    SPARSE HOLES: they read as zeros without the disk, so the seconds below are compute and
 *    the kernel's hole reads; the drive columns give what 3 GB/s and 7 GB/s drives would need
 *    for the same bytes.
 * 2. For each preset, routing, prompt length and prefill mode, `k3 run --gen 1` on a prompt of
 *    distinct token ids (on this layout a token's experts depend on its id alone, so repeated
 *    ids would measure the text, not the routers), and from its `--out` record and
 *    `--dump-cache-trace`: the trunk and expert GB read for the prefill (step 0, which ends in
 *    the first token), the distinct (layer, expert) pairs the prompt touched (the floor of
 *    expert reads: each once), the seconds of step 0 and of the load before it. Modes:
 *    `default` (what `k3 run` does without the flag: layer-major once that lands; on a tree
 *    without it, passes of the preset's batch) and `--prefill-chunk N` for each --chunks N.
 *    A run under 5 minutes is repeated to give medians of --runs (default 3).
 * 3. One decode step per preset (the shortest prompt, default mode, --gen 2) gives the trunk
 *    GB of a single forward pass, the yardstick for "the trunk read once per prompt".
 *
 * The load average before each run and OMP_NUM_THREADS are printed; heavy runs take
 * /tmp/k3-heavy.lock (flock) one at a time. The table also goes to WORK_DIR/result-*.md.
 *
 * Usage: deno run -A bench/prefill.ts [WORK_DIR] [--lengths 256,2000,8000]
 *   [--presets ultra,laptop] [--routings uniform,skewed] [--chunks 64,512] [--runs 3]
 *   [--layers N (bind only the first N layers: a quick, reduced run)] [--no-decode]
 */
import * as path from "node:path";
import { distinctIds, exists, loadAverage, median } from "./common.ts";

const repo = path.resolve(import.meta.dirname!, "..");
const args = Deno.args;
const value = (name: string) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
};
const list = (name: string, fallback: string) => (value(name) ?? fallback).split(",");
const work = path.resolve(
  args.find((a, i) => !a.startsWith("--") && !args[i - 1]?.startsWith("--")) ??
    path.join(repo, "build/bench-prefill"),
);
const LENGTHS = list("--lengths", "256,2000,8000").map(Number);
const PRESETS = list("--presets", "ultra,laptop");
const ROUTINGS = list("--routings", "uniform,skewed");
const MODES = ["default", ...list("--chunks", "64,512")];
const RUNS = Number(value("--runs") ?? 3);
const LAYERS = value("--layers");
const DECODE = !args.includes("--no-decode");
/** Runs longer than this are not repeated (the medians are of 3 only under it). */
const REPEAT_UNDER_SECONDS = 300;
/** Bytes of one routed expert at full size (three MXFP4 matrices with their scales). */
const EXPERT_BYTES = 17_547_264;
const DRIVES_GBPS = [3, 7];
const LOCK = "/tmp/k3-heavy.lock";

/** The prompt: `n` distinct ordinary token ids (bench/common.ts). */
function promptIds(n: number): string {
  return distinctIds(n).join(",");
}

/** Builds the full-size layout with `routing` under WORK_DIR once; its directory. */
async function checkpoint(routing: string): Promise<string> {
  const dir = path.join(work, routing);
  if (await exists(path.join(dir, "config.json"))) return dir;
  console.error(`building the 93-layer full-size layout (${routing} routing) in ${dir}...`);
  const k3 = [path.join(repo, "k3"), "make-tiny", dir, "--shape", "full", "--routing", routing];
  const r = await new Deno.Command("flock", {
    args: [LOCK, ...k3],
    stdout: "inherit",
    stderr: "inherit",
  }).output();
  if (r.code !== 0) throw new Error(`make-tiny --shape full --routing ${routing} failed`);
  return dir;
}

/** One `k3 run`'s prefill figures. */
interface Sample {
  prefillSeconds: number;
  loadSeconds: number;
  trunkGb: number;
  expertGb: number;
  /** Distinct (layer, expert) pairs the prompt's tokens chose. */
  pairs: number;
  /** Trunk GB of the step after the first (a decode step), when asked. */
  decodeTrunkGb?: number;
  load: string;
}

type Outcome = Sample | { refused: string };

/** Distinct (layer, expert) pairs of step 0 in DIR/expert_trace.jsonl. */
async function tracePairs(dir: string): Promise<number> {
  // No trace when the experts are resident (nothing is fetched through a cache).
  const text = await Deno.readTextFile(path.join(dir, "expert_trace.jsonl")).catch(() => "");
  if (!text) return NaN;
  const seen = new Set<number>();
  for (const line of text.split("\n").slice(1)) {
    if (!line) continue;
    const r = JSON.parse(line) as { step: number; layer: number; ids: number[] };
    if (r.step === 0) { for (const id of r.ids) seen.add(r.layer * 65_536 + id); }
  }
  return seen.size;
}

/** `k3 run --gen 1|2` on an n-token prompt under the lock. Exit 2 or 3 is a refusal, kept. */
async function runOnce(
  model: string,
  preset: string,
  n: number,
  mode: string,
  gen: number,
): Promise<Outcome> {
  const tmp = await Deno.makeTempDir({ dir: work, prefix: "run-" });
  try {
    const out = path.join(tmp, "run.json"), trace = path.join(tmp, "trace");
    const k3 = [
      path.join(repo, "k3"),
      "run",
      model,
      "--ids",
      promptIds(n),
      "--gen",
      String(gen),
      "--ignore-eos",
      "--quiet",
      "--preset",
      preset,
      ...(mode === "default" ? [] : ["--prefill-chunk", mode]),
      ...(LAYERS ? ["--layers", LAYERS] : []),
      "--out",
      out,
      "--dump-cache-trace",
      trace,
    ];
    // The load average when the run starts (after the lock is ours), then the run.
    const loadFile = path.join(tmp, "load");
    const script = `cut -d' ' -f1-3 /proc/loadavg > '${loadFile}' && exec "$@"`;
    const r = await new Deno.Command("flock", {
      args: [LOCK, "sh", "-c", script, "sh", ...k3],
      stdout: "null",
      stderr: "piped",
    })
      .output();
    const err = new TextDecoder().decode(r.stderr).trim();
    if (r.code === 2 || r.code === 3) return { refused: `exit ${r.code}: ${err.split("\n")[0]}` };
    if (r.code !== 0) throw new Error(`${preset} ${n} ${mode} exited ${r.code}:\n${err}`);
    const rec = JSON.parse(await Deno.readTextFile(out));
    const load = (await Deno.readTextFile(loadFile)).trim();
    type Step = { seconds: number; trunk_gb_read: number; expert_gb_read: number };
    const steps: Step[] = rec.steps;
    return {
      prefillSeconds: steps[0].seconds,
      loadSeconds: rec.load_seconds,
      trunkGb: steps[0].trunk_gb_read,
      expertGb: steps[0].expert_gb_read,
      pairs: await tracePairs(trace),
      decodeTrunkGb: steps[1]?.trunk_gb_read,
      load,
    };
  } finally {
    await Deno.remove(tmp, { recursive: true });
  }
}

/** Medians of up to RUNS runs (one only when a run takes 5 minutes or more). */
async function measure(model: string, preset: string, n: number, mode: string) {
  const first = await runOnce(model, preset, n, mode, 1);
  if ("refused" in first) return first;
  const samples = [first];
  while (samples.length < RUNS && first.loadSeconds + first.prefillSeconds < REPEAT_UNDER_SECONDS) {
    const s = await runOnce(model, preset, n, mode, 1);
    if ("refused" in s) return s;
    samples.push(s);
  }
  const m = (f: (s: Sample) => number) => median(samples.map(f));
  return {
    runs: samples.length,
    prefillSeconds: m((s) => s.prefillSeconds),
    loadSeconds: m((s) => s.loadSeconds),
    trunkGb: m((s) => s.trunkGb),
    expertGb: m((s) => s.expertGb),
    pairs: m((s) => s.pairs),
    loads: samples.map((s) => s.load),
  };
}

const fmt = (x: number, d = 1) => x.toFixed(d);

/** The table's row for one measurement. */
function row(
  preset: string,
  routing: string,
  n: number,
  mode: string,
  r: Awaited<ReturnType<typeof measure>>,
  moeLayers: number,
): string {
  const label = mode === "default" ? "default" : `--prefill-chunk ${mode}`;
  const head = `| ${preset} | ${routing} | ${n} | ${label} |`;
  if ("refused" in r) return `${head} ${r.refused} |${" |".repeat(7)}`;
  const floorGb = (r.pairs * EXPERT_BYTES) / 1e9;
  const bytes = r.trunkGb + r.expertGb;
  const drives = DRIVES_GBPS.map((g) => fmt(bytes / g, 0)).join(" / ");
  return `${head} ${fmt(r.trunkGb)} | ${fmt(r.expertGb)} | ${fmt(floorGb)} (${
    fmt(r.pairs / moeLayers, 0)
  }/layer) | ${fmt(r.prefillSeconds)} | ${fmt(r.loadSeconds)} | ${drives} | ${r.runs} | ${
    r.loads.join("; ")
  } |`;
}

async function main(): Promise<void> {
  await Deno.mkdir(work, { recursive: true });
  const models = new Map<string, string>();
  for (const routing of ROUTINGS) models.set(routing, await checkpoint(routing));
  const config = JSON.parse(
    await Deno.readTextFile(path.join(models.get(ROUTINGS[0])!, "config.json")),
  );
  const layers = LAYERS ? Number(LAYERS) : config.text_config.num_hidden_layers;
  const moeLayers = layers - config.text_config.first_k_dense_replace;
  const threads = Deno.env.get("OMP_NUM_THREADS") ??
    `unset (${navigator.hardwareConcurrency} cores)`;
  const lines = [
    `bench-prefill: ${work} (full-size layout, ${layers} of 93 layers${
      LAYERS ? " bound (--layers)" : ""
    }, ` +
    `896 experts top-16; trunk and experts are SPARSE HOLES read without the disk)`,
    `OMP_NUM_THREADS ${threads}; load average at start ${loadAverage()}; GB = 1e9 bytes; ` +
    `prompts of distinct token ids, --gen 1; medians of up to ${RUNS} runs (one when a run ` +
    `takes ${REPEAT_UNDER_SECONDS} s or more)`,
    `trunk/expert GB: read during step 0 (the prefill and the first token); expert floor: ` +
    `distinct (layer, expert) pairs chosen x ${EXPERT_BYTES} bytes; prefill s: step 0; ` +
    `load s: open + plan + resident loads before it; drive s: (trunk + expert GB) at ` +
    `${DRIVES_GBPS.join(" / ")} GB/s`,
    "",
  ];
  if (DECODE) {
    for (const preset of PRESETS) {
      const d = await runOnce(models.get(ROUTINGS[0])!, preset, Math.min(...LENGTHS), "default", 2);
      lines.push(
        "refused" in d
          ? `${preset}: one decode step: ${d.refused}`
          : `${preset}: one decode step reads ${fmt(d.decodeTrunkGb ?? NaN, 2)} GB of trunk`,
      );
    }
    lines.push("");
  }
  lines.push(
    "| preset | routing | prompt | prefill | trunk GB | expert GB | expert floor GB (experts/layer) | " +
      "prefill s | load s | drive s (3 / 7 GB/s) | runs | load average before each run |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
  );
  for (const preset of PRESETS) {
    for (const routing of ROUTINGS) {
      for (const n of LENGTHS) {
        for (const mode of MODES) {
          const r = await measure(models.get(routing)!, preset, n, mode);
          lines.push(row(preset, routing, n, mode, r, moeLayers));
          console.error(lines.at(-1));
        }
      }
    }
  }
  const text = lines.join("\n") + "\n";
  const stamp = new Date().toISOString().replace(/[:.]/g, "-");
  const result = path.join(work, `result-${LAYERS ? `L${LAYERS}-` : ""}${stamp}.md`);
  await Deno.writeTextFile(result, text);
  console.log(text);
  console.error(`(also written to ${result})`);
}

await main();
