/**
 * libk3's own thread pool (csrc/parallel.c, the backend of builds without OpenMP, as on
 * macOS) gives the same bytes as the OpenMP build at 1, 2 and 3 threads: the kernel harness
 * (csrc/tests/harness.c) built both ways, and the logits of a tiny-model run through each
 * library. `make pool` builds build/pool/.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const POOL = path.join(repo, "build", "pool");
const THREADS = ["1", "2", "3"];

async function sha256(bytes: Uint8Array<ArrayBuffer>): Promise<string> {
  const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return Array.from(digest, (b) => b.toString(16).padStart(2, "0")).join("");
}

async function make(target: string): Promise<void> {
  const out = await new Deno.Command("make", { args: ["-s", target], cwd: repo }).output();
  const dec = new TextDecoder();
  assert.equal(out.code, 0, dec.decode(out.stdout) + dec.decode(out.stderr));
}

/** The harness's output digest at `threads`. */
async function harness(binary: string, threads: string): Promise<string> {
  const out = await new Deno.Command(path.join(POOL, binary), {
    env: { OMP_NUM_THREADS: threads },
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
  assert.ok(out.stdout.length > 50_000, `${binary} wrote only ${out.stdout.length} bytes`);
  return await sha256(out.stdout);
}

Deno.test("the pool build's kernel harness equals the OpenMP build's at 1, 2 and 3 threads", async () => {
  await make("pool");
  const digests = new Map<string, string>();
  for (const threads of THREADS) {
    for (const binary of ["harness", "harness-openmp"]) {
      digests.set(`${binary}@${threads}`, await harness(binary, threads));
    }
  }
  const first = digests.get("harness-openmp@1");
  for (const [run, digest] of digests) assert.equal(digest, first, run);
});

Deno.test("a tiny model gives the same logits through the pool and OpenMP libraries", async () => {
  await make("pool");
  const dir = await tinyModel();
  const out = tempDir();
  const libs = { pool: path.join(POOL, "libk3.so"), openmp: path.join(repo, "build", "libk3.so") };
  const dumps = new Map<string, string>();
  for (const [name, lib] of Object.entries(libs)) {
    for (const threads of THREADS) {
      const env = { K3_LIB: lib, OMP_NUM_THREADS: threads };
      const doctor = await runK3(["doctor"], env);
      assert.equal(doctor.code, 0, doctor.stderr);
      assert.match(doctor.stdout, new RegExp(`\\(${name}\\)`), "the library in use");
      assert.match(doctor.stdout, new RegExp(`${threads} \\w+ threads`), "its team size");
      const file = path.join(out, `${name}-${threads}.bin`);
      const ids = "1,2,3,4,5,6,7";
      const args = ["run", dir, "--ids", ids, "--gen", "4", "--ignore-eos", "--dump-logits", file];
      const r = await runK3([...args, "--quiet"], env);
      assert.equal(r.code, 0, r.stderr);
      const bytes = await Deno.readFile(file);
      assert.ok(bytes.length > 0);
      dumps.set(`${name}@${threads}`, await sha256(bytes));
    }
  }
  const first = dumps.get("openmp@1");
  for (const [run, digest] of dumps) assert.equal(digest, first, run);
});
