/** Shared test fixtures: generated tiny models (made once per process) and the CLI. */
import * as path from "node:path";
import { makeTiny, type TinyOptions } from "../../lib/synth/tiny.ts";

const root = Deno.makeTempDirSync({ prefix: "k3-test-models-" });
// Tests leave nothing in $TMPDIR: the fixtures go when the test module's runtime ends.
globalThis.addEventListener("unload", () => Deno.removeSync(root, { recursive: true }));
const made = new Map<string, Promise<string>>();

/** A generated tiny model for `options`, made on first request and then reused. */
export function tinyModel(options: TinyOptions = {}): Promise<string> {
  const key = JSON.stringify(options);
  let dir = made.get(key);
  if (!dir) {
    const d = path.join(root, `m${made.size}`);
    dir = Deno.mkdir(d, { recursive: true }).then(() => makeTiny(d, options)).then(() => d);
    made.set(key, dir);
  }
  return dir;
}

/** A fresh temp folder for one test, removed with the rest when the test file ends. */
export function tempDir(): string {
  return Deno.makeTempDirSync({ dir: root });
}

const repo = path.resolve(import.meta.dirname!, "..", "..");

/** Runs `k3 ARGS` in a child process (fresh libk3 load, own OMP_NUM_THREADS). */
export async function runK3(
  args: string[],
  env: Record<string, string> = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "--no-prompt",
      "--config",
      path.join(repo, "deno.json"),
      "--allow-ffi",
      "--allow-read",
      "--allow-write",
      "--allow-env",
      "--allow-net",
      "--allow-run",
      "--allow-sys",
      path.join(repo, "main.ts"),
      ...args,
    ],
    env,
    stdout: "piped",
    stderr: "piped",
  }).output();
  const dec = new TextDecoder();
  return { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
}

/** max |a - b| / max |b|. */
export function relDiff(a: ArrayLike<number>, b: ArrayLike<number>): number {
  let num = 0, den = 0;
  for (let i = 0; i < b.length; i++) {
    num = Math.max(num, Math.abs(a[i] - b[i]));
    den = Math.max(den, Math.abs(b[i]));
  }
  return num / den;
}

/** True when two float arrays hold the same bytes. */
export function sameBytes(a: Float32Array, b: Float32Array): boolean {
  if (a.length !== b.length) return false;
  const x = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const y = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return false;
  return true;
}

/**
 * `k3 run DIR --ids IDS --gen GEN --ignore-eos FLAGS` with --out and --dump-logits in a fresh
 * temp folder (removed after); exit 0 is asserted. Returns the record, ids, logits, stderr.
 */
export async function runRecorded(
  dir: string,
  ids: string,
  gen: string,
  flags: string[],
  env: Record<string, string> = {},
) {
  const out = tempDir();
  const json = path.join(out, "run.json"), logits = path.join(out, "logits.bin");
  try {
    const args = ["run", dir, "--ids", ids, "--gen", gen, "--ignore-eos", "--out", json];
    const r = await runK3([...args, "--dump-logits", logits, ...flags], env);
    if (r.code !== 0) throw new Error(`k3 run ${flags.join(" ")} exited ${r.code}: ${r.stderr}`);
    // deno-lint-ignore no-explicit-any
    const record: any = JSON.parse(await Deno.readTextFile(json));
    return {
      ids: record.generated_ids as number[],
      logits: new Float32Array((await Deno.readFile(logits)).buffer),
      record,
      stderr: r.stderr,
    };
  } finally {
    await Deno.remove(out, { recursive: true });
  }
}

/**
 * The reference tests' configs (tests/model/engine.test.ts): they differ in depth, MLA positions,
 * expert count, top-k and prompt length.
 */
export const REFERENCE_CONFIGS: { name: string; options: TinyOptions; prompt: number[] }[] = [
  { name: "default", options: { seed: 11 }, prompt: [5, 17, 300, 42, 7, 99, 1000] },
  {
    name: "deep, MLA early",
    options: { seed: 23, layers: 10, experts: 12, topK: 4, mlaLayers: [2, 6, 10], blockSize: 4 },
    prompt: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19],
  },
  {
    name: "short, top-1",
    options: { seed: 37, layers: 7, experts: 6, topK: 1, mlaLayers: [6, 7], blockSize: 3 },
    prompt: [640],
  },
];
