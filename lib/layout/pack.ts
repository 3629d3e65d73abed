/**
 * The trunk pack: every non-expert tensor of each layer, copied into one 4096-aligned run
 * per layer (trunk.bin), laid out exactly as a resident or streamed block
 * (layoutOf(trunkTensors(l))), so a ring slot is filled by ONE read. trunk.json records each
 * run's offset, size and SHA-256, and the identity (size, mtime) of the shards it came from;
 * a pack whose shards changed is refused at load.
 *
 * Packing writes trunk.bin.partial and trunk.progress.json, fsyncing after every layer; a
 * pack that was interrupted resumes after its last completed layer. At the end the data is
 * fsynced and renamed into place, then trunk.json is written atomically.
 */
import { Buffer } from "node:buffer";
import { createHash } from "node:crypto";
import * as path from "node:path";
import { NativeBuffer } from "../../ffi/native.ts";
import { badInput, K3Error, runInvalid } from "../errors.ts";
import { syncDir, writeFailure, writeFileAtomic } from "../io/atomic.ts";
import { readUserText } from "../io/files.ts";
import { FileReader } from "../io/reader.ts";
import { BLOCK_ALIGN, layoutOf, trunkTensors } from "./block.ts";
import type { Checkpoint } from "../checkpoint/checkpoint.ts";
import type { LayerRefs, ModelRefs } from "../checkpoint/types.ts";

export const PACK_BIN = "trunk.bin";
export const PACK_JSON = "trunk.json";
const PARTIAL_BIN = "trunk.bin.partial";
const PROGRESS_JSON = "trunk.progress.json";
const LOCK_FILE = "trunk.lock";

/** One source shard as it was when packed. */
export interface ShardIdentity {
  file: string;
  size: number;
  mtime_ms: number;
}

/** One layer's run in trunk.bin. */
export interface PackLayer {
  index: number;
  offset: number;
  bytes: number;
  sha256: string;
  /** The block layout: tensor names (as stored), sizes and offsets inside the run. */
  tensors: { name: string; nbytes: number; offset: number }[];
}

/** trunk.json. */
export interface PackIndex {
  format: "k3-trunk";
  version: 1;
  align: 4096;
  total_bytes: number;
  shards: ShardIdentity[];
  layers: PackLayer[];
}

/** An opened, validated pack. */
export interface TrunkPack {
  dir: string;
  bin: string;
  index: PackIndex;
}

/** Progress of a pack, reported after each layer. */
export interface PackProgress {
  layer: number;
  layers: number;
  bytesDone: number;
  bytesTotal: number;
  /** Bytes written by this run (not counting a resumed part). */
  bytesThisRun: number;
  seconds: number;
  resumedFrom: number;
}

/** SHA-256 of bytes, hex. */
export function sha256Hex(bytes: Uint8Array): string {
  return createHash("sha256").update(bytes).digest("hex");
}

/** The expected layout of layer `l`'s run. */
function layerLayout(l: LayerRefs): PackLayer["tensors"] {
  const refs = trunkTensors(l);
  const { offsets } = layoutOf(refs);
  return refs.map((r, i) => ({ name: r.name, nbytes: r.nbytes, offset: offsets[i] }));
}

/** The shards holding any trunk tensor, as they are now. */
async function trunkShards(refs: ModelRefs): Promise<ShardIdentity[]> {
  const files = [...new Set(refs.layers.flatMap((l) => trunkTensors(l).map((r) => r.file)))].sort();
  return await Promise.all(files.map(async (f) => {
    const st = await Deno.stat(f);
    return { file: path.basename(f), size: st.size, mtime_ms: st.mtime?.getTime() ?? 0 };
  }));
}

function sameShards(a: ShardIdentity[], b: ShardIdentity[]): boolean {
  return JSON.stringify(a) === JSON.stringify(b);
}

/**
 * Packs the trunk of `ckpt` into `outDir`. Resumes an interrupted pack of the same shards.
 * `stopAfter` (tests) stops after that many layers as if interrupted.
 */
export async function packTrunk(
  ckpt: Checkpoint,
  outDir: string,
  onProgress?: (p: PackProgress) => void,
  stopAfter?: number,
): Promise<PackIndex> {
  try {
    await Deno.mkdir(outDir, { recursive: true });
  } catch (e) {
    throw writeFailure(outDir, e);
  }
  const lock = await lockPackDir(outDir);
  try {
    await removeStaleTemps(outDir);
    return await packLocked(ckpt, outDir, onProgress, stopAfter);
  } catch (e) {
    throw e instanceof K3Error || stopAfter !== undefined ? e : writeFailure(outDir, e);
  } finally {
    lock.close();
  }
}

/**
 * Holds an exclusive lock on TRUNK_DIR/trunk.lock while packing: a second `k3 pack` into
 * the same folder is refused instead of interleaving with the first.
 */
async function lockPackDir(dir: string): Promise<Deno.FsFile> {
  const file = path.join(dir, LOCK_FILE);
  let f: Deno.FsFile;
  try {
    f = await Deno.open(file, { read: true, write: true, create: true });
  } catch (e) {
    throw writeFailure(file, e);
  }
  if (!(await f.tryLock(true))) {
    f.close();
    throw badInput(`${dir}: another \`k3 pack\` is writing this folder (${file} is locked)`);
  }
  return f;
}

/** Temp files of writeFileAtomic left by a pack that was killed (we hold the lock). */
async function removeStaleTemps(dir: string): Promise<void> {
  const temp = /^\.trunk\.(progress\.)?json\.\d+\.[0-9a-f]{8}\.tmp$/;
  for await (const e of Deno.readDir(dir)) {
    if (e.isFile && temp.test(e.name)) await Deno.remove(path.join(dir, e.name));
  }
}

async function packLocked(
  ckpt: Checkpoint,
  outDir: string,
  onProgress?: (p: PackProgress) => void,
  stopAfter?: number,
): Promise<PackIndex> {
  const shards = await trunkShards(ckpt.refs);
  const layers = ckpt.refs.layers;
  const sizes = layers.map((l) => layoutOf(trunkTensors(l)).bytes);
  const bytesTotal = sizes.reduce((a, b) => a + b, 0);
  const done = await resumable(outDir, shards, layers);
  const resumedFrom = done.length;
  const partial = path.join(outDir, PARTIAL_BIN);
  const file = await Deno.open(partial, { write: true, create: true });
  const reader = new FileReader(false);
  const t0 = performance.now();
  try {
    let offset = done.reduce((a, l) => a + l.bytes, 0);
    const startOffset = offset;
    await file.truncate(offset);
    for (let i = done.length; i < layers.length; i++) {
      if (stopAfter !== undefined && i >= stopAfter) {
        throw new Error(`pack stopped after ${i} layers`);
      }
      done.push(await packLayer(reader, file, layers[i], offset));
      offset += sizes[i];
      await file.sync();
      await writeFileAtomic(
        path.join(outDir, PROGRESS_JSON),
        JSON.stringify({ shards, layers: done }),
      );
      onProgress?.({
        layer: i + 1,
        layers: layers.length,
        bytesDone: offset,
        bytesTotal,
        bytesThisRun: offset - startOffset,
        seconds: (performance.now() - t0) / 1000,
        resumedFrom,
      });
    }
  } finally {
    file.close();
    reader.close();
  }
  const index: PackIndex = {
    format: "k3-trunk",
    version: 1,
    align: 4096,
    total_bytes: bytesTotal,
    shards,
    layers: done,
  };
  await Deno.rename(partial, path.join(outDir, PACK_BIN));
  await syncDir(outDir);
  await writeFileAtomic(path.join(outDir, PACK_JSON), JSON.stringify(index, null, 1) + "\n");
  await Deno.remove(path.join(outDir, PROGRESS_JSON)).catch(() => {});
  await Deno.remove(path.join(outDir, LOCK_FILE)).catch(() => {});
  return index;
}

/** Layers already packed by an interrupted run of the same shards (else none). */
async function resumable(
  dir: string,
  shards: ShardIdentity[],
  layers: LayerRefs[],
): Promise<PackLayer[]> {
  try {
    const p = JSON.parse(await readSmallText(path.join(dir, PROGRESS_JSON), MAX_INDEX_BYTES));
    const size = (await Deno.stat(path.join(dir, PARTIAL_BIN))).size;
    if (
      !isObject(p) || !Array.isArray(p.layers) || !sameShards(p.shards as ShardIdentity[], shards)
    ) {
      return [];
    }
    const end = checkPackLayers(p.layers, layers, (f, why) => new Error(`${f} ${why}`));
    return end <= size ? p.layers as PackLayer[] : [];
  } catch {
    return []; // no progress, or not one we can trust: start over
  }
}

/** Runs of zeros this long are left as holes in trunk.bin (they read back as zeros). */
const HOLE_BYTES = 1 << 20;

/** HOLE_BYTES of zeros, to compare runs against. */
const ZEROS = Buffer.alloc(HOLE_BYTES);

/** True when `bytes` (at most HOLE_BYTES) are all zero: a native memcmp, ~4 GB/s loaded. */
function allZero(bytes: Uint8Array): boolean {
  return Buffer.compare(bytes, ZEROS.subarray(0, bytes.length)) === 0;
}

/**
 * Writes `view` at `offset`, skipping whole runs of zeros: a pack of a sparse checkpoint (the
 * full-size layout's holes) stays sparse instead of filling the disk with zeros, and reads
 * back the same bytes. The file ends at offset + view.length either way.
 */
export async function writeSparse(
  file: Deno.FsFile,
  view: Uint8Array,
  offset: number,
): Promise<void> {
  for (let run = 0; run < view.length; run += HOLE_BYTES) {
    const part = view.subarray(run, Math.min(view.length, run + HOLE_BYTES));
    if (allZero(part)) continue;
    await file.seek(offset + run, Deno.SeekMode.Start);
    let at = 0;
    while (at < part.length) at += await file.write(part.subarray(at));
  }
  await file.truncate(offset + view.length);
}

/** Reads layer `l`'s tensors into its block, hashes it, writes it at `offset`. */
async function packLayer(
  reader: FileReader,
  file: Deno.FsFile,
  l: LayerRefs,
  offset: number,
): Promise<PackLayer> {
  const refs = trunkTensors(l);
  const { offsets, bytes } = layoutOf(refs);
  const block = NativeBuffer.alloc(bytes);
  try {
    refs.forEach((r, i) => reader.read(r.file, r.offset, r.nbytes, block.at(offsets[i]), r.name));
    const view = block.view(0, bytes);
    await writeSparse(file, view, offset);
    return { index: l.index, offset, bytes, sha256: sha256Hex(view), tensors: layerLayout(l) };
  } finally {
    block.free();
  }
}

/**
 * Opens the pack in `dir` for `ckpt`. Refuses (exit 2) a pack that is missing, incomplete,
 * built from shards that have changed since, or laid out differently from this checkpoint.
 */
export async function openTrunkPack(dir: string, ckpt: Checkpoint): Promise<TrunkPack> {
  const json = path.join(dir, PACK_JSON), bin = path.join(dir, PACK_BIN);
  const redo = `re-run \`k3 pack ${ckpt.dir} ${dir}\``;
  let raw: unknown;
  try {
    raw = JSON.parse(await readSmallText(json, MAX_INDEX_BYTES));
  } catch (e) {
    if (e instanceof K3Error) {
      e.message = `trunk pack ${dir}: ${e.message}; ${redo}`;
      throw e;
    }
    throw badInput(`trunk pack ${dir}: cannot read ${json} (${(e as Error).message}); ${redo}`, {
      cause: e,
    });
  }
  const st = await Deno.stat(bin).catch(() => null);
  if (st !== null && !st.isFile) throw badInput(`${bin} is not a regular file; ${redo}`);
  const index = checkPackIndex(raw, ckpt.refs.layers, st?.size ?? null, json, redo);
  const now = await trunkShards(ckpt.refs);
  for (const s of now) {
    const then = index.shards.find((x) => x.file === s.file);
    if (!then) {
      throw badInput(
        `${json}: the pack does not come from shard ${s.file} of ${ckpt.dir}; ${redo}`,
      );
    }
    if (then.size !== s.size || then.mtime_ms !== s.mtime_ms) {
      throw badInput(
        `${json}: the pack is stale: shard ${s.file} changed since packing (size ${then.size} -> ${s.size}, ` +
          `mtime ${new Date(then.mtime_ms).toISOString()} -> ${
            new Date(s.mtime_ms).toISOString()
          }); ${redo}`,
      );
    }
  }
  return { dir, bin, index };
}

/** trunk.json of a full-size K3 is about 1 MB; anything far larger is not one of ours. */
const MAX_INDEX_BYTES = 64 << 20;

/** The text of a regular file of at most `limit` bytes (a FIFO or /dev/zero is refused). */
async function readSmallText(file: string, limit: number): Promise<string> {
  return (await readUserText(file, "pack index", { limit }))!;
}

const isObject = (v: unknown): v is Record<string, unknown> =>
  typeof v === "object" && v !== null && !Array.isArray(v);
const isCount = (v: unknown): v is number =>
  typeof v === "number" && Number.isSafeInteger(v) && v >= 0;

/**
 * Validates every field of a pack index against the layout of `layers` (exit 2 naming the
 * field): types; layers in order, one per layer of the checkpoint; each run page-aligned,
 * starting where the previous one ends, of exactly its block's size, with its layout;
 * the runs adding up to total_bytes, which is trunk.bin's size (`binSize`; null: missing).
 */
export function checkPackIndex(
  raw: unknown,
  layers: LayerRefs[],
  binSize: number | null,
  json: string,
  redo: string,
): PackIndex {
  const bad = (field: string, why: string) => badInput(`${json}: ${field} ${why}; ${redo}`);
  if (!isObject(raw)) throw bad("the index", "is not a JSON object");
  if (raw.format !== "k3-trunk" || raw.version !== 1) {
    throw badInput(`${json}: not a k3-trunk version 1 index; ${redo}`);
  }
  if (raw.align !== BLOCK_ALIGN) throw bad("align", `is ${show(raw.align)}, not ${BLOCK_ALIGN}`);
  if (!isCount(raw.total_bytes)) {
    throw bad("total_bytes", `is ${show(raw.total_bytes)}, not a byte count`);
  }
  if (binSize !== raw.total_bytes) {
    throw badInput(
      `${path.join(path.dirname(json), PACK_BIN)} is ${binSize ?? "missing"} bytes but ${json} ` +
        `says ${raw.total_bytes}: the pack is incomplete or was modified; ${redo}`,
    );
  }
  if (!Array.isArray(raw.shards)) throw bad("shards", `is ${show(raw.shards)}, not a list`);
  raw.shards.forEach((s, i) => {
    if (!isObject(s)) throw bad(`shards[${i}]`, "is not an object");
    if (typeof s.file !== "string") throw bad(`shards[${i}].file`, "is not a string");
    if (!isCount(s.size)) throw bad(`shards[${i}].size`, `is ${show(s.size)}, not a byte count`);
    // A time a Date can hold (|t| <= 8.64e15 ms), or the stale-pack message cannot show it.
    if (typeof s.mtime_ms !== "number" || !(Math.abs(s.mtime_ms) <= 8.64e15)) {
      throw bad(`shards[${i}].mtime_ms`, `is ${show(s.mtime_ms)}, not a time`);
    }
  });
  if (!Array.isArray(raw.layers)) throw bad("layers", `is ${show(raw.layers)}, not a list`);
  if (raw.layers.length !== layers.length) {
    throw bad(
      "layers",
      `has ${raw.layers.length} entries; this checkpoint has ${layers.length} layers`,
    );
  }
  const end = checkPackLayers(raw.layers, layers, bad);
  if (end !== raw.total_bytes) {
    throw bad("total_bytes", `is ${raw.total_bytes}, but the layers' runs end at ${end}`);
  }
  return raw as unknown as PackIndex;
}

/**
 * Checks packed layer entries (trunk.json or an interrupted pack's progress) against the
 * layers they claim to be, each run right after the previous one from offset 0; returns
 * where the last one ends. `bad(field, why)` makes the error.
 */
function checkPackLayers(
  entries: unknown[],
  layers: LayerRefs[],
  bad: (field: string, why: string) => Error,
): number {
  let at = 0;
  entries.forEach((e, i) => {
    const f = `layers[${i}]`;
    if (!isObject(e)) throw bad(f, "is not an object");
    if (i >= layers.length) throw bad(f, `is past the checkpoint's ${layers.length} layers`);
    if (e.index !== layers[i].index) {
      throw bad(`${f}.index`, `is ${show(e.index)}, not ${layers[i].index}`);
    }
    if (!isCount(e.offset) || e.offset % BLOCK_ALIGN !== 0) {
      throw bad(`${f}.offset`, `is ${show(e.offset)}, not a multiple of ${BLOCK_ALIGN}`);
    }
    if (e.offset !== at) {
      throw bad(`${f}.offset`, `is ${e.offset}, but the previous run ends at ${at}`);
    }
    const want = layoutOf(trunkTensors(layers[i])).bytes;
    if (e.bytes !== want) {
      throw bad(`${f}.bytes`, `is ${show(e.bytes)}, but layer ${i}'s block is ${want} bytes`);
    }
    if (typeof e.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(e.sha256)) {
      throw bad(`${f}.sha256`, "is not 64 hex digits");
    }
    if (JSON.stringify(e.tensors) !== JSON.stringify(layerLayout(layers[i]))) {
      throw bad(`${f}.tensors`, `do not match layer ${i}'s tensors in this checkpoint`);
    }
    at += want;
  });
  return at;
}

/** A short rendering of a JSON value for an error message. */
function show(v: unknown): string {
  const s = JSON.stringify(v) ?? String(v);
  return s.length > 40 ? s.slice(0, 37) + "..." : s;
}

/** Throws RUN INVALID when `bytes` are not layer `i`'s packed bytes. */
export function verifyPackedLayer(pack: TrunkPack, i: number, bytes: Uint8Array): void {
  const want = pack.index.layers[i].sha256;
  const got = sha256Hex(bytes);
  if (got !== want) {
    throw runInvalid(
      `layer ${i} of ${pack.bin} fails its SHA-256 check (got ${got.slice(0, 16)}..., ` +
        `trunk.json says ${want.slice(0, 16)}...): the pack is corrupted; re-run k3 pack`,
    );
  }
}
