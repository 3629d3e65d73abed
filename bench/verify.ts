/**
 * `make bench-verify`: what `--verify-pack` (each packed layer's SHA-256 checked on its first
 * read) costs, against the same run without it (a benchmark, not a test: it decides whether the hash
 * can be on by default).
 *
 * Builds a `--shape k3` synthetic checkpoint (true K3 widths, 2 layers, 8 experts: a 2.75 GB
 * trunk, the embedding included) and its trunk pack once under WORK_DIR, then runs
 * `k3 run --trunk` with and without `--verify-pack`, alternating, 3 times each, under two plans:
 * - resident: the whole trunk pinned, so every layer is hashed once while loading;
 * - streamed: 0 pinned, a 1-slot ring, so every layer is hashed on the first token's pass.
 * It reports the medians of load seconds, first-token seconds and the whole run (load + every
 * token), the ratio verify / plain, and the load average. Pack reads are O_DIRECT (no page
 * cache), so every run reads the trunk from the disk.
 *
 * Usage: deno run -A bench/verify.ts [WORK_DIR] [--gen N]
 */
import * as path from "node:path";
import { exists, median } from "./common.ts";

const repo = path.resolve(import.meta.dirname!, "..");
const work = path.resolve(
  Deno.args.find((a, i) => !a.startsWith("--") && Deno.args[i - 1] !== "--gen") ??
    path.join(repo, "build/bench-verify"),
);
const genAt = Deno.args.indexOf("--gen");
const gen = genAt >= 0 ? Number(Deno.args[genAt + 1]) : 8;
const model = path.join(work, "model"), trunk = path.join(work, "trunk");
const ROUNDS = 3;

async function k3(args: string[]): Promise<void> {
  const out = await new Deno.Command(path.join(repo, "k3"), {
    args,
    stdout: "null",
    stderr: "null",
  })
    .output();
  if (out.code !== 0) throw new Error(`k3 ${args.join(" ")} exited ${out.code}`);
}

interface Timing {
  load: number;
  first: number;
  total: number;
}

async function runOnce(plan: string[], verify: boolean): Promise<Timing> {
  const out = path.join(work, "verify-run.json");
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
    ...plan,
    ...(verify ? ["--verify-pack"] : []),
    "--out",
    out,
  ]);
  const rec = JSON.parse(await Deno.readTextFile(out));
  await Deno.remove(out);
  const steps: number[] = rec.seconds_per_token;
  const load = rec.open_seconds + rec.load_seconds;
  return { load, first: steps[0], total: load + steps.reduce((a, b) => a + b, 0) };
}

async function main() {
  await Deno.mkdir(work, { recursive: true });
  if (!(await exists(path.join(model, "config.json")))) {
    await k3(["make-tiny", model, "--shape", "k3", "--layers", "2", "--experts", "8"]);
  }
  if (!(await exists(path.join(trunk, "trunk.json")))) await k3(["pack", model, trunk]);
  const config = JSON.parse(await Deno.readTextFile(path.join(model, "config.json")));
  const layers = String((config.text_config ?? config).num_hidden_layers);
  const plans: [string, string[]][] = [
    ["resident", ["--pin-layers", layers]],
    ["streamed", ["--pin-layers", "0", "--ring-slots", "1"]],
  ];
  const threads = Deno.env.get("OMP_NUM_THREADS") ?? "(default)";
  const lines = [
    `bench-verify: ${model} (k3 widths, ${layers} layers, synthetic weights), pack ${trunk}`,
    `OMP_NUM_THREADS ${threads}, ${gen} tokens per run, medians of ${ROUNDS}, O_DIRECT reads`,
  ];
  const loadBefore = Deno.loadavg().map((x) => x.toFixed(2)).join(" ");
  await runOnce(plans[0][1], false); // the model's shards (read through the page cache) warm up
  for (const [name, plan] of plans) {
    const plain: Timing[] = [], verified: Timing[] = [];
    for (let r = 0; r < ROUNDS; r++) {
      plain.push(await runOnce(plan, false));
      verified.push(await runOnce(plan, true));
    }
    const row = (k: keyof Timing) => {
      const a = median(plain.map((t) => t[k])), b = median(verified.map((t) => t[k]));
      return `${k} ${a.toFixed(3)} s -> ${b.toFixed(3)} s (x${(b / a).toFixed(3)}, ${
        ((b / a - 1) * 100).toFixed(1)
      }%)`;
    };
    lines.push(`${name}: ${row("load")}; ${row("first")}; ${row("total")}`);
  }
  lines.push(
    `load average before ${loadBefore}, after ${Deno.loadavg().map((x) => x.toFixed(2)).join(" ")}`,
  );
  console.log(lines.join("\n"));
}

await main();
