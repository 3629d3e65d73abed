/**
 * The trunk pack: every non-expert tensor of each layer, copied into one 4096-aligned run
 * per layer (trunk.bin), laid out exactly as a resident or streamed block, so a ring slot is
 * filled by ONE read. With the codec (`k3c1`, the default of `k3 pack`) each BF16 matrix is
 * stored as row chunks coded alone (csrc/codec.h), lm_head gets a run too, and trunk.json
 * records each chunk's coded size: the block layout then comes from the index, not from the
 * shapes alone. trunk.json records each run's offset, size and SHA-256, and the identity
 * (size, mtime) of the shards it came from; a pack whose shards changed is refused at load.
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
import { k3 } from "../../ffi/library.ts";
import {
  BLOCK_ALIGN,
  type BlockEntry,
  type BlockLayout,
  CODEC_BLOCK_ROWS,
  codedChunkRows,
  type CodedSizes,
  headBlock,
  headBlockEntries,
  isCodedEntry,
  layerBlock,
  layerBlockEntries,
  layoutOf,
  rowBytes,
  trunkTensors,
} from "./block.ts";
import type { Checkpoint } from "../checkpoint/checkpoint.ts";
import type { LayerRefs, ModelRefs, TensorRef } from "../checkpoint/types.ts";

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
  /**
   * The block layout: tensor names (as stored), sizes and offsets inside the run; a coded
   * matrix also has the coded size of each of its row chunks (laid one after another from
   * `offset`, each 64-aligned).
   */
  tensors: PackTensor[];
}

/** One tensor of a layer's run. */
export interface PackTensor {
  name: string;
  nbytes: number;
  offset: number;
  chunks?: number[];
}

/**
 * How trunk.bin stores the BF16 matrices of each layer: as they are (`none`), or coded by the
 * lossless codec of csrc/codec.h (`k3c1`) in row chunks coded alone. An index without a
 * codec field is from before the codec: `none`.
 */
export type PackCodec = "none" | "k3c1";
export const PACK_CODECS: readonly PackCodec[] = ["none", "k3c1"];

/** trunk.json. */
export interface PackIndex {
  format: "k3-trunk";
  version: 1;
  align: 4096;
  total_bytes: number;
  /** Absent in packs made before the codec: none. */
  codec?: PackCodec;
  /** Rows per exponent table of the coded chunks (k3c1 only). */
  block_rows?: number;
  shards: ShardIdentity[];
  layers: PackLayer[];
  /** lm_head's run, after the layers' (k3c1 only; its `index` is the number of layers). */
  head?: PackLayer;
}

/** The codec of an opened pack's index. */
export function packCodec(index: PackIndex): PackCodec {
  return index.codec ?? "none";
}

/**
 * The coded chunk sizes of each layer of a coded pack, then of lm_head (undefined for
 * `none`): what trunkBlocks lays the blocks out with.
 */
export function packCodedSizes(index: PackIndex): CodedSizes[] | undefined {
  if (packCodec(index) === "none") return undefined;
  return [...index.layers, index.head!].map((l) =>
    new Map(l.tensors.filter((t) => t.chunks).map((t) => [t.name, t.chunks!]))
  );
}

/** A block a pack holds: a decoder layer's, or lm_head's. */
interface PackBlock {
  /** Its block index: the layer's, or the number of layers for lm_head. */
  index: number;
  name: string;
  entries: BlockEntry[];
  layout(coded?: CodedSizes): BlockLayout;
}

function layerPackBlock(l: LayerRefs): PackBlock {
  return {
    index: l.index,
    name: `layer ${l.index}`,
    entries: layerBlockEntries(l),
    layout: (coded) => layerBlock(l, Infinity, "packed", coded),
  };
}

function headPackBlock(lmHead: TensorRef, layers: number): PackBlock {
  return {
    index: layers,
    name: "lm_head",
    entries: headBlockEntries(lmHead),
    layout: (coded) => headBlock(lmHead, Infinity, "packed", coded),
  };
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

/**
 * The expected layout of a block's run and its size: as the BF16 is, or (`coded`) with its
 * matrices' chunks of those coded sizes.
 */
function blockRecord(
  spec: PackBlock,
  coded?: CodedSizes,
): { tensors: PackTensor[]; bytes: number } {
  const block = spec.layout(coded);
  const tensors = block.entries.map((e, i): PackTensor => {
    const t: PackTensor = { name: e.ref.name, nbytes: e.ref.nbytes, offset: block.offsets[i] };
    const chunks = coded?.get(e.ref.name);
    if (chunks) t.chunks = chunks;
    return t;
  });
  return { tensors, bytes: block.bytes };
}

/** The shards holding any tensor the pack holds (lm_head in a coded one), as they are now. */
async function trunkShards(refs: ModelRefs, codec: PackCodec): Promise<ShardIdentity[]> {
  const packed = refs.layers.flatMap((l) => trunkTensors(l).map((r) => r.file));
  if (codec !== "none") packed.push(refs.lmHead.file);
  const files = [...new Set(packed)].sort();
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
  codec: PackCodec = "none",
): Promise<PackIndex> {
  try {
    await Deno.mkdir(outDir, { recursive: true });
  } catch (e) {
    throw writeFailure(outDir, e);
  }
  const lock = await lockPackDir(outDir);
  try {
    await removeStaleTemps(outDir);
    return await packLocked(ckpt, outDir, codec, onProgress, stopAfter);
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
  codec: PackCodec,
  onProgress?: (p: PackProgress) => void,
  stopAfter?: number,
): Promise<PackIndex> {
  const shards = await trunkShards(ckpt.refs, codec);
  const layers = ckpt.refs.layers;
  // Progress counts the layers' BF16 bytes: a coded layer's size is known once it is coded.
  const sizes = layers.map((l) => layoutOf(trunkTensors(l)).bytes);
  const bytesTotal = sizes.reduce((a, b) => a + b, 0);
  const done = await resumable(outDir, shards, layers, codec);
  const resumedFrom = done.length;
  const partial = path.join(outDir, PARTIAL_BIN);
  const file = await Deno.open(partial, { write: true, create: true });
  const reader = new FileReader(false);
  const t0 = performance.now();
  let offset = done.reduce((a, l) => a + l.bytes, 0);
  let head: PackLayer | undefined;
  try {
    let bytesDone = sizes.slice(0, done.length).reduce((a, b) => a + b, 0);
    const startDone = bytesDone;
    await file.truncate(offset);
    for (let i = done.length; i < layers.length; i++) {
      if (stopAfter !== undefined && i >= stopAfter) {
        throw new Error(`pack stopped after ${i} layers`);
      }
      done.push(await packBlock(reader, file, layerPackBlock(layers[i]), offset, codec));
      offset += done[i].bytes;
      bytesDone += sizes[i];
      await file.sync();
      await writeFileAtomic(
        path.join(outDir, PROGRESS_JSON),
        JSON.stringify({ shards, codec, layers: done }),
      );
      onProgress?.({
        layer: i + 1,
        layers: layers.length,
        bytesDone,
        bytesTotal,
        bytesThisRun: bytesDone - startDone,
        seconds: (performance.now() - t0) / 1000,
        resumedFrom,
      });
    }
    // A coded pack holds lm_head too, so that a resident or streamed lm_head is coded as well.
    if (codec !== "none") {
      const spec = headPackBlock(ckpt.refs.lmHead, layers.length);
      head = await packBlock(reader, file, spec, offset, codec);
      offset += head.bytes;
      await file.sync();
    }
  } finally {
    file.close();
    reader.close();
  }
  const index: PackIndex = {
    format: "k3-trunk",
    version: 1,
    align: 4096,
    total_bytes: offset,
    ...(codec === "none" ? {} : { codec, block_rows: CODEC_BLOCK_ROWS }),
    shards,
    layers: done,
    ...(head ? { head } : {}),
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
  codec: PackCodec,
): Promise<PackLayer[]> {
  try {
    const p = JSON.parse(await readSmallText(path.join(dir, PROGRESS_JSON), MAX_INDEX_BYTES));
    const size = (await Deno.stat(path.join(dir, PARTIAL_BIN))).size;
    if (
      !isObject(p) || !Array.isArray(p.layers) ||
      !sameShards(p.shards as ShardIdentity[], shards) || p.codec !== codec
    ) {
      return [];
    }
    const end = checkPackLayers(p.layers, layers, codec, (f, why) => new Error(`${f} ${why}`));
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

/**
 * Reads a block's tensors into its block, codes its matrices (`codec`), hashes the block,
 * writes it at `offset`.
 */
async function packBlock(
  reader: FileReader,
  file: Deno.FsFile,
  spec: PackBlock,
  offset: number,
  codec: PackCodec,
): Promise<PackLayer> {
  const refs = spec.entries.map((e) => e.ref);
  const { offsets, bytes } = layoutOf(refs);
  const block = NativeBuffer.alloc(bytes);
  try {
    refs.forEach((r, i) => reader.read(r.file, r.offset, r.nbytes, block.at(offsets[i]), r.name));
    if (codec !== "none") return await writeCodedBlock(file, spec, block, offsets, offset);
    const view = block.view(0, bytes);
    await writeSparse(file, view, offset);
    const { tensors } = blockRecord(spec);
    return { index: spec.index, offset, bytes, sha256: sha256Hex(view), tensors };
  } finally {
    block.free();
  }
}

/**
 * Codes the matrices of a block (its BF16 block in `raw`, tensors at `rawOffsets`) chunk by
 * chunk, lays the block out with the coded sizes, and writes it at `offset`.
 */
async function writeCodedBlock(
  file: Deno.FsFile,
  spec: PackBlock,
  raw: NativeBuffer,
  rawOffsets: number[],
  offset: number,
): Promise<PackLayer> {
  const entries = spec.entries;
  const coded: CodedSizes = new Map();
  const chunks = new Map<string, NativeBuffer[]>();
  try {
    entries.forEach((e, i) => {
      if (!isCodedEntry(e)) return;
      const list = codeMatrix(raw, rawOffsets[i], e.ref.shape[0], e.ref.shape[1], e.ref);
      chunks.set(e.ref.name, list.map((c) => c.buffer));
      coded.set(e.ref.name, list.map((c) => c.bytes));
    });
    // Written part by part in block order (no second copy of the block in memory), the gaps
    // between parts zeros, hashed as they go.
    const layout = spec.layout(coded);
    const hash = createHash("sha256");
    let pos = 0;
    const put = async (bytes: Uint8Array, at: number) => {
      if (at > pos) hash.update(ZEROS.subarray(0, at - pos));
      hash.update(bytes);
      await writeSparse(file, bytes, offset + at);
      pos = at + bytes.length;
    };
    for (const [i, e] of entries.entries()) {
      const list = chunks.get(e.ref.name);
      if (!list) {
        await put(raw.view(rawOffsets[i], e.ref.nbytes), layout.offsets[i]);
        continue;
      }
      for (const p of layout.pieces.flatMap((p) => p.parts).filter((p) => p.entry === i)) {
        await put(list[p.row0 / codedChunkRows(e.ref)].view(0, p.coded!.bytes), p.coded!.at);
      }
    }
    for (; pos < layout.bytes; pos += Math.min(HOLE_BYTES, layout.bytes - pos)) {
      hash.update(ZEROS.subarray(0, Math.min(HOLE_BYTES, layout.bytes - pos)));
    }
    await file.truncate(offset + layout.bytes);
    const { tensors } = blockRecord(spec, coded);
    return { index: spec.index, offset, bytes: layout.bytes, sha256: hash.digest("hex"), tensors };
  } finally {
    for (const list of chunks.values()) for (const b of list) b.free();
  }
}

/**
 * Codes a BF16 matrix at `raw` + `at` in chunks of codedChunkRows rows, each alone. Each is
 * coded into one scratch buffer of the worst-case size and kept in a buffer of its own size,
 * so packing holds about the BF16 block plus its coded size, not the worst case of each.
 */
function codeMatrix(
  raw: NativeBuffer,
  at: number,
  rows: number,
  cols: number,
  ref: Parameters<typeof codedChunkRows>[0],
): { buffer: NativeBuffer; bytes: number }[] {
  const lib = k3(), per = codedChunkRows(ref), rb = rowBytes(ref);
  const bound = Number(lib.k3_codec_bound(Math.min(per, rows), cols, CODEC_BLOCK_ROWS));
  const scratch = NativeBuffer.alloc(bound);
  const out: { buffer: NativeBuffer; bytes: number }[] = [];
  try {
    for (let r = 0; r < rows; r += per) {
      const n = Math.min(per, rows - r);
      const bytes = Number(lib.k3_codec_encode(
        scratch.view(0, bound),
        BigInt(bound),
        raw.view(at + r * rb, n * rb),
        n,
        cols,
        CODEC_BLOCK_ROWS,
      ));
      if (bytes < 0) throw new Error(`${ref.name}: k3_codec_encode failed (${bytes})`);
      const buffer = NativeBuffer.alloc(bytes);
      out.push({ buffer, bytes });
      buffer.view(0, bytes).set(scratch.view(0, bytes));
    }
    return out;
  } catch (e) {
    for (const c of out) c.buffer.free();
    throw e;
  } finally {
    scratch.free();
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
  const index = checkPackIndex(
    raw,
    ckpt.refs.layers,
    ckpt.refs.lmHead,
    st?.size ?? null,
    json,
    redo,
  );
  const now = await trunkShards(ckpt.refs, packCodec(index));
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
  lmHead: TensorRef,
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
  const codec = raw.codec ?? "none";
  if (!PACK_CODECS.includes(codec as PackCodec)) {
    throw bad("codec", `is ${show(raw.codec)}, not one of ${PACK_CODECS.join(", ")}`);
  }
  const blockRows = codec === "none" ? undefined : CODEC_BLOCK_ROWS;
  if (raw.block_rows !== blockRows) {
    throw bad("block_rows", `is ${show(raw.block_rows)}, not ${blockRows ?? "absent"}`);
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
  if (codec === "none" && raw.head !== undefined) throw bad("head", "is there, but codec is none");
  let end = checkPackLayers(raw.layers, layers, codec as PackCodec, bad);
  if (codec !== "none") {
    const spec = headPackBlock(lmHead, layers.length);
    if (!isObject(raw.head)) throw bad("head", `is ${show(raw.head)}, not lm_head's run`);
    end += checkRun(raw.head, spec, "head", end, codec as PackCodec, bad);
  }
  if (end !== raw.total_bytes) {
    throw bad("total_bytes", `is ${raw.total_bytes}, but the runs end at ${end}`);
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
  codec: PackCodec,
  bad: (field: string, why: string) => Error,
): number {
  let at = 0;
  entries.forEach((e, i) => {
    const f = `layers[${i}]`;
    if (!isObject(e)) throw bad(f, "is not an object");
    if (i >= layers.length) throw bad(f, `is past the checkpoint's ${layers.length} layers`);
    at += checkRun(e, layerPackBlock(layers[i]), f, at, codec, bad);
  });
  return at;
}

/**
 * Checks one run's entry (field `f`) against the block it claims to be, starting at `at`;
 * returns its size.
 */
function checkRun(
  e: Record<string, unknown>,
  spec: PackBlock,
  f: string,
  at: number,
  codec: PackCodec,
  bad: (field: string, why: string) => Error,
): number {
  if (e.index !== spec.index) throw bad(`${f}.index`, `is ${show(e.index)}, not ${spec.index}`);
  if (!isCount(e.offset) || e.offset % BLOCK_ALIGN !== 0) {
    throw bad(`${f}.offset`, `is ${show(e.offset)}, not a multiple of ${BLOCK_ALIGN}`);
  }
  if (e.offset !== at) {
    throw bad(`${f}.offset`, `is ${e.offset}, but the previous run ends at ${at}`);
  }
  const coded = codec === "none" ? undefined : codedSizesOf(e.tensors, spec.entries, f, bad);
  const layout = blockRecord(spec, coded);
  if (e.bytes !== layout.bytes) {
    throw bad(
      `${f}.bytes`,
      `is ${show(e.bytes)}, but ${spec.name}'s block is ${layout.bytes} bytes`,
    );
  }
  if (typeof e.sha256 !== "string" || !/^[0-9a-f]{64}$/.test(e.sha256)) {
    throw bad(`${f}.sha256`, "is not 64 hex digits");
  }
  if (JSON.stringify(e.tensors) !== JSON.stringify(layout.tensors)) {
    throw bad(`${f}.tensors`, `do not match ${spec.name}'s tensors in this checkpoint`);
  }
  return layout.bytes;
}

/**
 * The coded chunk sizes a layer entry of a coded pack gives, each checked: one list per coded
 * matrix of the layer, one size per chunk, each a possible coded size of its chunk's shape
 * (a multiple of 8 between no escapes and every weight an escape).
 */
function codedSizesOf(
  tensors: unknown,
  entries: BlockEntry[],
  f: string,
  bad: (field: string, why: string) => Error,
): CodedSizes {
  if (!Array.isArray(tensors)) throw bad(`${f}.tensors`, "is not a list");
  const byName = new Map<string, unknown>();
  for (const t of tensors) if (isObject(t) && typeof t.name === "string") byName.set(t.name, t);
  const out: CodedSizes = new Map();
  for (const e of entries) {
    if (!isCodedEntry(e)) continue;
    const field = `${f}.tensors[${e.ref.name}].chunks`;
    const t = byName.get(e.ref.name);
    const chunks = isObject(t) ? t.chunks : undefined;
    const rows = e.ref.shape[0], cols = e.ref.shape[1], per = codedChunkRows(e.ref);
    const n = Math.ceil(rows / per);
    if (!Array.isArray(chunks) || chunks.length !== n) {
      throw bad(field, `is ${show(chunks)}, not a list of ${n} coded sizes`);
    }
    chunks.forEach((size, k) => {
      const [lo, hi] = codedSizeRange(Math.min(per, rows - k * per), cols);
      if (!isCount(size) || size % 8 !== 0 || size < lo || size > hi) {
        throw bad(
          `${field}[${k}]`,
          `is ${show(size)}, not a coded size of its rows (${lo}..${hi})`,
        );
      }
    });
    out.set(e.ref.name, chunks as number[]);
  }
  return out;
}

/** The smallest and largest coded size of a rows x cols chunk (csrc/codec.h's layout). */
export function codedSizeRange(rows: number, cols: number): [number, number] {
  const r8 = (n: number) => Math.ceil(n / 8) * 8, groups = Math.ceil(cols / 8);
  const base = 32 + 8 * Math.ceil(rows / CODEC_BLOCK_ROWS) + r8(4 * (rows + 1)) +
    r8(rows * groups * 11 + 8);
  return [base + r8(8 * groups + 8), base + r8(rows * cols + 8 * groups + 8)];
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
