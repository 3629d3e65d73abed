/**
 * `k3 download` and `k3 verify` against a stand-in Hub (tests/support/hub_standin.ts): full downloads
 * into a folder and into the Hub cache, runs by repo id, SIGKILL and resume, every injected
 * fault, wrong tokens, a full disk, flipped bytes, and the token in no output at all.
 */
import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import { existsSync } from "node:fs";
import * as path from "node:path";
import { getHFHubCachePath, getRepoFolderName } from "@huggingface/hub";
import {
  hubCachePath,
  hubEndpoint,
  hubToken,
  redact,
  repoFolderName,
} from "../../lib/hub/endpoint.ts";
import { retryAfterSeconds } from "../../lib/hub/http.ts";
import { globToRegExp, safeRelativePath } from "../../lib/hub/manifest.ts";
import { Sha256, sha256Impl } from "../../lib/hub/sha256.ts";
import { autoPieceSize } from "../../lib/hub/transfer.ts";
import { planFull } from "../../lib/synth/full.ts";
import { type Fault, StandInHub, type StandInOptions } from "../support/hub_standin.ts";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";

const REPO = "moonshotai/Kimi-K3";
const TOKEN = "hf_StandInSecretToken0123456789";
const repoRoot = path.resolve(import.meta.dirname!, "..", "..");

/** The tiny model plus a nested small file, as the repo's content. */
async function repoSource(): Promise<string> {
  const tiny = await tinyModel({ seed: 5 });
  const dir = tempDir();
  for (const e of Deno.readDirSync(tiny)) {
    Deno.copyFileSync(path.join(tiny, e.name), path.join(dir, e.name));
  }
  Deno.mkdirSync(path.join(dir, "original"));
  Deno.writeTextFileSync(path.join(dir, "original", "notes.txt"), "kept as is\n");
  return dir;
}

/** Every output of every run, to check the token appears in none of them. */
const outputs: string[] = [];

interface Env {
  hub: StandInHub;
  home: string;
  env: Record<string, string>;
}

/** A stand-in Hub and a private HF_HOME / HF_HUB_CACHE for one test; closed afterwards. */
async function withHub(
  opts: Partial<StandInOptions>,
  body: (e: Env) => Promise<void>,
): Promise<void> {
  const source = await repoSource();
  const hub = StandInHub.start({ repo: REPO, source, tokens: [TOKEN], pageSize: 3, ...opts });
  const home = tempDir();
  const env = {
    HF_ENDPOINT: hub.endpoint,
    HF_HOME: path.join(home, "hf"),
    HF_HUB_CACHE: path.join(home, "hub-cache"),
    HF_TOKEN: TOKEN,
    HF_TOKEN_PATH: path.join(home, "no-token-file"),
  };
  try {
    await body({ hub, home, env });
  } finally {
    await hub.close();
    outputs.push(hub.logText());
    assert.equal(hub.storageAuthSeen, 0, "the token must never reach the storage host");
    try {
      // (home/token is the user's token file one test writes: the token belongs there.)
      for (const file of filesUnder(home).filter((f) => f !== path.join(home, "token"))) {
        const bytes = Buffer.from(Deno.readFileSync(file));
        assert.equal(bytes.indexOf(TOKEN), -1, `the token was written to ${file}`);
      }
    } finally {
      await Deno.remove(home, { recursive: true }).catch(() => {});
    }
  }
}

/** Every regular file under `dir` (manifests, progress records, downloads), not following links. */
function filesUnder(dir: string): string[] {
  const out: string[] = [];
  for (const e of Deno.readDirSync(dir)) {
    const p = path.join(dir, e.name);
    if (e.isDirectory) out.push(...filesUnder(p));
    else if (e.isFile) out.push(p);
  }
  return out;
}

/** `k3 ARGS` in a child process; a run that hangs is killed after 60 s and fails the test. */
async function k3(args: string[], env: Record<string, string>) {
  const timer = setTimeout(() => hung = true, 60_000);
  let hung = false;
  const watchdog = setInterval(() => {
    if (hung) {
      for (const pid of childPids(Deno.pid)) Deno.kill(pid, "SIGKILL");
    }
  }, 1000);
  try {
    const r = await runK3(args, env);
    outputs.push(r.stdout, r.stderr);
    assert.ok(!hung, `k3 ${args.join(" ")} hung:\n${r.stderr}`);
    return r;
  } finally {
    clearTimeout(timer);
    clearInterval(watchdog);
  }
}

/** Child processes of `pid` (Linux /proc), spawned from any of its threads. */
function childPids(pid: number): number[] {
  const pids: number[] = [];
  try {
    for (const task of Deno.readDirSync(`/proc/${pid}/task`)) {
      const text = Deno.readTextFileSync(`/proc/${pid}/task/${task.name}/children`);
      pids.push(...text.trim().split(/\s+/).filter(Boolean).map(Number));
    }
  } catch {
    // Not Linux, or the process is gone.
  }
  return pids;
}

/** Files of `dir` (recursively, outside .k3) that differ from the source or are missing. */
function differences(dir: string, hub: StandInHub, want = hub.files.map((f) => f.path)): string[] {
  const bad: string[] = [];
  for (const f of hub.files) {
    let got: Uint8Array | undefined;
    try {
      got = Deno.readFileSync(path.join(dir, f.path));
    } catch {
      if (want.includes(f.path)) bad.push(`${f.path} missing`);
      continue;
    }
    if (!Buffer.from(got).equals(Buffer.from(f.bytes))) bad.push(`${f.path} differs`);
  }
  return bad;
}

/** No file under its final name has wrong bytes (missing ones are fine). */
function noWrongFinalFiles(dir: string, hub: StandInHub): void {
  assert.deepEqual(differences(dir, hub, []), []);
}

const RUN = ["--ids", "4,8,15,16,23", "--gen", "6", "--ignore-eos", "--quiet"];

Deno.test("sha256: libk3 (SHA-NI and portable) equals node:crypto, and resumes from saved state", async () => {
  const data = new Uint8Array(3 * 65536 + 77);
  for (let i = 0; i < data.length; i++) data[i] = (i * 2654435761) >>> 24;
  const impls = [sha256Impl()];
  try {
    Deno.env.set("K3_ISA", "scalar");
    impls.push(sha256Impl());
    for (const isa of ["scalar", "native"]) {
      if (isa === "native") Deno.env.delete("K3_ISA");
      for (const n of [0, 1, 55, 56, 63, 64, 65, 119, 128, 1000, data.length]) {
        const whole = n - (n % 64);
        const cut = Math.floor(whole / 128) * 64;
        const h = Sha256.fresh();
        await h.update(data.subarray(0, cut));
        const resumed = Sha256.resume(JSON.parse(JSON.stringify(h.saved())))!;
        await resumed.update(data.subarray(cut, whole));
        const want = createHash("sha256").update(data.subarray(0, n)).digest("hex");
        assert.equal(resumed.digest(data.subarray(whole, n)), want, `${isa} n=${n}`);
      }
    }
  } finally {
    Deno.env.delete("K3_ISA");
  }
  assert.equal(impls[1], "scalar");
  assert.equal(Sha256.resume({ state: "zz", bytes: 0 }), null);
  assert.equal(Sha256.resume({ state: "0".repeat(64), bytes: 63 }), null);
  await assert.rejects(Sha256.fresh().update(new Uint8Array(10)));
});

Deno.test("hub config: endpoint, token sources in the Hub's order, redaction, globs, Retry-After", () => {
  const home = tempDir();
  try {
    Deno.mkdirSync(path.join(home, "hf"));
    Deno.writeTextFileSync(path.join(home, "hf", "token"), "hf_fromHome\n");
    Deno.writeTextFileSync(path.join(home, "tokfile"), "hf_fromPath\n");
    assert.equal(hubEndpoint({}), "https://huggingface.co");
    assert.equal(hubEndpoint({ HF_ENDPOINT: "http://127.0.0.1:9/" }), "http://127.0.0.1:9");
    assert.throws(() => hubEndpoint({ HF_ENDPOINT: "ftp://x" }), /HF_ENDPOINT/);
    const hfHome = path.join(home, "hf");
    assert.equal(hubToken({ HF_TOKEN: "hf_env", HF_HOME: hfHome })?.value, "hf_env");
    assert.equal(hubToken({ HF_HOME: hfHome })?.value, "hf_fromHome");
    assert.equal(hubToken({ HF_HOME: hfHome })?.source, path.join(hfHome, "token"));
    const viaPath = hubToken({ HF_HOME: hfHome, HF_TOKEN_PATH: path.join(home, "tokfile") });
    assert.equal(viaPath?.value, "hf_fromPath");
    assert.equal(hubToken({ XDG_CACHE_HOME: home }), undefined);
    assert.throws(() => hubToken({ HF_TOKEN: "hf_a b" }), /spaces or control/);
    assert.equal(redact("x hf_env y hf_env", { value: "hf_env", source: "" }), "x hf_*** y hf_***");
  } finally {
    Deno.removeSync(home, { recursive: true });
  }
  assert.ok(globToRegExp("*.safetensors").test("a/b/model-1.safetensors"));
  assert.ok(globToRegExp("model-0000[12]-*").test("model-00002-of-4"));
  assert.ok(!globToRegExp("model-0000[!12]-*").test("model-00002-of-4"));
  assert.ok(globToRegExp("config.json").test("config.json"));
  assert.ok(!globToRegExp("config.json").test("configXjson"));
  for (const bad of ["../x", "/etc/passwd", "a//b", "a/./b", "a\\b", ""]) {
    assert.ok(!safeRelativePath(bad), bad);
  }
  assert.equal(retryAfterSeconds("3"), 3);
  assert.equal(retryAfterSeconds(new Date(Date.now() + 5000).toUTCString())! > 3, true);
  assert.equal(retryAfterSeconds(null), undefined);
  assert.equal(autoPieceSize(17e9, 8), 64 << 20);
  assert.equal(autoPieceSize(300e6, 8), 9 << 20);
  assert.equal(autoPieceSize(10, 8), 1 << 20);
});

Deno.test("the Hub cache path and folder names agree with @huggingface/hub; run, chat, serve, verify and mod.ts do not load it", async () => {
  const names = ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"];
  const saved = names.map((n) => Deno.env.get(n));
  const cases: Record<string, string>[] = [
    {},
    { XDG_CACHE_HOME: "/x/cache" },
    { HF_HOME: "/h", XDG_CACHE_HOME: "/x/cache" },
    { HUGGINGFACE_HUB_CACHE: "/old", HF_HOME: "/h" },
    { HF_HUB_CACHE: "/new", HUGGINGFACE_HUB_CACHE: "/old", HF_HOME: "/h" },
  ];
  try {
    for (const c of cases) {
      for (const n of names) c[n] === undefined ? Deno.env.delete(n) : Deno.env.set(n, c[n]);
      assert.equal(hubCachePath(), getHFHubCachePath(), JSON.stringify(c));
    }
  } finally {
    names.forEach((n, i) =>
      saved[i] === undefined ? Deno.env.delete(n) : Deno.env.set(n, saved[i]!)
    );
  }
  for (const repo of [REPO, "gpt2", "a.b/c-d_e"]) {
    assert.equal(repoFolderName(repo), getRepoFolderName({ type: "model", name: repo }));
  }
  // The library costs a start about 130 ms: only `k3 download` loads it.
  for (
    const entry of [
      "mod.ts",
      "lib/cli/run.ts",
      "lib/cli/chat.ts",
      "lib/cli/serve.ts",
      "lib/cli/verify.ts",
      "lib/cli/download.ts",
    ]
  ) {
    const out = await new Deno.Command(Deno.execPath(), {
      args: [
        "info",
        "--json",
        "--config",
        path.join(repoRoot, "deno.json"),
        path.join(repoRoot, entry),
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    assert.equal(out.code, 0, new TextDecoder().decode(out.stderr));
    const graph = JSON.parse(new TextDecoder().decode(out.stdout));
    const loads = JSON.stringify(graph.modules.map((m: { specifier: string }) => m.specifier))
      .includes("@huggingface/hub");
    assert.equal(loads, entry === "lib/cli/download.ts", entry);
  }
});

Deno.test("download: full download into DIR, then run equals the original byte for byte; verify catches a flipped byte", async () => {
  await withHub({ private: true }, async ({ hub, home, env }) => {
    const dir = path.join(home, "model");
    const r = await k3(
      ["download", REPO, dir, "--connections", "4", "--piece-size", "64K", "--verbose"],
      env,
    );
    assert.equal(r.code, 0, r.stderr);
    assert.deepEqual(differences(dir, hub), []);
    assert.match(r.stderr, /every file verified/);
    const manifest = JSON.parse(Deno.readTextFileSync(path.join(dir, ".k3", "manifest.json")));
    assert.equal(manifest.commit, hub.commit);
    assert.equal(manifest.wanted.length, hub.files.length);
    // Resolved once to the commit; files fetched by that commit, via redirects to storage.
    assert.match(hub.logText(), new RegExp(`resolve/${hub.commit}/model-00001`));
    assert.match(hub.logText(), /storage GET \/blobs\/[0-9a-f]{64}\?\S+ bytes=65536-131071 -> 206/);
    assert.match(hub.logText(), /cursor=3/); // the tree API's pages were followed
    assert.deepEqual([...Deno.readDirSync(path.join(dir, ".k3", "partial"))], []);

    const source = hub.opts.source;
    const a = await k3(["run", dir, ...RUN, "--dump-logits", path.join(home, "a.bin")], env);
    const b = await k3(["run", source, ...RUN, "--dump-logits", path.join(home, "b.bin")], env);
    assert.equal(a.code, 0, a.stderr);
    assert.equal(a.stdout, b.stdout);
    assert.ok(a.stdout.trim().length > 0);
    assert.deepEqual(
      Deno.readFileSync(path.join(home, "a.bin")),
      Deno.readFileSync(path.join(home, "b.bin")),
    );

    const ok = await k3(["verify", dir], env);
    assert.equal(ok.code, 0, ok.stderr);
    assert.match(ok.stdout, /verified 10 files .* all match/);
    // A re-run finds everything in place and fetches nothing.
    const served = hub.bytesServed;
    const again = await k3(["download", dir, "--verbose"], env);
    assert.equal(again.code, 0, again.stderr);
    assert.equal(hub.bytesServed, served);
    assert.match(again.stderr, /0 fetched and verified; 10 already in place, checked by size/);

    const shard = path.join(dir, "model-00002-of-00004.safetensors");
    const bytes = Deno.readFileSync(shard);
    bytes[bytes.length - 100] ^= 0x01;
    Deno.writeFileSync(shard, bytes);
    const bad = await k3(["verify", dir], env);
    assert.equal(bad.code, 4);
    assert.match(
      bad.stderr,
      /model-00002-of-00004\.safetensors SHA-256 is [0-9a-f]{64}, the manifest says/,
    );
    assert.match(bad.stderr, /the model is unusable/);
    const fast = await k3(["verify", dir, "--fast"], env);
    assert.equal(fast.code, 0, "--fast checks sizes only");
    Deno.truncateSync(shard, 1000);
    const short = await k3(["verify", dir, "--fast"], env);
    assert.equal(short.code, 4);
    assert.match(short.stderr, /model-00002-of-00004\.safetensors has 1000 bytes/);
  });
});

Deno.test("download --hub-cache: the Hub's cache layout, then run, chat, serve and verify by repo id", async () => {
  await withHub({}, async ({ hub, home, env }) => {
    for (const command of [["run", REPO, ...RUN], ["chat", REPO], ["serve", REPO, "--port", "0"]]) {
      const missing = await k3(command, env);
      assert.equal(missing.code, 2, command[0]);
      assert.match(
        missing.stderr,
        /Hub cache .* has no moonshotai\/Kimi-K3: download it with `k3 download moonshotai\/Kimi-K3 --hub-cache`/,
      );
    }

    const r = await k3(["download", REPO, "--hub-cache", "--connections", "3"], env);
    assert.equal(r.code, 0, r.stderr);
    // Not a terminal: what, from where, how much, and the summary; no status line drawn.
    const said = r.stderr.trimEnd().split("\n");
    assert.equal(said.length, 3, r.stderr);
    assert.match(
      said[0],
      /^k3 download: moonshotai\/Kimi-K3@main from http:\/\/127\.0\.0\.1:\d+ into the Hub cache$/,
    );
    assert.match(
      said[1],
      /^moonshotai\/Kimi-K3@[0-9a-f]{12}: 10 files, 4\.\d+ MB; 4\.\d+ MB to fetch into /,
    );
    assert.match(
      said[2],
      /^downloaded moonshotai\/Kimi-K3@[0-9a-f]{12} into .*: 10 files, .*every file verified$/,
    );
    const storage = path.join(env.HF_HUB_CACHE, "models--moonshotai--Kimi-K3");
    assert.equal(Deno.readTextFileSync(path.join(storage, "refs", "main")), hub.commit);
    const snapshot = path.join(storage, "snapshots", hub.commit);
    const shard = hub.files.find((f) => f.path === "model-00001-of-00004.safetensors")!;
    assert.equal(
      Deno.readLinkSync(path.join(snapshot, shard.path)),
      path.join("..", "..", "blobs", shard.sha256),
    );
    const notes = hub.files.find((f) => f.path === "original/notes.txt")!;
    assert.equal(
      Deno.readLinkSync(path.join(snapshot, notes.path)),
      path.join("..", "..", "..", "blobs", notes.gitOid),
    );
    assert.deepEqual(differences(snapshot, hub), []);

    const a = await k3(["run", REPO, ...RUN], env);
    const b = await k3(["run", hub.opts.source, ...RUN], env);
    assert.equal(a.code, 0, a.stderr);
    assert.equal(a.stdout, b.stdout);
    // chat and serve find it by repo id the same way; serve names it by the repo id.
    const chat = await chatOnce([REPO, "--max-tokens", "3", "--thinking", "off"], env);
    assert.equal(chat.code, 0, chat.stderr);
    // Three tokens: the first from the prefill pass, two from decode steps.
    assert.match(chat.stderr, /turn 1: prefill \d+ tokens .*decode 2 tokens/);
    assert.deepEqual(await servedModels(REPO, env), ["kimi-k3", REPO]);
    const v = await k3(["verify", REPO], env);
    assert.equal(v.code, 0, v.stderr);
    // Without the k3 manifest (as `hf download` leaves it), verify reads the blob names.
    Deno.removeSync(path.join(snapshot, ".k3"), { recursive: true });
    const v2 = await k3(["verify", `${REPO}@${hub.commit}`], env);
    assert.equal(v2.code, 0, v2.stderr);
    Deno.writeFileSync(path.join(storage, "blobs", shard.sha256), new Uint8Array(shard.size));
    const v3 = await k3(["verify", REPO], env);
    assert.equal(v3.code, 4);
    assert.match(v3.stderr, /model-00001-of-00004\.safetensors SHA-256/);
    void home;
  });
});

/** The k3 CLI in a child process, as spawned by hand (stdin piped, or reading its stdout). */
function spawnK3(args: string[], env: Record<string, string>, stdin: "piped" | "null") {
  return new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      "--quiet",
      "--config",
      path.join(repoRoot, "deno.json"),
      path.join(repoRoot, "main.ts"),
      ...args,
    ],
    env,
    stdin,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
}

/** `k3 chat ARGS` with one user line on stdin. */
async function chatOnce(args: string[], env: Record<string, string>) {
  const child = spawnK3(["chat", ...args], env, "piped");
  const w = child.stdin.getWriter();
  await w.write(new TextEncoder().encode("Hello there!\n"));
  await w.close();
  const out = await child.output();
  const dec = new TextDecoder();
  const r = { code: out.code, stdout: dec.decode(out.stdout), stderr: dec.decode(out.stderr) };
  outputs.push(r.stdout, r.stderr);
  return r;
}

/** Starts `k3 serve MODEL --port 0`, reads /health's model names, stops it with SIGTERM. */
async function servedModels(model: string, env: Record<string, string>): Promise<string[]> {
  const child = spawnK3(["serve", model, "--port", "0", "--threads", "1"], env, "null");
  const stderr = new Response(child.stderr).text();
  let out = "";
  try {
    const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    while (!/listening on (\S+)/.test(out)) {
      const { value, done } = await lines.read();
      if (done) break;
      out += value;
    }
    lines.releaseLock();
    const url = /listening on (\S+)/.exec(out)?.[1];
    assert.ok(url, `k3 serve did not start: ${out}`);
    const health = await (await fetch(`${url.replace(/\/v1$/, "")}/health`)).json();
    return health.models;
  } finally {
    child.kill("SIGTERM");
    await child.status;
    await child.stdout.cancel().catch(() => {});
    outputs.push(out, await stderr);
  }
}

/** Spawns `k3 download`, sends `signal` once the storage host sent `fraction` of the LFS bytes. */
async function killMidway(
  hub: StandInHub,
  args: string[],
  env: Record<string, string>,
  fraction: number,
  signal: "SIGKILL" | "SIGINT" = "SIGKILL",
) {
  const total = hub.files.filter((f) => f.lfs).reduce((s, f) => s + f.size, 0);
  const start = hub.bytesServed;
  const child = spawnK3(args, env, "null");
  const deadline = performance.now() + 20_000;
  while (hub.bytesServed - start < fraction * total && performance.now() < deadline) {
    await new Promise((r) => setTimeout(r, 20));
  }
  child.kill(signal);
  const out = await child.output();
  const dec = new TextDecoder();
  const r = { code: out.code, signal: out.signal, stderr: dec.decode(out.stderr) };
  outputs.push(dec.decode(out.stdout), r.stderr);
  if (signal === "SIGKILL") {
    assert.equal(out.signal, "SIGKILL", "the download must still be running when killed");
  }
  return r;
}

Deno.test("download: Ctrl-C (exit 130) and SIGKILL mid-transfer, then resume: finishes, verifies, refetches little and rehashes nothing", async () => {
  await withHub({ rate: 1_000_000 }, async ({ hub, home, env }) => {
    const dir = path.join(home, "model");
    const args = ["download", REPO, dir, "--piece-size", "64K", "--connections", "4"];
    const total = hub.files.filter((f) => f.lfs).reduce((s, f) => s + f.size, 0);
    const recorded = hub.commit;
    const int = await killMidway(hub, args, env, 0.4, "SIGINT");
    assert.equal(int.code, 130, int.stderr);
    assert.match(int.stderr, /interrupted\. Partial data is kept in .*; re-run the same command/);
    noWrongFinalFiles(dir, hub);
    const records = [...Deno.readDirSync(path.join(dir, ".k3", "partial"))]
      .filter((e) => e.name.endsWith(".part.json"));
    assert.ok(records.length > 0, "Ctrl-C leaves a progress record for each unfinished file");
    assert.ok(
      [...Deno.readDirSync(path.join(dir, ".k3", "partial"))].length > 0,
      "partial data kept",
    );
    await killMidway(hub, args, env, 0.3);
    noWrongFinalFiles(dir, hub);
    // main moves on: the resume must finish the recorded commit.
    const moved = hub.newCommit("main");
    hub.opts.rate = 0;
    const before = hub.bytesServed;
    const r = await k3([...args, "--verbose"], env);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /resuming with/);
    assert.deepEqual(differences(dir, hub), []);
    assert.ok(!hub.logText().includes(`resolve/${moved}`), "the resume uses the recorded commit");
    assert.equal(
      JSON.parse(Deno.readTextFileSync(path.join(dir, ".k3", "manifest.json"))).commit,
      recorded,
    );
    // Across three runs the storage host sent little more than the LFS total: no restart.
    assert.ok(hub.bytesServed < total * 1.5, `served ${hub.bytesServed} for ${total}`);
    assert.ok(hub.bytesServed - before < total * 0.8, "the last run fetched only what was missing");
    // Bytes hashed by the last run: only what it had not hashed before.
    const m = r.stderr.match(/(\d+\.\d+) (kB|MB) kept from before; hashed (\d+\.\d+) (kB|MB)/);
    assert.ok(m, r.stderr);
    const mb = (v: string, u: string) => Number(v) / (u === "kB" ? 1000 : 1);
    assert.ok(mb(m[1], m[2]) > 0.5, "kept data from the killed runs");
    assert.ok(
      mb(m[3], m[4]) < (total + 200_000) / 1e6 - mb(m[1], m[2]) * 0.5,
      "did not re-hash everything",
    );
    const v = await k3(["verify", dir], env);
    assert.equal(v.code, 0, v.stderr);
  });
});

Deno.test("download: SIGKILL inside a large piece, then resume: the piece continues from its bytes on disk", async () => {
  await withHub({ rate: 200_000 }, async ({ hub, home, env }) => {
    const dir = path.join(home, "model");
    // One piece per file: every byte kept after the kill comes from a piece still in flight.
    const args = ["download", REPO, dir, "--piece-size", "4M", "--connections", "2"];
    const total = hub.files.filter((f) => f.lfs).reduce((s, f) => s + f.size, 0);
    await killMidway(hub, args, env, 0.2);
    noWrongFinalFiles(dir, hub);
    const served = hub.bytesServed;
    hub.opts.rate = 0;
    const r = await k3([...args, "--verbose"], env);
    assert.equal(r.code, 0, r.stderr);
    const kept = r.stderr.match(/model-00001-of-00004\.safetensors: resuming with ([\d.]+) kB/);
    assert.ok(kept && Number(kept[1]) > 150, `kept the bytes of the piece in flight:\n${r.stderr}`);
    assert.deepEqual(differences(dir, hub), []);
    // Fetched again: at most what arrived after the last record (about a second's worth).
    assert.ok(hub.bytesServed < total + 0.5 * served, `served ${hub.bytesServed} for ${total}`);
    const v = await k3(["verify", dir], env);
    assert.equal(v.code, 0, v.stderr);
  });
});

/** One download under `faults`; returns the result after checking no final file is wrong. */
async function faulty(faults: Fault[], extra: string[] = [], opts = {}) {
  let result: Awaited<ReturnType<typeof k3>> | undefined;
  let log = "";
  await withHub(opts, async ({ hub, home, env }) => {
    hub.faults = faults;
    const dir = path.join(home, "model");
    result = await k3(["download", REPO, dir, "--piece-size", "64K", "--verbose", ...extra], env);
    noWrongFinalFiles(dir, hub);
    if (result.code === 0) assert.deepEqual(differences(dir, hub), []);
    log = hub.logText();
  });
  return { ...result!, log };
}

Deno.test("download faults: 5xx, 429 + Retry-After, cuts, stalls, slow and wrong bodies are retried", async () => {
  const r500 = await faulty([{ where: "storage", kind: "status", status: 503, times: 3 }]);
  assert.equal(r500.code, 0, r500.stderr);
  assert.match(r500.stderr, /retry .* HTTP 503/);

  const api500 = await faulty([{ where: "api", kind: "status", status: 500, times: 2 }]);
  assert.equal(api500.code, 0, api500.stderr);

  const t0 = performance.now();
  const r429 = await faulty([{
    where: "storage",
    kind: "status",
    status: 429,
    retryAfter: 1,
    match: "blobs",
  }]);
  assert.equal(r429.code, 0, r429.stderr);
  assert.match(r429.stderr, /retry .* in 1\.\d s: HTTP 429/);
  assert.ok(performance.now() - t0 > 1000, "waited for Retry-After");

  const cut = await faulty([{ where: "storage", kind: "cut", times: 3 }]);
  assert.equal(cut.code, 0, cut.stderr);
  assert.match(cut.stderr, /retry .*(dropped mid-body|ended .* early)/);

  const cutHub = await faulty([{ where: "resolve", kind: "cut", match: "config.json" }]);
  assert.equal(cutHub.code, 0, cutHub.stderr);

  const stall = await faulty([{ where: "storage", kind: "stall" }], ["--stall-timeout", "0.5"]);
  assert.equal(stall.code, 0, stall.stderr);
  assert.match(stall.stderr, /stalled/);

  const slow = await faulty([{ where: "storage", kind: "slow", times: 4 }]);
  assert.equal(slow.code, 0, slow.stderr);

  const corrupt = await faulty([{ where: "storage", kind: "corrupt", match: "blobs" }]);
  assert.equal(corrupt.code, 0, corrupt.stderr);
  assert.match(corrupt.stderr, /hash to .* the Hub lists .*; fetching it again/);
});

Deno.test("download faults: errors are clear, with the right exit code, partial data kept", async () => {
  const corrupt = await faulty([{
    where: "storage",
    kind: "corrupt",
    times: Infinity,
    match: "blobs",
  }]);
  assert.equal(corrupt.code, 4);
  assert.match(corrupt.stderr, /\.safetensors|tiktoken\.model/);
  assert.match(corrupt.stderr, /\(twice\): the Hub or something on the way serves wrong bytes/);

  const gaveUp = await faulty(
    [{ where: "storage", kind: "status", status: 500, times: Infinity }],
    ["--retry-for", "1"],
  );
  assert.equal(gaveUp.code, 5, "a Hub that keeps failing is a network failure");
  assert.match(
    gaveUp.stderr,
    /network failure: gave up on .* after 1\.\d s of failures \(last: HTTP 500 from 127\.0\.0\.1:\d+\)/,
  );
  assert.ok(!gaveUp.stderr.includes("RUN INVALID"), gaveUp.stderr);
  assert.match(
    gaveUp.stderr,
    /^download failed after \d+\.\d s: fetched .* on disk, files \d+\/10$/m,
  );
  assert.match(gaveUp.stderr, /Partial data is kept in .*; re-run the same command to resume/);

  const api401 = await faulty([{ where: "api", kind: "status", status: 401 }]);
  assert.equal(api401.code, 2);
  assert.match(
    api401.stderr,
    /rejected the token from HF_TOKEN \(HTTP 401 for moonshotai\/Kimi-K3@main\)/,
  );
  const api403 = await faulty([{ where: "api", kind: "status", status: 403 }]);
  assert.equal(api403.code, 2);
  assert.match(api403.stderr, /refused access .* gated/);
  const api404 = await faulty([{ where: "api", kind: "status", status: 404 }]);
  assert.equal(api404.code, 2);
  assert.match(api404.stderr, /has no moonshotai\/Kimi-K3@main \(HTTP 404\)/);
  for (const status of [401, 403, 404]) {
    const r = await faulty([{ where: "resolve", kind: "status", status, match: "model-00003" }]);
    assert.equal(r.code, 2, `${status}: ${r.stderr}`);
    assert.match(
      r.stderr,
      new RegExp(
        `HTTP ${status} for model-00003-of-00004\\.safetensors|model-00003-of-00004\\.safetensors of .*HTTP ${status}`,
      ),
    );
  }
  const expired = await faulty([{ where: "storage", kind: "status", status: 403, times: 2 }]);
  assert.equal(expired.code, 0, "an expired storage link is resolved again");
  assert.match(expired.stderr, /link expired/);
  const rev = await faulty([], ["--revision", "no-such-branch"]);
  assert.equal(rev.code, 2);
  assert.match(rev.stderr, /no-such-branch \(HTTP 404\)/);
});

/** A local port nothing listens on (bound, then closed): connecting to it is refused. */
function closedPort(): number {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (listener.addr as Deno.NetAddr).port;
  listener.close();
  return port;
}

/** Runs `k3 ARGS` and notes when each stderr line arrived (seconds after the spawn). */
async function timedLines(args: string[], env: Record<string, string>) {
  const t0 = performance.now();
  const child = spawnK3(args, env, "null");
  const lines: { at: number; text: string }[] = [];
  let partial = "";
  const decoder = new TextDecoder();
  for await (const chunk of child.stderr) {
    const parts = (partial + decoder.decode(chunk, { stream: true })).split("\n");
    partial = parts.pop()!;
    for (const text of parts) lines.push({ at: (performance.now() - t0) / 1000, text });
  }
  const out = await child.output();
  const seconds = (performance.now() - t0) / 1000;
  outputs.push(new TextDecoder().decode(out.stdout), lines.map((l) => l.text).join("\n"));
  return { code: out.code, lines, seconds, text: lines.map((l) => l.text).join("\n") };
}

Deno.test("download with the Hub unreachable: the first line at once, each retry with its time, exit 5 at --retry-for", async () => {
  const home = tempDir();
  try {
    const endpoint = `http://127.0.0.1:${closedPort()}`;
    const r = await timedLines(["download", REPO, path.join(home, "m"), "--retry-for", "2"], {
      HF_ENDPOINT: endpoint,
      HF_HOME: path.join(home, "hf"),
      HF_TOKEN: "",
      HF_TOKEN_PATH: path.join(home, "no-token-file"),
    });
    assert.equal(r.code, 5, r.text);
    const first = r.lines[0];
    assert.equal(first.text, `k3 download: ${REPO}@main from ${endpoint} into ${home}/m`);
    // Deno's start-up is most of it; the line itself precedes any request.
    assert.ok(first.at < 2.5, `first line after ${first.at.toFixed(2)} s`);
    const retries = r.lines.filter((l) => l.text.startsWith("retry the Hub API in "));
    assert.ok(retries.length >= 3, r.text);
    for (const l of retries) {
      assert.match(
        l.text,
        /^retry the Hub API in \d+\.\d s: connection to 127\.0\.0\.1:\d+ failed \(.*Connection refused.*\) \(next attempt at \d\d:\d\d:\d\d; giving up if it still fails in \d+\.\d s, --retry-for\)$/,
      );
    }
    assert.ok(retries[0].at < first.at + 1, "the first retry is printed as it happens");
    assert.match(r.text, /^download failed after (\d+\.\d) s: nothing fetched/m);
    const took = Number(r.text.match(/^download failed after (\d+\.\d) s/m)![1]);
    assert.ok(took >= 2 && took < 3, `gave up after ${took} s, asked for 2`);
    const gaveUp = r.text.match(
      /network failure: gave up on the Hub API after (\d+\.\d) s of failures/,
    );
    assert.ok(gaveUp && Number(gaveUp[1]) >= 2 && Number(gaveUp[1]) < 2.5, r.text);
    assert.ok(!r.text.includes("RUN INVALID"), r.text);
    assert.ok(!existsSync(path.join(home, "m")), "nothing was made");
  } finally {
    Deno.removeSync(home, { recursive: true });
  }
});

Deno.test("download from a Hub that accepts connections and never answers: retried after --stall-timeout, exit 5", async () => {
  const home = tempDir();
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const held: Deno.Conn[] = [];
  const accepting = (async () => {
    for await (const conn of listener) held.push(conn);
  })();
  try {
    const endpoint = `http://127.0.0.1:${(listener.addr as Deno.NetAddr).port}`;
    const args = ["download", REPO, path.join(home, "m"), "--retry-for", "1.5"];
    const r = await timedLines([...args, "--stall-timeout", "0.3"], {
      HF_ENDPOINT: endpoint,
      HF_HOME: path.join(home, "hf"),
      HF_TOKEN: "",
      HF_TOKEN_PATH: path.join(home, "no-token-file"),
    });
    assert.equal(r.code, 5, r.text);
    assert.match(
      r.text,
      /^retry the Hub API in \d+\.\d s: no answer from 127\.0\.0\.1:\d+ in 0\.3 s/m,
    );
    assert.match(r.text, /network failure: gave up on the Hub API after 1\.\d s of failures/);
  } finally {
    listener.close();
    await accepting.catch(() => {});
    for (const conn of held) conn.close();
    Deno.removeSync(home, { recursive: true });
  }
});

Deno.test("download in a pipe: a progress line per interval (bytes, rate, ETA, files) and a summary", async () => {
  await withHub({ rate: 2_000_000 }, async ({ home, env }) => {
    const r = await timedLines(["download", REPO, path.join(home, "m")], {
      ...env,
      K3_PROGRESS_EVERY: "0.5",
    });
    assert.equal(r.code, 0, r.text);
    assert.ok(!r.text.includes("\r"), "no redraws in a pipe");
    const progress = r.lines.filter((l) => l.text.startsWith("Kimi-K3@"));
    assert.ok(progress.length >= 2, r.text);
    for (const l of progress) {
      assert.match(
        l.text,
        /^Kimi-K3@[0-9a-f]{7}: [\d.]+ [kMG]?B \/ 4\.\d+ MB \(\d+\.\d%\) {2}[\d.]+ [kMG]?B\/s {2}ETA \S+ {2}files \d+\/10$/,
      );
    }
    assert.ok(progress.some((l) => /ETA \d+s/.test(l.text)), "an ETA once the rate is known");
    assert.match(
      r.lines.at(-1)!.text,
      /^downloaded moonshotai\/Kimi-K3@[0-9a-f]{12} into .*: 10 files, 4\.\d+ MB \(fetched 4\.\d+ MB in \d+s, /,
    );
  });
});

Deno.test("download: a wrong token is exit 2 with a message; anonymous access to a private repo says how to log in", async () => {
  await withHub({ private: true }, async ({ home, env }) => {
    const wrong = await k3(["download", REPO, path.join(home, "m")], {
      ...env,
      HF_TOKEN: "hf_WrongToken99999",
    });
    assert.equal(wrong.code, 2);
    assert.match(wrong.stderr, /rejected the token from HF_TOKEN/);
    assert.ok(!wrong.stderr.includes("hf_WrongToken99999"));
    outputs.push(wrong.stderr.replaceAll("hf_WrongToken99999", "")); // (checked just above)
    const notHf = await k3(["download", REPO, path.join(home, "m")], {
      ...env,
      HF_TOKEN: "not-a-token",
    });
    assert.equal(notHf.code, 2);
    assert.match(notHf.stderr, /is not a Hugging Face token/);
    const tokenFile = path.join(home, "token");
    Deno.writeTextFileSync(tokenFile, `${TOKEN}\n`);
    const fromFile = await k3(
      ["download", REPO, path.join(home, "m"), "--include", "*.json"],
      { ...env, HF_TOKEN: "", HF_TOKEN_PATH: tokenFile },
    );
    assert.equal(fromFile.code, 0, fromFile.stderr);
    const anon = await k3(["download", REPO, path.join(home, "m2")], { ...env, HF_TOKEN: "" });
    assert.equal(anon.code, 2);
    assert.match(anon.stderr, /wants a token .* set HF_TOKEN/);
  });
});

Deno.test("download: not enough free space is refused before any transfer, with the numbers", async () => {
  await withHub(
    { claimSizes: { "model-00001-of-00004.safetensors": 2 ** 52 } },
    async ({ hub, home, env }) => {
      const r = await k3(["download", REPO, path.join(home, "m")], env);
      assert.equal(r.code, 2);
      assert.match(
        r.stderr,
        /not enough free space: .* needs 4503\.\d+ TB more in .*, which has .* free/,
      );
      assert.ok(!/resolve|storage/.test(hub.logText()), "no transfer started");
      // A DIR that cannot be made is bad input too, not an internal error.
      const file = path.join(home, "a-file");
      Deno.writeTextFileSync(file, "");
      const notDir = await k3(["download", REPO, path.join(file, "m")], env);
      assert.equal(notDir.code, 2, notDir.stderr);
      assert.match(notDir.stderr, /cannot write the download \(Not a directory .*a-file\/m/);
      assert.ok(!notDir.stderr.includes("Partial data is kept"));
    },
  );
});

Deno.test("download at the release's size: 96 shards, 1.56 TB listed; the free-space check refuses it with the numbers, --include takes the small files", async () => {
  // The listing of the full-size layout (lib/synth/full.ts: every shard's real name and size);
  // the stand-in serves tiny files under those names and claims the release's sizes.
  const plan = planFull({ data: "none" });
  const source = tempDir();
  const claimSizes: Record<string, number> = {};
  for (const shard of plan.shards) {
    Deno.writeTextFileSync(path.join(source, shard.file), shard.file); // distinct hashes
    claimSizes[shard.file] = shard.dataBytes;
  }
  Deno.writeTextFileSync(path.join(source, "config.json"), JSON.stringify(plan.config));
  const total = plan.shards.reduce((s, f) => s + f.dataBytes, 0);
  assert.ok(total > 1.55e12 && total < 1.57e12, `${total}`);
  try {
    await withHub({ source, claimSizes, pageSize: 50 }, async ({ hub, home, env }) => {
      const dir = path.join(home, "m");
      const r = await k3(["download", REPO, dir, "--verbose"], env);
      assert.equal(r.code, 2, r.stderr);
      assert.match(
        r.stderr,
        /not enough free space: moonshotai\/Kimi-K3@[0-9a-f]{12} needs 1\.56 TB more in .*, which has .* free\. Free .* or pick another DIR; nothing was downloaded/,
      );
      assert.match(
        r.stderr,
        /^download failed after \d+\.\d s: fetched 0 B; 0 B of 1\.56 TB on disk, files 0\/\d+$/m,
      );
      assert.ok(!/resolve|storage/.test(hub.logText()), "no transfer started");
      const small = await k3(["download", REPO, dir, "--include", "*.json"], env);
      assert.equal(small.code, 0, small.stderr);
      const m = JSON.parse(Deno.readTextFileSync(path.join(dir, ".k3", "manifest.json")));
      assert.equal(m.files.length, 97);
      assert.equal(
        m.files.reduce((s: number, f: { size: number }) => s + f.size, 0),
        total + Deno.statSync(path.join(source, "config.json")).size,
      );
      assert.deepEqual(m.wanted, ["config.json"]);
      // Asking for the rest is refused the same way, before any byte.
      const rest = await k3(["download", dir], env);
      assert.equal(rest.code, 2);
      assert.match(rest.stderr, /needs 1\.56 TB more/);
    });
  } finally {
    Deno.removeSync(source, { recursive: true });
  }
});

Deno.test("download: --include/--exclude choose files, verify and the progress line (on a terminal only)", async () => {
  await withHub({}, async ({ hub, home, env }) => {
    const dir = path.join(home, "m");
    const r = await k3(["download", REPO, dir, "--include", "*.json", "--exclude", "model.*"], env);
    assert.equal(r.code, 0, r.stderr);
    const got = [...Deno.readDirSync(dir)].map((e) => e.name).filter((n) => n !== ".k3").sort();
    assert.deepEqual(got, ["config.json", "generation_config.json", "tokenizer_config.json"]);
    assert.ok(!hub.logText().includes("storage"), "no LFS file fetched");
    // The rest, then; the manifest's wanted list grows to everything.
    const script = Deno.build.os === "linux" ? "script" : undefined;
    if (script) {
      const cmd =
        `'${Deno.execPath()}' run -A --quiet --config '${repoRoot}/deno.json' '${repoRoot}/main.ts' download '${dir}'`;
      const tty = await new Deno.Command(script, {
        args: ["-qec", cmd, "/dev/null"],
        env,
        stdout: "piped",
        stderr: "piped",
      }).output();
      const text = new TextDecoder().decode(tty.stdout);
      outputs.push(text);
      assert.equal(tty.code, 0, text);
      assert.match(
        text,
        /Kimi-K3@[0-9a-f]{7}: .* \/ 4\.\d+ MB \(100\.0%\) +\d+(\.\d+)? [kMG]?B\/s +ETA \S+ +files 10\/10/,
      );
    }
    assert.deepEqual(differences(dir, hub), []);
  });
});

Deno.test("download: file-list pages that link to themselves or never end are exit 4 naming the page", async () => {
  await withHub({ treeLinks: "self" }, async ({ hub, home, env }) => {
    const r = await k3(["download", REPO, path.join(home, "m"), "--retry-for", "600"], env);
    assert.equal(r.code, 4, r.stderr);
    assert.match(
      r.stderr,
      new RegExp(
        `file list for ${REPO}@${hub.commit}: the Hub's page http://127\\.0\\.0\\.1:\\d+/api/models/` +
          `${REPO}/tree/${hub.commit}\\?\\S+ links back to a page it already sent`,
      ),
    );
    assert.equal(hub.logText().match(/\/tree\//g)?.length, 1, "the repeated page is not fetched");
  });
  await withHub({ treeLinks: "endless" }, async ({ hub, home, env }) => {
    const r = await k3(["download", REPO, path.join(home, "m")], env);
    assert.equal(r.code, 4, r.stderr);
    assert.match(r.stderr, /the Hub sent 1000 pages and links to more \(http:\S+cursor=3000\)/);
    assert.equal(hub.logText().match(/\/tree\//g)?.length, 1000);
  });
  await withHub({ treeLinks: "flood", pageSize: 1000 }, async ({ home, env }) => {
    const r = await k3(["download", REPO, path.join(home, "m")], env);
    assert.equal(r.code, 4, r.stderr);
    assert.match(r.stderr, /file list for .*: more than 100000 entries/);
  });
});

Deno.test("download: a redirect to a file: or data: URL is exit 4 naming the Location, and nothing local is read", async () => {
  const secret = tempDir();
  const local = path.join(secret, "local.txt");
  Deno.writeTextFileSync(local, "a local file k3 must not read\n");
  try {
    for (const location of [`file://${local}`, "data:text/plain,not%20from%20the%20Hub"]) {
      const r = await faulty([{ where: "resolve", kind: "redirect", location, match: "config" }]);
      assert.equal(r.code, 4, r.stderr);
      assert.match(r.stderr, /the Hub redirected \S*config\.json to '(file|data):/);
      assert.ok(r.stderr.includes(`'${location}'; k3 follows http(s) redirects only`), r.stderr);
      // The storage host (after the Hub's own redirect) may not send k3 off http(s) either.
      const s = await faulty(
        [{ where: "storage", kind: "redirect", location, times: Infinity }],
        ["--retry-for", "1"],
      );
      assert.equal(s.code, 4, s.stderr);
      assert.match(s.stderr, /redirected to a URL that is not http\(s\)/);
      assert.ok(!s.stderr.includes("must not read"), s.stderr);
    }
  } finally {
    Deno.removeSync(secret, { recursive: true });
  }
});

/** Makes a FIFO at `file` (its folder created). */
function mkfifo(file: string): void {
  Deno.mkdirSync(path.dirname(file), { recursive: true });
  const r = new Deno.Command("mkfifo", { args: [file] }).outputSync();
  assert.equal(r.code, 0, new TextDecoder().decode(r.stderr));
}

Deno.test("download and verify refuse a FIFO in place of each file they open (exit 2 naming it, no hang)", async () => {
  await withHub({}, async ({ hub, home, env }) => {
    const dir = path.join(home, "m");
    const manifest = path.join(dir, ".k3", "manifest.json");
    mkfifo(manifest);
    for (const command of [["verify", dir], ["download", REPO, dir], ["download", dir]]) {
      const r = await k3(command, env);
      assert.equal(r.code, 2, `${command.join(" ")}: ${r.stderr}`);
      assert.match(r.stderr, /\.k3\/manifest\.json: the download manifest is a FIFO/);
    }
    Deno.removeSync(manifest);
    // A progress record and a partial file: opened for reading, then for writing.
    const shard = hub.files.find((f) => f.lfs)!;
    for (const [name, what] of [[".part.json", "progress record"], [".part", "partial file"]]) {
      const file = path.join(dir, ".k3", "partial", `${shard.sha256}${name}`);
      mkfifo(file);
      const r = await k3(["download", REPO, dir], env);
      assert.equal(r.code, 2, r.stderr);
      assert.ok(r.stderr.includes(`${file}: the ${what} is a FIFO`), r.stderr);
      Deno.removeSync(file);
    }
    // The token file, and a ref of the Hub cache.
    const tokenFile = path.join(home, "token-fifo");
    mkfifo(tokenFile);
    const noEnvToken = { ...env, HF_TOKEN: "", HF_TOKEN_PATH: tokenFile };
    const t = await k3(["download", REPO, dir], noEnvToken);
    assert.equal(t.code, 2, t.stderr);
    assert.match(t.stderr, /token-fifo: the Hub token file is a FIFO/);
    const ref = path.join(env.HF_HUB_CACHE, "models--moonshotai--Kimi-K3", "refs", "main");
    mkfifo(ref);
    const run = await k3(["run", REPO, ...RUN], env);
    assert.equal(run.code, 2, run.stderr);
    assert.match(run.stderr, /refs\/main: the Hub cache ref is a FIFO/);
    // With nothing odd left, the same folder downloads and verifies.
    const ok = await k3(["download", REPO, dir], env);
    assert.equal(ok.code, 0, ok.stderr);
    assert.equal((await k3(["verify", dir], env)).code, 0);
  });
});

Deno.test("download: temp files a killed run left are swept at the start and the end; another live process's are kept", async () => {
  await withHub({}, async ({ hub, home, env }) => {
    const dir = path.join(home, "m");
    const partial = path.join(dir, ".k3", "partial");
    Deno.mkdirSync(partial, { recursive: true });
    // The id of a process that has ended: its temps can no longer be renamed by anyone.
    const gone = new Deno.Command("true").spawn();
    await gone.status;
    const etag = hub.files.find((f) => f.lfs)!.sha256;
    const stale = [
      path.join(partial, `.${etag}.part.json.${gone.pid}.0123abcd.tmp`),
      path.join(dir, ".k3", `.manifest.json.${gone.pid}.89abcdef.tmp`),
      path.join(partial, `${etag}.part.copy`),
    ];
    // This test's own process is alive: as far as k3 knows, it is writing this temp now.
    const live = path.join(partial, `.${etag}.part.json.${Deno.pid}.4567cdef.tmp`);
    for (const f of [...stale, live]) Deno.writeTextFileSync(f, "{");
    const r = await k3(["download", REPO, dir, "--verbose"], env);
    assert.equal(r.code, 0, r.stderr);
    assert.match(r.stderr, /removed 3 temp file\(s\) an interrupted run left behind/);
    for (const f of stale) assert.ok(!existsSync(f), `${f} was left`);
    assert.ok(existsSync(live), "a live process's temp file is not k3's to remove");
    Deno.removeSync(live);
    assert.deepEqual(differences(dir, hub), []);
    assert.deepEqual([...Deno.readDirSync(partial)], []);
  });
  // At the end too: a temp whose process is alive when the run starts and gone when it ends.
  await withHub({ rate: 1_000_000 }, async ({ hub, home, env }) => {
    const dir = path.join(home, "m");
    const partial = path.join(dir, ".k3", "partial");
    Deno.mkdirSync(partial, { recursive: true });
    const brief = new Deno.Command("sleep", { args: ["60"] }).spawn();
    const temp = path.join(partial, `.x.part.json.${brief.pid}.0123abcd.tmp`);
    Deno.writeTextFileSync(temp, "{");
    const run = k3(["download", REPO, dir, "--verbose"], env);
    // Once bytes flow the start is past: the process ends while the transfer runs.
    const deadline = performance.now() + 30_000;
    while (hub.bytesServed === 0 && performance.now() < deadline) {
      await new Promise((r) => setTimeout(r, 20));
    }
    brief.kill("SIGKILL");
    await brief.status;
    const r = await run;
    assert.equal(r.code, 0, r.stderr);
    assert.doesNotMatch(r.stderr, /removed .* temp file/, "kept at the start: its process ran");
    assert.ok(!existsSync(temp), "swept at the end: its process had ended");
    assert.deepEqual(differences(dir, hub), []);
  });
});

Deno.test("the token appears in no output: stdout, stderr, messages, access logs", () => {
  assert.ok(outputs.length > 40);
  for (const text of outputs) assert.ok(!text.includes(TOKEN), "the token leaked into an output");
  assert.ok(outputs.some((t) => t.includes("storage GET")), "the access logs were checked");
});
