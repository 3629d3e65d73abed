/**
 * The fuzz test: bad input is a clear error or the right answer, never a crash, hang or wrong
 * answer. Seeded mutations of shard headers, tensor data, the index,
 * config.json, the tokenizer files, the trunk pack and a chat history, run by the driver
 * tests/support/fuzz_cases.ts in a child process. For every case:
 *   - exit 2, 3 or 4 with a `k3:` message; or
 *   - exit 0 with logits byte-equal to the unmutated model's; or, when a mutated config or
 *     tokenizer is still valid but another model (its parsed config differs, or it encodes
 *     the prompt to other ids: another top-k, epsilon, merge), exit 0 with its own logits; or
 *   - (tensor data only) exit 0 with any logits; a corrupted pack read with --verify-pack
 *     must be exit 4;
 * and never exit 1 (a stack trace), a signal, a hang (no case may take 60 s) or memory past
 * 3 GB (the driver's RSS, watched from here).
 *
 * `make test`: K3_FUZZ_CASES (default 300) or K3_FUZZ_SECONDS (default 120), whichever ends
 * first, seed K3_FUZZ_SEED (default 1). `make fuzz`: 5000 cases, 30 minutes, a random seed
 * (printed, so a failure can be replayed with K3_FUZZ_SEED).
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { type CaseResult, NO_LOGITS } from "../support/fuzz_cases.ts";
import { tempDir, tinyModel } from "../support/helpers.ts";

const REPO = path.resolve(import.meta.dirname!, "..", "..");
const CASE_TIMEOUT_MS = 60_000;
const RSS_LIMIT_MB = 3000;

const env = (k: string, d: number) => Number(Deno.env.get(k) ?? d);

Deno.test("fuzz: mutated inputs give a named error or the right answer, never a crash", async () => {
  const seed = env("K3_FUZZ_SEED", 1);
  const cases = env("K3_FUZZ_CASES", 300);
  const seconds = env("K3_FUZZ_SECONDS", 120);
  // Small enough that a case costs tens of milliseconds: 3 layers (KDA, MLA, KDA), 4 experts.
  const base = await tinyModel({ seed: 11, layers: 3, experts: 4, topK: 2, mlaLayers: [2] });
  const work = tempDir();
  const results = path.join(work, "results.jsonl");
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--quiet",
      "--config",
      path.join(REPO, "deno.json"),
      path.join(REPO, "tests", "support", "fuzz_cases.ts"),
      base,
      work,
      results,
      String(seed),
      String(cases),
      String(seconds),
    ],
    stdout: "null",
    stderr: "piped",
  }).spawn();
  const output = child.output();

  // The watchdog: a case that never ends is a hang, a driver past the limit is unbounded memory.
  let failure: string | undefined;
  let running = true;
  const watcher = (async () => {
    while (running && !failure) {
      await new Promise((r) => setTimeout(r, 1000));
      const last = (await readLines(results)).at(-1);
      if (last && "start" in last && Date.now() - last.seen > CASE_TIMEOUT_MS) {
        failure = `case ${last.start} (${last.kind}: ${last.note}) hangs: no end after 60 s`;
      }
      const rss = await rssMb(child.pid);
      if (rss > RSS_LIMIT_MB) failure = `the driver's RSS is ${rss} MB, over ${RSS_LIMIT_MB} MB`;
    }
    if (failure) {
      try {
        child.kill("SIGKILL");
      } catch { /* already gone */ }
    }
  })();
  const status = await output;
  running = false;
  await watcher;
  const lines = await readLines(results);
  const done = lines.filter((l): l is CaseResult & { seen: number } => "code" in l);
  const last = lines.at(-1);
  assert.equal(failure, undefined, failure);
  assert.ok(
    status.success,
    `the driver died (${status.signal ?? `exit ${status.code}`})` +
      (last && "start" in last ? ` in case ${last.start} (${last.kind}: ${last.note})` : "") +
      `: ${new TextDecoder().decode(status.stderr).slice(-3000)}`,
  );

  const bad: string[] = [];
  for (const r of done) {
    const what = `case ${r.i} (${r.kind}: ${r.note}): exit ${r.code}`;
    if (![0, 2, 3, 4].includes(r.code)) bad.push(`${what}: ${r.message}`);
    else if (r.code !== 0 && !r.message.startsWith("k3: ")) {
      bad.push(`${what} without a k3: message`);
    } else if (r.expect && !r.expect.includes(r.code)) {
      bad.push(`${what}, not ${r.expect.join(" or ")}: ${r.message}`);
    } else if (r.code === 0 && !NO_LOGITS.includes(r.kind) && r.same === null) {
      bad.push(`${what}: no logits`);
    } else if (
      r.code === 0 && r.same === false && !r.variant && r.kind !== "data" && r.kind !== "packdata"
    ) {
      bad.push(`${what} with logits that differ from the unmutated model's`);
    } else if (r.kind === "packdata" && r.verify && r.code !== 4) {
      bad.push(`${what}: a corrupted pack read with --verify-pack must be exit 4`);
    }
    if (r.rssMb > RSS_LIMIT_MB) bad.push(`${what}: RSS ${r.rssMb} MB`);
  }
  const byKind = new Map<string, number[]>();
  for (const r of done) {
    const counts = byKind.get(r.kind) ?? [0, 0, 0, 0, 0];
    counts[r.code === 0 ? 0 : r.code - 1]++;
    byKind.set(r.kind, counts);
  }
  const ms = done.reduce((a, r) => a + r.ms, 0);
  console.log(
    `fuzz seed ${seed}: ${done.length} cases in ${
      (ms / 1000).toFixed(1)
    } s; exit 0/2/3/4 by kind: ` +
      [...byKind].map(([k, c]) => `${k} ${c[0]}/${c[1]}/${c[2]}/${c[3]}`).join(", "),
  );
  assert.deepEqual(bad, [], `${bad.length} cases mishandled:\n${bad.slice(0, 30).join("\n")}`);
  assert.ok(done.length >= Math.min(cases, 50), `only ${done.length} cases ran`);
  for (const [kind] of (await import("../support/fuzz_cases.ts")).KINDS) {
    assert.ok(byKind.has(kind) || done.length < 100, `no ${kind} case ran`);
  }
});

/** The result file's lines, each with the time this process first saw it. */
const seenAt = new Map<string, number>();
async function readLines(file: string): Promise<(Record<string, any> & { seen: number })[]> {
  const text = await Deno.readTextFile(file).catch(() => "");
  const lines = [];
  for (const l of text.split("\n")) {
    let value;
    try {
      value = JSON.parse(l); // a line being written is skipped until it is whole
    } catch {
      continue;
    }
    if (!seenAt.has(l)) seenAt.set(l, Date.now());
    lines.push({ ...value, seen: seenAt.get(l)! });
  }
  return lines;
}

async function rssMb(pid: number): Promise<number> {
  const status = await Deno.readTextFile(`/proc/${pid}/status`).catch(() => "");
  const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  return Math.round(kb / 1024);
}
