/**
 * Finds a checkpoint's shards and maps every language-model tensor to its place on disk.
 * Shards come from `model.safetensors.index.json` when present (and the index is checked
 * against the headers), else from every `*.safetensors` in the directory.
 *
 * Names are normalised to one canonical, text-only form (SPEC §3.2, decision 9):
 *   language_model.model.X | language_model.X (layers only) | model.X  ->  model.X
 *   language_model.lm_head.weight | lm_head.weight                     ->  lm_head.weight
 */

import * as fs from "node:fs/promises";
import * as path from "node:path";
import { badInput } from "../errors.ts";
import { readJsonFile } from "../config.ts";
import { readSafetensorsHeader, type SafetensorsHeader } from "./safetensors.ts";
import type { TensorRef } from "./types.ts";

/** The index file name of a sharded Hugging Face checkpoint. */
export const INDEX_FILE = "model.safetensors.index.json";

/** Every shard read (absolute paths) and the language model's tensors by canonical name. */
export interface ShardSet {
  shards: string[];
  /** Canonical name -> place on disk; `TensorRef.name` keeps the name as stored in the file. */
  tensors: Map<string, TensorRef>;
}

/** Prefixes of tensors a text engine never loads (vision tower and its projector). */
const SKIPPED_PREFIXES = ["vision_tower.", "mm_projector.", "language_model.vision_tower."];

/** How stored prefixes map onto the canonical form. First match wins. */
const PREFIX_MAP: [string, string][] = [
  ["language_model.model.", "model."],
  ["language_model.layers.", "model.layers."],
  ["language_model.lm_head.", "lm_head."],
  ["model.", "model."],
  ["lm_head.", "lm_head."],
];

/** The canonical name of decoder layer `i`'s tensor `suffix` (e.g. "input_layernorm.weight"). */
export function layerTensorName(i: number, suffix: string): string {
  return `model.layers.${i}.${suffix}`;
}

/**
 * The canonical name of a stored tensor, or null when the engine does not use it: vision
 * and projector tensors, rotary caches, layers >= numLayers (MTP), and unknown namespaces.
 */
export function canonicalName(stored: string, numLayers: number): string | null {
  if (SKIPPED_PREFIXES.some((p) => stored.startsWith(p))) return null;
  if (stored.includes("rotary_emb.")) return null;
  const rule = PREFIX_MAP.find(([from]) => stored.startsWith(from));
  if (!rule) return null;
  const name = rule[1] + stored.slice(rule[0].length);
  const layer = /^model\.layers\.(\d+)\./.exec(name);
  if (layer && Number(layer[1]) >= numLayers) return null;
  return name;
}

/**
 * Reads every shard header of the checkpoint in `dir` and maps its language-model tensors.
 * @param dir the checkpoint directory
 * @param numLayers num_hidden_layers; tensors of higher layers are skipped
 * @throws K3Error (exit 2) for a bad index, a missing/truncated/invalid shard, or a tensor
 *   name that appears twice
 */
export async function readShards(dir: string, numLayers: number): Promise<ShardSet> {
  const indexPath = path.join(dir, INDEX_FILE);
  const weightMap = await fileExists(indexPath) ? await readIndex(indexPath) : null;
  const shards = weightMap ? await indexedShards(dir, indexPath, weightMap) : await scanShards(dir);
  const headers = await Promise.all(shards.map(readSafetensorsHeader));
  if (weightMap) checkIndexAgrees(indexPath, weightMap, shards, headers);
  const tensors = new Map<string, TensorRef>();
  shards.forEach((file, k) => addTensors(tensors, file, headers[k], numLayers));
  return { shards, tensors };
}

async function fileExists(file: string): Promise<boolean> {
  try {
    return (await fs.stat(file)).isFile();
  } catch {
    return false;
  }
}

/** Reads the index's weight_map: tensor name -> shard file name. */
async function readIndex(indexPath: string): Promise<Map<string, string>> {
  const json = await readJsonFile(indexPath, "safetensors index");
  const weightMap = (json as { weight_map?: unknown } | null)?.weight_map;
  if (typeof weightMap !== "object" || weightMap === null || Array.isArray(weightMap)) {
    throw badInput(`${indexPath}: "weight_map" must be an object of tensor name -> shard file`);
  }
  const map = new Map<string, string>();
  for (const [name, shard] of Object.entries(weightMap)) {
    if (typeof shard !== "string" || shard === "" || path.isAbsolute(shard)) {
      throw badInput(
        `${indexPath}: weight_map["${name}"] must be a shard file name relative to the ` +
          `checkpoint directory, found ${JSON.stringify(shard)}`,
      );
    }
    map.set(name, shard);
  }
  return map;
}

/** The shards an index names, as absolute paths; each must exist. */
async function indexedShards(
  dir: string,
  indexPath: string,
  weightMap: Map<string, string>,
): Promise<string[]> {
  const shards = [...new Set(weightMap.values())].sort().map((s) => path.resolve(dir, s));
  for (const shard of shards) {
    if (!await fileExists(shard)) {
      throw badInput(
        `${indexPath}: references shard ${path.basename(shard)}, which does not exist ` +
          `(${shard}); the download is incomplete`,
      );
    }
  }
  if (shards.length === 0) throw badInput(`${indexPath}: weight_map is empty`);
  return shards;
}

/** Every `*.safetensors` file in `dir`, sorted, as absolute paths. */
async function scanShards(dir: string): Promise<string[]> {
  const names = (await fs.readdir(dir)).filter((n) => n.endsWith(".safetensors")).sort();
  if (names.length === 0) {
    throw badInput(`${dir}: no ${INDEX_FILE} and no *.safetensors files; not a checkpoint`);
  }
  return names.map((n) => path.resolve(dir, n));
}

/** Each tensor named by the index is in the shard it names, and no shard contradicts it. */
function checkIndexAgrees(
  indexPath: string,
  weightMap: Map<string, string>,
  shards: string[],
  headers: SafetensorsHeader[],
): void {
  const actual = new Map<string, string>();
  shards.forEach((file, k) => {
    for (const e of headers[k].entries) actual.set(e.name, file);
  });
  const dir = path.dirname(indexPath);
  for (const [name, shard] of weightMap) {
    const expected = path.resolve(dir, shard);
    const found = actual.get(name);
    if (found !== expected) {
      const where = found ? `it is in ${path.basename(found)}` : "no shard contains it";
      throw badInput(`${indexPath}: tensor ${name} is listed in ${shard}, but ${where}`);
    }
  }
}

/** Adds one shard's language-model tensors (absolute offsets) under canonical names. */
function addTensors(
  tensors: Map<string, TensorRef>,
  file: string,
  header: SafetensorsHeader,
  numLayers: number,
): void {
  for (const e of header.entries) {
    const canonical = canonicalName(e.name, numLayers);
    if (canonical === null) continue;
    const previous = tensors.get(canonical);
    if (previous) {
      throw badInput(
        `tensor ${canonical} appears twice: as ${previous.name} in ${previous.file} and as ` +
          `${e.name} in ${file}; remove the stale shard`,
      );
    }
    tensors.set(canonical, {
      name: e.name,
      file,
      dtype: e.dtype,
      shape: e.shape,
      offset: header.dataStart + e.begin,
      nbytes: e.end - e.begin,
    });
  }
}
