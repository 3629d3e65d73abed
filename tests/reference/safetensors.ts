/**
 * A minimal safetensors reader for the float64 reference. It shares no code with the engine's
 * loader on purpose: the reference must fail differently when the engine misreads a file.
 * Files are read whole, which is fine for the tiny checkpoints the reference is used on.
 */

import { readdirSync, readFileSync } from "node:fs";
import { readFile } from "node:fs/promises";
import { join } from "node:path";

/** One tensor as stored: dtype name, shape and its raw bytes. */
export interface StoredTensor {
  name: string;
  file: string;
  dtype: string;
  shape: number[];
  bytes: Uint8Array;
}

/** Bytes per element for the dtypes the reference decodes. */
const ELEMENT_SIZE: Record<string, number> = { BF16: 2, F32: 4, U8: 1 };

/** Every tensor of every shard in `dir`, by name (shards from the index, else by scanning). */
export async function readCheckpoint(dir: string): Promise<Map<string, StoredTensor>> {
  const tensors = new Map<string, StoredTensor>();
  for (const file of shardFiles(dir)) {
    for (const t of await readShard(join(dir, file))) {
      if (tensors.has(t.name)) {
        throw new Error(`${t.file}: tensor ${t.name} also appears in another shard`);
      }
      tensors.set(t.name, t);
    }
  }
  return tensors;
}

/** Shard file names: the distinct values of the index's weight_map, or every *.safetensors. */
function shardFiles(dir: string): string[] {
  const entries = readdirSync(dir);
  if (entries.includes("model.safetensors.index.json")) {
    const path = join(dir, "model.safetensors.index.json");
    const index = JSON.parse(readFileSync(path, "utf8"));
    if (typeof index?.weight_map !== "object" || index.weight_map === null) {
      throw new Error(`${path}: no "weight_map" object; regenerate the index or delete it`);
    }
    return [...new Set(Object.values(index.weight_map) as string[])].sort();
  }
  const shards = entries.filter((f) => f.endsWith(".safetensors")).sort();
  if (shards.length === 0) throw new Error(`${dir}: no *.safetensors files found`);
  return shards;
}

/** Parse one shard: 8-byte LE header length, JSON header, then the data region. */
export async function readShard(path: string): Promise<StoredTensor[]> {
  const data = await readFile(path);
  if (data.length < 8) {
    throw new Error(`${path}: shorter than the 8-byte safetensors header length`);
  }
  const headerLength = Number(new DataView(data.buffer, data.byteOffset, 8).getBigUint64(0, true));
  if (8 + headerLength > data.length) {
    throw new Error(`${path}: header length ${headerLength} runs past the end of the file`);
  }
  const header = JSON.parse(new TextDecoder().decode(data.subarray(8, 8 + headerLength)));
  const base = 8 + headerLength;
  const tensors: StoredTensor[] = [];
  for (const [name, entry] of Object.entries(header as Record<string, any>)) {
    if (name === "__metadata__") continue;
    const [begin, end] = entry.data_offsets as [number, number];
    const numel = (entry.shape as number[]).reduce((a, b) => a * b, 1);
    const size = ELEMENT_SIZE[entry.dtype];
    if (size !== undefined && end - begin !== numel * size) {
      throw new Error(
        `${path}: tensor ${name} has ${end - begin} bytes but shape ${
          JSON.stringify(entry.shape)
        } of ${entry.dtype} needs ${numel * size}`,
      );
    }
    if (base + end > data.length) throw new Error(`${path}: tensor ${name} runs past end of file`);
    tensors.push({
      name,
      file: path,
      dtype: entry.dtype,
      shape: entry.shape,
      bytes: data.subarray(base + begin, base + end),
    });
  }
  return tensors;
}

/** BF16 bits -> the exact float64 value (a BF16 is the top half of an F32). */
export function bf16ToNumber(bits: number): number {
  F32_SCRATCH_BITS[0] = bits << 16;
  return F32_SCRATCH[0];
}
const F32_SCRATCH = new Float32Array(1);
const F32_SCRATCH_BITS = new Uint32Array(F32_SCRATCH.buffer);

/** A BF16 or F32 tensor widened exactly to float64. */
export function decodeFloatTensor(t: StoredTensor): Float64Array {
  const view = new DataView(t.bytes.buffer, t.bytes.byteOffset, t.bytes.byteLength);
  if (t.dtype === "BF16") {
    const out = new Float64Array(t.bytes.byteLength / 2);
    for (let i = 0; i < out.length; i++) out[i] = bf16ToNumber(view.getUint16(2 * i, true));
    return out;
  }
  if (t.dtype === "F32") {
    const out = new Float64Array(t.bytes.byteLength / 4);
    for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
    return out;
  }
  throw new Error(`${t.file}: tensor ${t.name} has dtype ${t.dtype}; expected BF16 or F32`);
}
