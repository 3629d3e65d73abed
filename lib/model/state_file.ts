/**
 * State files: a {@link SequenceState} on disk, so a later process resumes a prompt instead
 * of prefilling it again (`chat --history`, `run --save-state/--load-state`, the library).
 *
 * A state is only used when it is certainly the state that prefilling would build: it must
 * come from the same checkpoint (an identity of config.json, the shards' names, sizes and
 * mtimes, the bound layer count and the k3 version), its tokens must be a prefix of the new
 * prompt, and its bytes must pass a SHA-256. Anything else (missing, foreign, stale,
 * truncated, corrupt) is refused with a reason; the caller warns and prefills in full.
 *
 * Format, version 1, little-endian:
 *
 *     "K3STATE\0"            8 bytes, magic
 *     u32 H                  length of the header
 *     header                 H bytes of UTF-8 JSON (StateHeader below)
 *     body                   body_bytes bytes, in this order:
 *       tokens               u32 x position
 *       per KDA layer        fp32 S [heads][dim][dim], then the q, k, v conv histories
 *       (ascending index)    fp32 [(kernel - 1)][heads * dim] each
 *       per MLA layer        fp32 [position][kv_lora_rank + qk_rope_head_dim]: only the
 *       (ascending index)    occupied rows of the latent cache
 *       logits (optional)    fp32 [vocab] after the last token, so the same prompt again
 *                            needs no forward pass
 *
 * Only what resuming needs is stored; a state's size is {@link stateFileSize}. Writes go
 * through the atomic writer (temp file, fsync, rename), so a crash mid-write leaves the
 * previous state file whole; temp files of writers that died are removed on the next write
 * (a writer locks its temp file; a lock that can be taken means its writer is gone).
 */
import { createHash } from "node:crypto";
import * as path from "node:path";
import type { Checkpoint } from "../checkpoint/checkpoint.ts";
import type { K3Config } from "../checkpoint/config.ts";
import { writeAll, writeAtomically } from "../io/atomic.ts";
import { kindOf } from "../io/files.ts";
import { VERSION } from "../version.ts";
import { kdaHistoryFloats, kdaRecurrentFloats, mlaRowWidth } from "../layout/state.ts";
import { SequenceState } from "./state.ts";

const MAGIC = new TextEncoder().encode("K3STATE\0");
const FORMAT = "k3-state";
const FORMAT_VERSION = 1;
/** Headers are a few hundred bytes; anything near this is not ours. */
const MAX_HEADER = 1 << 20;

/** The JSON header of a state file. */
interface StateHeader {
  format: typeof FORMAT;
  version: typeof FORMAT_VERSION;
  /** The k3 release that wrote it. */
  k3: string;
  /** {@link checkpointIdentity} of the checkpoint it was computed with. */
  checkpoint: string;
  /** Tokens in the state. */
  position: number;
  /** Length of the stored logits, 0 when none are stored. */
  logits: number;
  kda_layers: number[];
  /** fp32 values of one KDA layer's S, and of each of its three conv histories. */
  kda_s_floats: number;
  kda_conv_floats: number;
  mla_layers: number[];
  /** fp32 values per position in one MLA layer's latent cache. */
  mla_row_floats: number;
  body_bytes: number;
  body_sha256: string;
}

/** Sizes of a state file, in bytes. */
interface StateFileSize {
  /** One more position: its token id plus one latent row in every MLA layer. */
  perPosition: number;
  /** One KDA layer: S plus the three conv histories (independent of the position). */
  perKdaLayer: number;
  /** All KDA layers together. */
  kda: number;
  /** The logits, when stored. */
  logits: number;
  /** The whole body at `positions` (the header adds a few hundred bytes). */
  body: number;
}

/** The size of a state file for `config` at `positions`, with or without logits. */
export function stateFileSize(config: K3Config, positions: number, logits = false): StateFileSize {
  const g = geometry(config);
  const perKdaLayer = 4 * (g.kdaS + 3 * g.kdaConv);
  const perPosition = 4 + 4 * g.mlaRow * g.mla.length;
  const kda = perKdaLayer * g.kda.length;
  const logitBytes = logits ? 4 * config.vocabSize : 0;
  return {
    perPosition,
    perKdaLayer,
    kda,
    logits: logitBytes,
    body: kda + positions * perPosition + logitBytes,
  };
}

/** Which layers carry which state, from the config (what SequenceState allocates). */
function geometry(c: K3Config) {
  const kda: number[] = [], mla: number[] = [];
  c.layerKinds.forEach((kind, i) => {
    if (i < c.numLayers) (kind === "kda" ? kda : mla).push(i);
  });
  return {
    kda,
    mla,
    kdaS: kdaRecurrentFloats(c),
    kdaConv: kdaHistoryFloats(c),
    mlaRow: mlaRowWidth(c),
  };
}

/**
 * The checkpoint's identity, as a hex SHA-256: config.json's bytes, every shard's name,
 * size and mtime, the number of bound layers, and the k3 release (whose numerics made the
 * state). No tensor data is read, so this is instant even for the full checkpoint.
 */
export async function checkpointIdentity(ckpt: Checkpoint): Promise<string> {
  const config = await Deno.readFile(path.join(ckpt.dir, "config.json"));
  const shards = await Promise.all(
    [...ckpt.shards].sort().map(async (f) => {
      const st = await Deno.stat(f);
      return [path.basename(f), st.size, st.mtime?.getTime() ?? 0];
    }),
  );
  return createHash("sha256")
    .update(config)
    .update(JSON.stringify({ shards, layers: ckpt.refs.layers.length, k3: VERSION }))
    .digest("hex");
}

/** The arrays of a state's body, in file order, as bytes (views, no copies). */
function bodyViews(state: SequenceState, withLogits: boolean): Uint8Array[] {
  const bytes = (a: Float32Array | Uint32Array) =>
    new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
  const views = [bytes(Uint32Array.from(state.tokens))];
  for (const i of [...state.kda.keys()].sort((a, b) => a - b)) {
    const k = state.kda.get(i)!;
    views.push(bytes(k.S), bytes(k.histQ), bytes(k.histK), bytes(k.histV));
  }
  const used = state.position * mlaRowWidth(state.config);
  for (const i of [...state.mla.keys()].sort((a, b) => a - b)) {
    views.push(bytes(state.mla.get(i)!.cache.subarray(0, used)));
  }
  if (withLogits) views.push(bytes(state.lastLogits!));
  return views;
}

/**
 * Writes `state` to `file` atomically, for the checkpoint `identity`. Logits are stored
 * when the state has them and `logits` is not false. Returns the bytes written.
 */
export async function writeStateFile(
  file: string,
  state: SequenceState,
  identity: string,
  options: { logits?: boolean } = {},
): Promise<number> {
  if (state.tokens.length !== state.position) {
    throw new Error(`state holds ${state.tokens.length} token ids for ${state.position} positions`);
  }
  const withLogits = (options.logits ?? true) && state.lastLogits !== undefined;
  const views = bodyViews(state, withLogits);
  const hash = createHash("sha256");
  let bodyBytes = 0;
  for (const v of views) {
    hash.update(v);
    bodyBytes += v.byteLength;
  }
  const g = geometry(state.config);
  const header: StateHeader = {
    format: FORMAT,
    version: FORMAT_VERSION,
    k3: VERSION,
    checkpoint: identity,
    position: state.position,
    logits: withLogits ? state.lastLogits!.length : 0,
    kda_layers: g.kda,
    kda_s_floats: g.kdaS,
    kda_conv_floats: g.kdaConv,
    mla_layers: g.mla,
    mla_row_floats: g.mlaRow,
    body_bytes: bodyBytes,
    body_sha256: hash.digest("hex"),
  };
  const json = new TextEncoder().encode(JSON.stringify(header));
  const lead = new Uint8Array(MAGIC.length + 4);
  lead.set(MAGIC);
  new DataView(lead.buffer).setUint32(MAGIC.length, json.length, true);
  await removeDeadTemps(file);
  await writeAtomically(file, async (out) => {
    await out.lock(true); // tells removeDeadTemps that this temp file's writer is alive
    await writeAll(out, lead);
    await writeAll(out, json);
    for (const v of views) await writeAll(out, v);
  });
  return lead.length + json.length + bodyBytes;
}

/** A state file read back, or why it cannot be used. */
type StateRead =
  | { ok: true; state: SequenceState; bytes: number }
  | { ok: false; reason: string };

/**
 * Reads a state file for `config` and checkpoint `identity`. With `prompt`, the state's
 * tokens must be a prefix of it (all of it only when logits are stored). Never throws for
 * a bad file: the result says why it was refused.
 */
export async function readStateFile(
  file: string,
  config: K3Config,
  identity: string,
  prompt?: readonly number[],
): Promise<StateRead> {
  let f: Deno.FsFile;
  try {
    // A FIFO or a device is refused before it is opened: opening a FIFO blocks.
    const kind = kindOf(await Deno.stat(file));
    if (kind) return { ok: false, reason: `it is ${kind}, not a regular file` };
    f = await Deno.open(file, { read: true });
  } catch (e) {
    return {
      ok: false,
      reason: e instanceof Deno.errors.NotFound ? "no such file" : (e as Error).message,
    };
  }
  try {
    return await readOpen(f, config, identity, prompt);
  } catch (e) {
    return { ok: false, reason: `cannot be read (${(e as Error).message})` };
  } finally {
    f.close();
  }
}

async function readOpen(
  f: Deno.FsFile,
  config: K3Config,
  identity: string,
  prompt: readonly number[] | undefined,
): Promise<StateRead> {
  const size = (await f.stat()).size;
  const header = await readHeader(f, size);
  if (!header.ok) return header;
  const reason = headerRefusal(header.h, config, identity, size, header.bytes);
  if (reason) return { ok: false, reason };
  return await readBody(f, header.h, config, prompt, size);
}

/** The header at the start of the file, and how many bytes it and the lead before it take. */
async function readHeader(
  f: Deno.FsFile,
  size: number,
): Promise<{ ok: true; h: StateHeader; bytes: number } | { ok: false; reason: string }> {
  const lead = new Uint8Array(MAGIC.length + 4);
  if (size < lead.length || !(await readExact(f, lead)) || !startsWith(lead, MAGIC)) {
    return { ok: false, reason: "not a k3 state file" };
  }
  const headerBytes = new DataView(lead.buffer).getUint32(MAGIC.length, true);
  if (headerBytes > MAX_HEADER) return { ok: false, reason: "not a k3 state file" };
  if (size < lead.length + headerBytes) return { ok: false, reason: truncated(size) };
  const raw = new Uint8Array(headerBytes);
  await readExact(f, raw);
  try {
    const h = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(raw));
    return { ok: true, h, bytes: lead.length + headerBytes };
  } catch {
    return { ok: false, reason: "its header is not valid JSON (not a k3 state file, or damaged)" };
  }
}

/**
 * Why a header does not fit this k3, checkpoint and model, or a file of `size` bytes whose
 * body starts at `bodyStart`; undefined when it fits.
 */
function headerRefusal(
  h: StateHeader,
  config: K3Config,
  identity: string,
  size: number,
  bodyStart: number,
): string | undefined {
  if (h?.format !== FORMAT || h.version !== FORMAT_VERSION) {
    return `not a ${FORMAT} version ${FORMAT_VERSION} file`;
  }
  if (h.k3 !== VERSION) return `written by k3 ${h.k3}, this is k3 ${VERSION}`;
  if (h.checkpoint !== identity) {
    return "made with another checkpoint, or the checkpoint's files changed since";
  }
  const g = geometry(config);
  const same = JSON.stringify([
    h.kda_layers,
    h.kda_s_floats,
    h.kda_conv_floats,
    h.mla_layers,
    h.mla_row_floats,
  ]) ===
    JSON.stringify([g.kda, g.kdaS, g.kdaConv, g.mla, g.mlaRow]);
  const validCount = (n: unknown) => Number.isSafeInteger(n) && (n as number) >= 0;
  if (
    !same || !validCount(h.position) || h.position < 1 || ![0, config.vocabSize].includes(h.logits)
  ) {
    return "its layout does not match this model";
  }
  const expected = stateFileSize(config, h.position, h.logits > 0).body;
  if (h.body_bytes !== expected) return "its layout does not match this model";
  if (size !== bodyStart + expected) {
    return size < bodyStart + expected
      ? truncated(size)
      : `has ${size - bodyStart - expected} bytes past its end`;
  }
  return undefined;
}

/**
 * The body after a header that fits: tokens (checked against `prompt` before the rest is
 * read), KDA states, MLA rows and logits, hashed as they are read.
 */
async function readBody(
  f: Deno.FsFile,
  h: StateHeader,
  config: K3Config,
  prompt: readonly number[] | undefined,
  size: number,
): Promise<StateRead> {
  const g = geometry(config);
  const state = new SequenceState(config, h.position);
  const hash = createHash("sha256");
  const read = async (view: Float32Array | Uint32Array) => {
    const bytes = new Uint8Array(view.buffer, view.byteOffset, view.byteLength);
    await readExact(f, bytes);
    hash.update(bytes);
  };
  const tokens = new Uint32Array(h.position);
  await read(tokens);
  if (prompt) {
    const usable = h.position < prompt.length || (h.position === prompt.length && h.logits > 0);
    if (!usable || tokens.some((t, i) => t !== prompt[i])) {
      return {
        ok: false,
        reason:
          `its ${h.position} tokens are not a prefix of this prompt (${prompt.length} tokens)`,
      };
    }
  }
  for (const i of g.kda) {
    const k = state.kda.get(i)!;
    for (const a of [k.S, k.histQ, k.histK, k.histV]) await read(a);
  }
  const used = h.position * g.mlaRow;
  for (const i of g.mla) await read(state.mla.get(i)!.cache.subarray(0, used));
  let logits: Float32Array | undefined;
  if (h.logits > 0) await read(logits = new Float32Array(h.logits));
  if (hash.digest("hex") !== h.body_sha256) {
    return { ok: false, reason: "its data fails the SHA-256 check (damaged)" };
  }
  if (tokens.some((t) => t >= config.vocabSize)) {
    return { ok: false, reason: "it holds token ids outside the vocabulary" };
  }
  state.position = h.position;
  for (const t of tokens) state.tokens.push(t); // no spread: a long context overflows the stack
  state.lastLogits = logits;
  return { ok: true, state, bytes: size };
}

function truncated(size: number): string {
  return `is truncated (${size} bytes)`;
}

function startsWith(a: Uint8Array, prefix: Uint8Array): boolean {
  return prefix.every((b, i) => a[i] === b);
}

/** Fills `into` from the file's position; false at a premature end of file. */
async function readExact(f: Deno.FsFile, into: Uint8Array): Promise<boolean> {
  for (let done = 0; done < into.length;) {
    const n = await f.read(into.subarray(done));
    if (n === null) return false;
    done += n;
  }
  return true;
}

/**
 * Removes temp files a killed writer of `file` left behind (`.NAME.PID.RANDOM.tmp`, from
 * lib/io/atomic.ts): a state can be gigabytes. A live writer holds an exclusive lock on its
 * temp file for the whole write ({@link writeStateFile}); the kernel drops the lock of a
 * dead one, so a temp file we can lock is garbage. This process's own temps are left alone.
 */
async function removeDeadTemps(file: string): Promise<void> {
  const dir = path.dirname(file);
  const prefix = `.${path.basename(file)}.`;
  try {
    for await (const e of Deno.readDir(dir)) {
      if (!e.isFile || !e.name.startsWith(prefix) || !e.name.endsWith(".tmp")) continue;
      if (e.name.startsWith(`${prefix}${Deno.pid}.`)) continue;
      const temp = path.join(dir, e.name);
      const f = await Deno.open(temp, { read: true, write: true }).catch(() => undefined);
      if (!f) continue;
      try {
        if (await f.tryLock(true)) await Deno.remove(temp).catch(() => {});
      } finally {
        f.close();
      }
    }
  } catch {
    // An unreadable folder: the write itself will report the problem.
  }
}
