/**
 * The streamed half of `make bench-codec`: decode s/token with the trunk read from disk, a
 * coded pack (`k3c1`, the default) against a `--codec none` pack of the same checkpoint.
 *
 * - The checkpoint has the real widths (`make-tiny --shape k3`: hidden 7168, the release's
 *   matrix shapes) with few layers and experts, and NORMAL weights (`--weights normal`: std
 *   1/sqrt(fan-in), as trained weights are distributed), so the coded pack is as large as a
 *   trained model's would be (uniform or hole weights code far smaller). Built once under
 *   WORK_DIR (default build/bench-codec-stream).
 * - Nothing of the trunk is kept resident (`--pin-layers 0 --lm-head stream`): every decode
 *   token reads every layer and lm_head from the pack, with the O_DIRECT reads the engine
 *   uses for a pack. The page cache is dropped before each run when this process may
 *   (root: /proc/sys/vm/drop_caches), so neither the pack nor the shards start warm.
 * - OMP_NUM_THREADS=2 unless set; runs alternate none, coded, none, coded, ... (--runs,
 *   default 3); medians of the decode steps' mean s/token, with the trunk GB read per token,
 *   the disk's O_DIRECT read rate (dd, same run) and the load average. The generated tokens
 *   must be the same with both packs, or the bench fails.
 *
 * Usage: deno run -A bench/codec_stream.ts [WORK_DIR] [--layers N] [--gen N] [--runs N]
 */
import * as path from "node:path";
import { dropCaches, exists, loadAverage, median } from "./common.ts";

const repo = path.resolve(import.meta.dirname!, "..");
const k3 = path.join(repo, "k3");
const args = Deno.args;
function flag(name: string, fallback: number): number {
  const at = args.indexOf(name);
  return at >= 0 ? Number(args[at + 1]) || fallback : fallback;
}
const work = path.resolve(
  args.find((a, i) => !a.startsWith("--") && !args[i - 1]?.startsWith("--")) ??
    path.join(repo, "build/bench-codec-stream"),
);
const layers = flag("--layers", 4), gen = flag("--gen", 4), runs = flag("--runs", 3);
const threads = Deno.env.get("OMP_NUM_THREADS") ?? "2";
const model = path.join(work, `model-${layers}`);
const IDS = "11,200,37,901";

/** Runs k3 with `argv`; throws with its stderr's tail when it fails. */
async function k3Run(argv: string[]): Promise<void> {
  const r = await new Deno.Command(k3, {
    args: argv,
    stdout: "null",
    stderr: "piped",
    env: { OMP_NUM_THREADS: threads },
  }).output();
  if (r.code !== 0) {
    const tail = new TextDecoder().decode(r.stderr).split("\n").slice(-6).join("\n");
    throw new Error(`k3 ${argv[0]} exited ${r.code}:\n${tail}`);
  }
}

/** The disk's O_DIRECT sequential read rate over `file` (dd), GB/s. */
function directReadGbps(file: string): number {
  const r = new Deno.Command("dd", {
    args: [`if=${file}`, "of=/dev/null", "bs=8M", "iflag=direct"],
    stderr: "piped",
  }).outputSync();
  const m = new TextDecoder().decode(r.stderr).match(/(\d+) bytes .* copied, ([\d.]+) s/);
  return m ? Number(m[1]) / Number(m[2]) / 1e9 : NaN;
}

interface Sample {
  secondsPerToken: number;
  trunkGbPerToken: number;
  tokens: number[];
  load: string;
}

/** One decode run with the trunk streamed from `pack`. */
async function decode(pack: string): Promise<Sample> {
  const out = path.join(work, "run.json"), load = loadAverage();
  await k3Run([
    "run",
    model,
    "--trunk",
    pack,
    "--pin-layers",
    "0",
    "--lm-head",
    "stream",
    "--ids",
    IDS,
    "--gen",
    String(gen),
    "--ignore-eos",
    "--quiet",
    "--out",
    out,
  ]);
  type Step = { seconds: number; trunk_gb_read: number };
  const rec = JSON.parse(await Deno.readTextFile(out));
  const steps: Step[] = rec.steps.slice(1); // the first step is the prompt's prefill
  const mean = (f: (s: Step) => number) => steps.reduce((a, s) => a + f(s), 0) / steps.length;
  return {
    secondsPerToken: mean((s) => s.seconds),
    trunkGbPerToken: mean((s) => s.trunk_gb_read),
    tokens: rec.generated_ids,
    load,
  };
}

async function main(): Promise<void> {
  await Deno.mkdir(work, { recursive: true });
  if (!(await exists(path.join(model, "config.json")))) {
    console.error(`building a ${layers}-layer true-width checkpoint with normal weights...`);
    await k3Run([
      "make-tiny",
      model,
      "--shape",
      "k3",
      "--layers",
      String(layers),
      "--experts",
      "4",
      "--weights",
      "normal",
    ]);
  }
  const packs: Record<string, string> = {};
  for (const codec of ["none", "k3c1"]) {
    packs[codec] = path.join(work, `pack-${layers}-${codec}`);
    if (!(await exists(path.join(packs[codec], "trunk.json")))) {
      await k3Run(["pack", "--codec", codec, model, packs[codec]]);
    }
  }
  const samples: Record<string, Sample[]> = { none: [], k3c1: [] };
  let dropped = true;
  for (let i = 0; i < runs; i++) {
    for (const codec of ["none", "k3c1"]) {
      dropped = dropCaches() && dropped;
      samples[codec].push(await decode(packs[codec]));
    }
  }
  const want = samples.none[0].tokens.join(",");
  for (const s of [...samples.none, ...samples.k3c1]) {
    if (s.tokens.join(",") !== want) {
      throw new Error(`the packs gave different tokens: ${want} vs ${s.tokens.join(",")}`);
    }
  }
  const disk = directReadGbps(path.join(packs.none, "trunk.bin"));
  console.log(
    `streamed decode, ${layers} layers at the release's widths, normal weights, trunk and ` +
      `lm_head read from the pack every token (--pin-layers 0 --lm-head stream), ` +
      `OMP_NUM_THREADS=${threads}, ${gen - 1} decode steps a run, medians of ${runs}; page cache ` +
      (dropped ? "dropped before each run" : "NOT dropped (not root): the pack reads are O_DIRECT"),
  );
  console.log(`  disk O_DIRECT sequential read (dd, 8 MiB blocks): ${disk.toFixed(2)} GB/s`);
  const row = (codec: string) => {
    const s = samples[codec];
    const sec = median(s.map((x) => x.secondsPerToken));
    const gb = median(s.map((x) => x.trunkGbPerToken));
    console.log(
      `  ${codec.padEnd(5)} pack: ${sec.toFixed(3)} s/token, trunk ${gb.toFixed(3)} GB/token ` +
        `(${(gb / sec).toFixed(2)} GB/s); runs ${
          s.map((x) => x.secondsPerToken.toFixed(3)).join(" ")
        }; load ${s.map((x) => x.load.split(" ")[0]).join(" ")}`,
    );
    return sec;
  };
  const none = row("none"), coded = row("k3c1");
  console.log(`  coded / none: ${(coded / none).toFixed(3)}x s/token; tokens identical (${want})`);
}

await main();
