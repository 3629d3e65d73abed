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
import { createHash } from "node:crypto";
import * as path from "node:path";
import { NativeBuffer } from "../../ffi/native.ts";
import { badInput, runInvalid } from "../errors.ts";
import { syncDir, writeFileAtomic } from "../io/atomic.ts";
import { FileReader } from "../io/reader.ts";
import { layoutOf, trunkTensors } from "../layout/block.ts";
import type { Checkpoint } from "./checkpoint.ts";
import type { LayerRefs, ModelRefs } from "./types.ts";

export const PACK_BIN = "trunk.bin";
export const PACK_JSON = "trunk.json";
const PARTIAL_BIN = "trunk.bin.partial";
const PROGRESS_JSON = "trunk.progress.json";

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
  await Deno.mkdir(outDir, { recursive: true });
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
  return index;
}

/** Layers already packed by an interrupted run of the same shards (else none). */
async function resumable(
  dir: string,
  shards: ShardIdentity[],
  layers: LayerRefs[],
): Promise<PackLayer[]> {
  try {
    const p = JSON.parse(await Deno.readTextFile(path.join(dir, PROGRESS_JSON)));
    const size = (await Deno.stat(path.join(dir, PARTIAL_BIN))).size;
    const done = p.layers as PackLayer[];
    const end = done.reduce((a, l) => a + l.bytes, 0);
    const same = sameShards(p.shards, shards) && end <= size &&
      done.every((l, i) =>
        i < layers.length && JSON.stringify(l.tensors) === JSON.stringify(layerLayout(layers[i]))
      );
    return same ? done : [];
  } catch {
    return [];
  }
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
    await file.seek(offset, Deno.SeekMode.Start);
    let at = 0;
    while (at < bytes) at += await file.write(view.subarray(at));
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
  let index: PackIndex;
  try {
    index = JSON.parse(await Deno.readTextFile(json));
  } catch (e) {
    throw badInput(`--trunk ${dir}: cannot read ${json} (${(e as Error).message}); ${redo}`, {
      cause: e,
    });
  }
  if (index.format !== "k3-trunk" || index.version !== 1 || !Array.isArray(index.layers)) {
    throw badInput(`${json}: not a k3-trunk version 1 index; ${redo}`);
  }
  const size = (await Deno.stat(bin).catch(() => null))?.size;
  if (size !== index.total_bytes) {
    throw badInput(
      `${bin} is ${
        size ?? "missing"
      } bytes but ${json} says ${index.total_bytes}: the pack is incomplete or was modified; ${redo}`,
    );
  }
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
  for (const l of ckpt.refs.layers) {
    const p = index.layers[l.index];
    if (!p || JSON.stringify(p.tensors) !== JSON.stringify(layerLayout(l))) {
      throw badInput(`${json}: layer ${l.index} does not match this checkpoint's tensors; ${redo}`);
    }
  }
  return { dir, bin, index };
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
