/**
 * The fuzz driver, run as a child process by tests/cli/fuzz.test.ts:
 *
 *   deno run -A tests/support/fuzz_cases.ts BASE_MODEL WORK_DIR RESULTS.jsonl SEED CASES SECONDS
 *
 * Each case copies the base model (hard links) with one file mutated, seeded by SEED and the
 * case number, and runs the CLI's own `main()` in this process on it, with what a user would
 * type. Mutated: shard headers, tensor data, the safetensors index, config.json, the
 * tokenizer files, the trunk pack (trunk.json and trunk.bin) and a chat history. Before a
 * case runs, a "start" line naming it is appended to RESULTS (synced), then its result: the
 * exit code, the first `k3:` line, whether the logits equal the unmutated model's, time and
 * RSS. A crash or a hang therefore leaves the case that caused it as the last line; the parent
 * watches for both, and for memory.
 */
import * as path from "node:path";
import { main } from "../../lib/cli/main.ts";
import { loadHistory } from "../../lib/chat/history.ts";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { packTrunk } from "../../lib/layout/pack.ts";
import { readConfig } from "../../lib/checkpoint/config.ts";
import { K3Error } from "../../lib/errors.ts";
import { renderChatIds } from "../../lib/text/chat.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { StandInHub } from "./hub_standin.ts";

/** A uniform float in [0, 1), seeded (mulberry32). */
export type Rng = () => number;

export function rngFor(seed: number, stream: number): Rng {
  let a = (seed ^ Math.imul(stream + 1, 0x9e3779b1)) >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const below = (rng: Rng, n: number) => Math.floor(rng() * n);
const pick = <T>(rng: Rng, xs: readonly T[]): T => xs[below(rng, xs.length)];

/** Values that break parsers and planners: edges, huge, negative, wrong types, paths. */
const INTERESTING: unknown[] = [
  0,
  -1,
  1,
  2,
  3,
  7,
  4095,
  4096,
  4097,
  65536,
  2 ** 31,
  2 ** 32,
  2 ** 53,
  1e15,
  1e300,
  -1e300,
  0.5,
  1e-300,
  "",
  "x",
  "../x",
  "/etc/passwd",
  "BF16",
  "F32",
  "U8",
  null,
  true,
  false,
  [],
  {},
  [null],
  ["x"],
  [1, 2, 3],
  [0, 1 << 30],
  { a: 1 },
];

/** A value for a JSON field: mostly an interesting one, sometimes a large list or deep nest. */
function interesting(rng: Rng): unknown {
  const r = rng();
  if (r < 0.03) return Array.from({ length: 100_000 }, (_, i) => i + 1);
  if (r < 0.05) return JSON.parse("[".repeat(5000) + "]".repeat(5000));
  if (r < 0.07) return "x".repeat(1 << 20);
  return structuredClone(pick(rng, INTERESTING));
}

/** Mutates a parsed JSON value in place at a random path; returns a note of what changed. */
export function mutateJson(value: unknown, rng: Rng): string {
  let at: unknown = value;
  let where = "$";
  // Walk down a few levels, choosing keys or indices at random.
  for (let depth = 0; depth < 6; depth++) {
    const keys = containerKeys(at);
    if (keys.length === 0) break;
    const key = pick(rng, keys);
    const child = (at as Record<string, unknown>)[key];
    if (containerKeys(child).length === 0 || rng() < 0.3) {
      return mutateField(at as Record<string, unknown>, key, `${where}.${key}`, rng);
    }
    at = child;
    where = `${where}.${key}`;
  }
  const keys = containerKeys(at);
  if (keys.length === 0) return "nothing to mutate";
  const key = pick(rng, keys);
  return mutateField(at as Record<string, unknown>, key, `${where}.${key}`, rng);
}

function containerKeys(v: unknown): string[] {
  if (Array.isArray(v)) return v.map((_, i) => String(i));
  if (typeof v === "object" && v !== null) return Object.keys(v);
  return [];
}

function mutateField(
  parent: Record<string, unknown>,
  key: string,
  where: string,
  rng: Rng,
): string {
  const r = rng();
  if (r < 0.15 && !Array.isArray(parent)) {
    delete parent[key];
    return `delete ${where}`;
  }
  const old = parent[key];
  if (r < 0.3 && typeof old === "number") {
    const v = pick(rng, [
      old + 1,
      old - 1,
      old * 2,
      -old,
      old + 4096,
      old * 1e6,
      Math.floor(old / 2),
    ]);
    parent[key] = v;
    return `${where} = ${v}`;
  }
  if (r < 0.4 && Array.isArray(old) && old.length > 0) {
    const i = below(rng, old.length);
    if (rng() < 0.5) old.splice(i, 1);
    else old.splice(i, 0, structuredClone(old[i]));
    return `${where}: list entry ${i} removed or doubled`;
  }
  const v = interesting(rng);
  parent[key] = v;
  const shown = JSON.stringify(v) ?? String(v);
  return `${where} = ${shown.length > 30 ? shown.slice(0, 27) + "..." : shown}`;
}

/** 1-3 byte-level mutations inside [lo, hi) of `bytes`; may change the length. */
export function mutateBytes(bytes: Uint8Array, lo: number, hi: number, rng: Rng) {
  let out = bytes;
  const notes: string[] = [];
  for (let n = 1 + below(rng, 3); n > 0; n--) {
    const end = Math.min(hi, out.length);
    if (end <= lo) break;
    const pos = lo + below(rng, end - lo);
    const r = rng();
    if (r < 0.35) {
      out[pos] ^= 1 << below(rng, 8);
      notes.push(`flip @${pos}`);
    } else if (r < 0.6) {
      out[pos] = pick(rng, [0, 0xff, 0x22, 0x7b, 0x7d, 0x2c, 0x3a, 0x2d, 0x30, 0x39, 0x0a, 0x5c]);
      notes.push(`set @${pos}`);
    } else if (r < 0.7) {
      out = out.subarray(0, pos).slice();
      notes.push(`truncate @${pos}`);
      break;
    } else if (r < 0.8) {
      const len = 1 + below(rng, 16);
      out = concat(out.subarray(0, pos), out.subarray(Math.min(out.length, pos + len)));
      notes.push(`delete ${len} @${pos}`);
    } else if (r < 0.9) {
      const len = 1 + below(rng, 16);
      out = concat(out.subarray(0, pos), out.subarray(pos, pos + len), out.subarray(pos));
      notes.push(`repeat ${len} @${pos}`);
    } else {
      // A digit changed: offsets, shapes and ranks are where parsers trust numbers.
      const digits: number[] = [];
      for (let i = lo; i < end; i++) if (out[i] >= 0x30 && out[i] <= 0x39) digits.push(i);
      if (digits.length === 0) continue;
      const d = pick(rng, digits);
      out[d] = 0x30 + below(rng, 10);
      notes.push(`digit @${d}`);
    }
  }
  return { bytes: out, note: notes.join(", ") };
}

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((a, p) => a + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

const enc = new TextEncoder(), dec = new TextDecoder();

/** JSON text mutated structurally (parsed) or as bytes. */
function mutateJsonText(text: Uint8Array, rng: Rng): { bytes: Uint8Array; note: string } {
  if (rng() < 0.6) {
    const value = JSON.parse(dec.decode(text));
    const note = mutateJson(value, rng);
    return { bytes: enc.encode(JSON.stringify(value, null, rng() < 0.5 ? 1 : undefined)), note };
  }
  return mutateBytes(text.slice(), 0, text.length, rng);
}

/** The kinds of case, with weights; `data` is the only kind allowed to change the logits. */
export const KINDS = [
  ["header", 4],
  ["data", 2],
  ["index", 2],
  ["config", 4],
  ["tokenizer", 2],
  ["pack", 3],
  ["packdata", 1],
  ["history", 2],
  ["loop", 1],
  ["entry", 1],
  ["fifo", 1],
  ["redirect", 1],
  ["pages", 1],
] as const;
export type Kind = typeof KINDS[number][0];

export function chooseKind(rng: Rng): Kind {
  const total = KINDS.reduce((a, [, w]) => a + w, 0);
  let r = rng() * total;
  for (const [k, w] of KINDS) if ((r -= w) < 0) return k;
  return "config";
}

/** Kinds that run `k3 download` or `k3 verify`, or no model at all: no logits to compare. */
export const NO_LOGITS: readonly Kind[] = ["history", "fifo", "redirect", "pages"];

/** One case's result line. */
export interface CaseResult {
  i: number;
  kind: Kind;
  note: string;
  code: number;
  /** The first line printed that starts with `k3:`. */
  message: string;
  /** Logits equal to the unmutated model's (null when the run wrote none). */
  same: boolean | null;
  /** The run used --verify-pack. */
  verify: boolean;
  /**
   * A config or tokenizer still valid but describing another model (another top-k, eps,
   * tokenization of the prompt...): exit 0 may then give other logits. Only set on exit 0.
   */
  variant: boolean;
  /** The exit codes this case may end with, when only some are right (a FIFO: 2). */
  expect?: number[];
  ms: number;
  rssMb: number;
}

/** A run of `main()` with its printed lines captured. */
async function runMain(args: string[]): Promise<{ code: number; lines: string[] }> {
  const lines: string[] = [];
  const saved = { error: console.error, log: console.log, warn: console.warn };
  const keep = (...a: unknown[]) => {
    lines.push(a.map((x) => (x instanceof Error ? x.stack ?? x.message : String(x))).join(" "));
  };
  console.error = console.log = console.warn = keep;
  try {
    return { code: await main(args), lines };
  } finally {
    Object.assign(console, saved);
  }
}

async function linkTree(from: string, to: string, except: string[] = []): Promise<void> {
  await Deno.mkdir(to, { recursive: true });
  for await (const e of Deno.readDir(from)) {
    if (!e.isFile || except.includes(e.name)) continue;
    await Deno.link(path.join(from, e.name), path.join(to, e.name));
  }
}

async function sameFile(a: string, b: Uint8Array): Promise<boolean | null> {
  const got = await Deno.readFile(a).catch(() => null);
  if (!got) return null;
  if (got.length !== b.length) return false;
  for (let i = 0; i < b.length; i++) if (got[i] !== b[i]) return false;
  return true;
}

/** The shards of a model directory, sorted. */
async function shardsOf(dir: string): Promise<string[]> {
  const names: string[] = [];
  for await (const e of Deno.readDir(dir)) if (e.name.endsWith(".safetensors")) names.push(e.name);
  return names.sort();
}

/** The byte where a shard's tensor data starts (8 + header length). */
function dataStart(bytes: Uint8Array): number {
  return 8 + Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
}

const BASE_HISTORY = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Weather in Paris?" },
  {
    role: "assistant",
    content: "",
    reasoning_content: "call the tool",
    tool_calls: [{
      id: "c1",
      type: "function",
      function: { name: "weather", arguments: { city: "Paris" } },
    }],
  },
  { role: "tool", tool_call_id: "c1", content: "sunny" },
  { role: "assistant", content: [{ type: "text", text: "Sunny." }] },
  { role: "user", content: "Thanks" },
];

/** Writes the mutated copy for case `i` into `dir` and says how to run it. */
export async function prepare(
  kind: Kind,
  rng: Rng,
  base: string,
  pack: string,
  dir: string,
): Promise<
  {
    note: string;
    args: (out: string) => string[];
    prompt: boolean;
    verify: boolean;
    expect?: number[];
  }
> {
  const model = path.join(dir, "model");
  const ids = (m: string) => (out: string) => ["run", m, "--ids", "5,17", ...RUN, out];
  const text = (m: string) => (out: string) => ["run", m, "--prompt", PROMPT, ...RUN, out];
  const shards = await shardsOf(base);
  if (kind === "header" || kind === "data") {
    const shard = pick(rng, shards);
    await linkTree(base, model, [shard]);
    const bytes = await Deno.readFile(path.join(base, shard));
    const start = dataStart(bytes);
    let out: { bytes: Uint8Array; note: string };
    if (kind === "data") {
      out = mutateData(bytes, start, rng);
    } else if (rng() < 0.5) {
      // The header JSON changed and re-framed with a correct length prefix.
      const header = JSON.parse(dec.decode(bytes.subarray(8, start)));
      const note = mutateJson(header, rng);
      const json = enc.encode(JSON.stringify(header));
      const prefix = new Uint8Array(8);
      new DataView(prefix.buffer).setBigUint64(0, BigInt(json.length), true);
      out = { bytes: concat(prefix, json, bytes.subarray(start)), note };
    } else {
      out = mutateBytes(bytes, 0, start, rng);
    }
    await Deno.writeFile(path.join(model, shard), out.bytes);
    return { note: `${shard}: ${out.note}`, args: ids(model), prompt: false, verify: false };
  }
  const simple: Partial<Record<Kind, string>> = {
    index: "model.safetensors.index.json",
    config: "config.json",
  };
  if (simple[kind]) {
    const name = simple[kind]!;
    await linkTree(base, model, [name]);
    const out = mutateJsonText(await Deno.readFile(path.join(base, name)), rng);
    await Deno.writeFile(path.join(model, name), out.bytes);
    return { note: `${name}: ${out.note}`, args: ids(model), prompt: false, verify: false };
  }
  if (kind === "tokenizer") {
    const name = pick(rng, ["tiktoken.model", "tokenizer_config.json"]);
    await linkTree(base, model, [name]);
    const bytes = await Deno.readFile(path.join(base, name));
    const out = name === "tiktoken.model" ? mutateRanks(bytes, rng) : mutateJsonText(bytes, rng);
    await Deno.writeFile(path.join(model, name), out.bytes);
    return { note: `${name}: ${out.note}`, args: text(model), prompt: true, verify: false };
  }
  if (kind === "pack" || kind === "packdata") {
    const trunk = path.join(dir, "trunk");
    const name = kind === "pack" ? "trunk.json" : "trunk.bin";
    await linkTree(pack, trunk, [name]);
    const bytes = await Deno.readFile(path.join(pack, name));
    const out = kind === "pack" ? mutateJsonText(bytes, rng) : mutateData(bytes, 0, rng);
    await Deno.writeFile(path.join(trunk, name), out.bytes);
    const verify = kind === "packdata" ? rng() < 0.5 : rng() < 0.3;
    const flags = ["--trunk", trunk, "--pin-layers", "0", "--ring-slots", "1"];
    if (verify) flags.push("--verify-pack");
    return {
      note: `${name}: ${out.note}`,
      args: (o) => [...ids(base)(o), ...flags],
      prompt: false,
      verify,
    };
  }
  if (kind === "loop") return await prepareLoop(rng, base, pack, dir, ids, text);
  if (kind === "entry") return await prepareEntry(rng, base, dir, ids);
  // history: handled without a model run (see runCase).
  const lines = BASE_HISTORY.map((m) => JSON.stringify(m));
  const r = rng();
  let note: string;
  if (r < 0.5) {
    const i = below(rng, lines.length);
    const value = JSON.parse(lines[i]);
    note = `line ${i + 1}: ${mutateJson(value, rng)}`;
    lines[i] = JSON.stringify(value);
  } else if (r < 0.65) {
    const i = below(rng, lines.length);
    lines.splice(i, 1, ...(rng() < 0.5 ? [] : [lines[i], lines[i]]));
    note = `line ${i + 1} removed or doubled`;
  } else {
    const all = enc.encode(lines.join("\n") + "\n");
    const out = mutateBytes(all, 0, all.length, rng);
    await Deno.mkdir(dir, { recursive: true });
    await Deno.writeFile(path.join(dir, "h.jsonl"), out.bytes);
    return { note: `bytes: ${out.note}`, args: () => [], prompt: false, verify: false };
  }
  await Deno.mkdir(dir, { recursive: true });
  await Deno.writeTextFile(path.join(dir, "h.jsonl"), lines.join("\n") + "\n");
  return { note, args: () => [], prompt: false, verify: false };
}

type Plan = Awaited<ReturnType<typeof prepare>>;

/** A symlink loop (the file -> F.loop -> the file) in place of a file the loader opens. */
async function prepareLoop(
  rng: Rng,
  base: string,
  pack: string,
  dir: string,
  ids: (m: string) => (out: string) => string[],
  text: (m: string) => (out: string) => string[],
): Promise<Plan> {
  const model = path.join(dir, "model");
  const trunk = path.join(dir, "trunk");
  const modelFiles = [...Deno.readDirSync(base)].filter((e) => e.isFile).map((e) => e.name);
  const choices = [...modelFiles, "trunk.json", "trunk.bin"];
  const name = pick(rng, choices);
  const inPack = !modelFiles.includes(name);
  await linkTree(base, model, inPack ? [] : [name]);
  if (inPack) await linkTree(pack, trunk, [name]);
  const at = path.join(inPack ? trunk : model, name);
  await Deno.symlink(`${name}.loop`, at);
  await Deno.symlink(name, `${at}.loop`);
  const trunkFlags = ["--trunk", trunk, "--pin-layers", "0", "--ring-slots", "1"];
  const tokenizerFile = name === "tiktoken.model" || name === "tokenizer_config.json";
  return {
    note: `${name}: a symlink loop`,
    args: inPack ? (o) => [...ids(model)(o), ...trunkFlags] : (tokenizerFile ? text : ids)(model),
    prompt: tokenizerFile,
    verify: false,
    expect: [2],
  };
}

/** Index entries of every JSON type (and names that are no file) at the start, middle or end. */
const ENTRY_VALUES: unknown[] = [
  "",
  ".",
  "..",
  "./",
  "a/..",
  "../x",
  "/etc/passwd",
  "x\u0000y",
  "nope.safetensors",
  null,
  0,
  -1,
  1e300,
  true,
  false,
  [],
  ["model.safetensors"],
  {},
  { a: 1 },
];

async function prepareEntry(
  rng: Rng,
  base: string,
  dir: string,
  ids: (m: string) => (out: string) => string[],
): Promise<Plan> {
  const model = path.join(dir, "model");
  const name = "model.safetensors.index.json";
  await linkTree(base, model, [name]);
  const index = JSON.parse(await Deno.readTextFile(path.join(base, name)));
  const keys = Object.keys(index.weight_map);
  const at = pick(rng, [0, keys.length - 1, below(rng, keys.length)]);
  const value = structuredClone(pick(rng, ENTRY_VALUES));
  index.weight_map[keys[at]] = value;
  await Deno.writeTextFile(path.join(model, name), JSON.stringify(index));
  return {
    note: `weight_map entry ${at} of ${keys.length} = ${JSON.stringify(value)}`,
    args: ids(model),
    prompt: false,
    verify: false,
    expect: [2],
  };
}

/** The repo the stand-in Hub serves the base model as, for the download kinds. */
const HUB_REPO = "fuzz/tiny";

/** Redirect targets: schemes k3 must not follow, and broken http ones. */
const LOCATIONS = [
  "file:///etc/passwd",
  "file:///dev/zero",
  "data:,not%20the%20Hub",
  "data:text/plain;base64,AAAA",
  "ftp://127.0.0.1/x",
  "javascript:alert(1)",
  "about:blank",
  "blob:null/0",
  "mailto:x@example.com",
  "ws://127.0.0.1:1/x",
  "",
  "http://",
  "https://[::1",
  "/nowhere",
];

/** Hard links of a folder tree (files only, symlinks left out). */
async function linkTreeDeep(from: string, to: string): Promise<void> {
  await Deno.mkdir(to, { recursive: true });
  for await (const e of Deno.readDir(from)) {
    if (e.isDirectory) await linkTreeDeep(path.join(from, e.name), path.join(to, e.name));
    else if (e.isFile) await Deno.link(path.join(from, e.name), path.join(to, e.name));
  }
}

async function mkfifo(file: string): Promise<void> {
  await Deno.mkdir(path.dirname(file), { recursive: true });
  await Deno.remove(file).catch(() => {});
  const r = await new Deno.Command("mkfifo", { args: [file] }).output();
  if (r.code !== 0) throw new Error(`mkfifo ${file} failed`);
}

/**
 * A case against the stand-in Hub (`fifo`, `redirect`, `pages`): a FIFO in place of each file
 * download and verify open, in a copy of a finished download; a redirect to another scheme;
 * file-list pages that link to themselves, or never end. Returns the plan and what undoes its
 * changes to the stand-in and the environment.
 */
async function prepareHubCase(
  kind: Kind,
  rng: Rng,
  hub: StandInHub,
  downloaded: string,
  dir: string,
): Promise<Plan & { undo: () => void }> {
  const m = path.join(dir, "m");
  const undo = () => {
    hub.faults = [];
    hub.opts.treeLinks = undefined;
    hub.opts.pageSize = 3;
    Deno.env.set("HF_TOKEN_PATH", path.join(dir, "..", "no-token"));
  };
  // Retries are not what these cases probe: a failing request gives up at once.
  const quick = ["--retry-for", "0.2", "--stall-timeout", "2"];
  await Deno.mkdir(dir, { recursive: true });
  if (kind === "fifo") {
    await linkTreeDeep(downloaded, m);
    const lfs = hub.files.filter((f) => f.lfs);
    const f = pick(rng, lfs);
    const where = pick(rng, ["manifest", "record", "partial", "token", "final"] as const);
    const command = where === "manifest" || where === "final"
      ? pick(rng, ["verify", "download"])
      : "download";
    let file: string;
    if (where === "manifest") file = path.join(m, ".k3", "manifest.json");
    else if (where === "token") {
      file = path.join(dir, "token");
      Deno.env.set("HF_TOKEN_PATH", file);
      await Deno.remove(path.join(m, ".k3", "manifest.json")); // so the Hub is asked
    } else if (where === "final") file = path.join(m, f.path);
    else {
      file = path.join(m, ".k3", "partial", `${f.sha256}.part${where === "record" ? ".json" : ""}`);
      await Deno.remove(path.join(m, f.path)); // so the file is fetched again
    }
    await mkfifo(file);
    return {
      note: `${command}: a FIFO at ${path.relative(dir, file)}`,
      args: () => command === "verify" ? ["verify", m] : ["download", m, ...quick],
      prompt: false,
      verify: false,
      // A FIFO under a final name is "not a file" to verify (4), and download replaces it.
      expect: where === "final" ? [0, 4] : [2],
      undo,
    };
  }
  if (kind === "redirect") {
    const location = pick(rng, LOCATIONS);
    const where = pick(rng, ["resolve", "storage"] as const);
    hub.faults = [{ where, kind: "redirect", location, times: Infinity }];
    const scheme = /^([a-z]+):/.exec(location)?.[1];
    return {
      note: `${where} redirects to ${JSON.stringify(location)}`,
      args: () => ["download", HUB_REPO, m, ...quick],
      prompt: false,
      verify: false,
      expect: scheme && scheme !== "http" && scheme !== "https" ? [4] : undefined,
      undo,
    };
  }
  // Pages that repeat most often; the page and entry caps (a thousand requests each) less.
  const r = rng();
  const mode = r < 0.7 ? "self" : r < 0.85 ? "endless" : "flood";
  hub.opts.treeLinks = mode;
  if (mode === "flood") hub.opts.pageSize = 1000;
  return {
    note: `tree pages: ${mode}`,
    args: () => ["download", HUB_REPO, m, ...quick],
    prompt: false,
    verify: false,
    expect: [4],
    undo,
  };
}

/** Tensor data corrupted: random bytes, NaN patterns, an MXFP4 scale of 254 or 255. */
function mutateData(bytes: Uint8Array, start: number, rng: Rng) {
  const out = bytes.slice();
  const notes: string[] = [];
  for (let n = 1 + below(rng, 4); n > 0; n--) {
    const pos = start + below(rng, out.length - start - 4);
    const r = rng();
    if (r < 0.4) {
      out[pos] ^= 1 << below(rng, 8);
      notes.push(`flip @${pos}`);
    } else if (r < 0.7) {
      out.set(pick(rng, [[0xc0, 0x7f], [0xff, 0xff], [0x80, 0x7f], [0x00, 0x00, 0xc0, 0x7f]]), pos);
      notes.push(`NaN/Inf @${pos}`);
    } else {
      out[pos] = pick(rng, [254, 255, 0]);
      notes.push(`byte ${out[pos]} @${pos}`);
    }
  }
  return { bytes: out, note: notes.join(", ") };
}

/** tiktoken.model lines: removed, doubled, swapped, rank or base64 changed, or bytes. */
function mutateRanks(bytes: Uint8Array, rng: Rng) {
  if (rng() < 0.3) return mutateBytes(bytes.slice(), 0, bytes.length, rng);
  const lines = dec.decode(bytes).split("\n");
  const i = below(rng, lines.length - 1);
  const r = rng();
  if (r < 0.25) lines.splice(i, 1);
  else if (r < 0.5) lines.splice(i, 0, lines[i]);
  else if (r < 0.7) [lines[i], lines[0]] = [lines[0], lines[i]];
  else if (r < 0.85) {
    lines[i] = lines[i].replace(/ \d+$/, ` ${pick(rng, [0, -1, 1e9, 99999, i + 1])}`);
  } else lines[i] = pick(rng, ["!!!", "", " ", "AAAA", "x y z"]) + lines[i].slice(2);
  return { bytes: enc.encode(lines.join("\n")), note: `line ${i + 1} (${r.toFixed(2)})` };
}

/**
 * True when a mutated config.json or tokenizer is still valid but is another model: its
 * parsed config differs from the base's, or it encodes the prompt to other ids. The same
 * parsed config and the same ids must give the same logits.
 */
async function isVariant(kind: Kind, base: string, model: string): Promise<boolean> {
  if (kind === "config") {
    const view = async (dir: string) => {
      const { source: _, defaultsApplied: __, ...c } = await readConfig(
        path.join(dir, "config.json"),
      );
      return JSON.stringify(c);
    };
    return await view(base) !== await view(model);
  }
  if (kind === "tokenizer") {
    const ids = async (dir: string) => {
      const t = await Tokenizer.load(dir);
      try {
        return JSON.stringify(t.encode(PROMPT));
      } finally {
        t.free();
      }
    };
    return await ids(base) !== await ids(model);
  }
  return false;
}

const PROMPT = "Hello, world! 123 über";
/** Every run: 2 tokens, no early stop, quiet, and a memory cap so no plan can grow past it. */
const RUN = ["--gen", "2", "--ignore-eos", "--quiet", "--memory-max", "3", "--dump-logits"];

if (import.meta.main) {
  const [base, work, results, seedArg, casesArg, secondsArg] = Deno.args;
  const seed = Number(seedArg), cases = Number(casesArg), seconds = Number(secondsArg);
  const log = await Deno.open(results, { write: true, create: true, append: true });
  const write = (obj: unknown) => {
    log.writeSync(enc.encode(JSON.stringify(obj) + "\n"));
    log.syncSync();
  };
  // The unmutated model's logits for the two prompts, and its trunk pack.
  const pack = path.join(work, "pack");
  await packTrunk(await openCheckpoint(base), pack);
  const reference: Record<string, Uint8Array> = {};
  const prompts: [string, string[]][] = [["ids", ["--ids", "5,17"]], ["prompt", [
    "--prompt",
    PROMPT,
  ]]];
  for (const [name, args] of prompts) {
    const out = path.join(work, `${name}.bin`);
    const r = await runMain(["run", base, ...args, ...RUN, out]);
    if (r.code !== 0) throw new Error(`the base model does not run: ${r.lines.join("\n")}`);
    reference[name] = await Deno.readFile(out);
  }
  // The download kinds: the base model served by a stand-in Hub, downloaded once.
  const hub = StandInHub.start({ repo: HUB_REPO, source: base, pageSize: 3 });
  for (const name of ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"]) Deno.env.delete(name);
  Deno.env.set("HF_ENDPOINT", hub.endpoint);
  Deno.env.set("HF_HOME", path.join(work, "hf"));
  Deno.env.set("HF_HUB_CACHE", path.join(work, "hub-cache"));
  Deno.env.set("HF_TOKEN_PATH", path.join(work, "no-token"));
  const downloaded = path.join(work, "downloaded");
  const got = await runMain(["download", HUB_REPO, downloaded]);
  if (got.code !== 0) throw new Error(`the stand-in download failed: ${got.lines.join("\n")}`);
  const tokenizer = await Tokenizer.load(base);
  const deadline = performance.now() + seconds * 1000;
  for (let i = 0; i < cases && performance.now() < deadline; i++) {
    const rng = rngFor(seed, i);
    const kind = chooseKind(rng);
    const dir = path.join(work, `case${i}`);
    const t0 = performance.now();
    const plan = NO_LOGITS.includes(kind) && kind !== "history"
      ? await prepareHubCase(kind, rng, hub, downloaded, dir)
      : await prepare(kind, rng, base, pack, dir);
    write({ start: i, kind, note: plan.note });
    let code: number, lines: string[] = [], same: boolean | null = null, variant = false;
    if (kind === "history") {
      // What `k3 chat --history` does with the file before the first turn: load, render.
      try {
        const { messages } = await loadHistory(path.join(dir, "h.jsonl"));
        renderChatIds(tokenizer, messages, { addGenerationPrompt: true });
        code = 0;
      } catch (e) {
        code = e instanceof K3Error ? e.exitCode : 1;
        lines = [e instanceof K3Error ? `k3: ${e.message}` : String((e as Error).stack ?? e)];
      }
    } else if (NO_LOGITS.includes(kind)) {
      ({ code, lines } = await runMain(plan.args("")));
      (plan as { undo?: () => void }).undo?.();
    } else {
      const out = path.join(dir, "logits.bin");
      ({ code, lines } = await runMain(plan.args(out)));
      if (code === 0) same = await sameFile(out, reference[plan.prompt ? "prompt" : "ids"]);
      if (code === 0 && !same) variant = await isVariant(kind, base, path.join(dir, "model"));
    }
    const result: CaseResult = {
      i,
      kind,
      note: plan.note,
      code,
      message: lines.find((l) => l.startsWith("k3:")) ?? lines.join(" | ").slice(0, 2000),
      same,
      verify: plan.verify,
      variant,
      expect: plan.expect,
      ms: Math.round(performance.now() - t0),
      rssMb: Math.round(Deno.memoryUsage().rss / 1e6),
    };
    write(result);
    await Deno.remove(dir, { recursive: true });
  }
  tokenizer.free();
  await hub.close();
  log.close();
}
