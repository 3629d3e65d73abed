/**
 * Finds a checkpoint's shards and indexes every language-model tensor. Shards come from
 * `model.safetensors.index.json` when present (and the index is checked against the headers),
 * else from every `*.safetensors` in the directory.
 *
 * Scale is the point here: K3 has 497,052 text tensors, 494,592 of them routed-expert
 * tensors. The index JSON (~60 MB) is scanned in chunks and never kept; each shard header is
 * scanned once; the routed experts go into compact tables ({@link ExpertIndex}) without a
 * string or an object per tensor. Only the ~2,500 other tensors become {@link TensorRef}s.
 *
 * Names are normalised to one canonical, text-only form (MODEL.md §3.2):
 *   language_model.model.X | language_model.X (layers only) | model.X  ->  model.X
 *   language_model.lm_head.weight | lm_head.weight                     ->  lm_head.weight
 */

import { constants } from "node:fs";
import * as fs from "node:fs";
import * as path from "node:path";
import { isDenseLayer, type K3Config } from "./config.ts";
import { badInput } from "../errors.ts";
import { ExpertIndex, type ExpertName, parseExpertName } from "./expert_index.ts";
import { checkModelFile, type ModelDir, openModelDir, resolveInside } from "./files.ts";
import { detach, JsonScanner, type StringView, textChunks, viewText } from "./json.ts";
import { duplicateTensor, readHeaderLength, scanSafetensorsHeader } from "./safetensors.ts";
import type { DType, TensorRef } from "./types.ts";

/** The index file name of a sharded Hugging Face checkpoint. */
export const INDEX_FILE = "model.safetensors.index.json";

/** Shards a checkpoint may have (the release has 96; shard numbers are 16-bit). */
const MAX_SHARDS = 32_000;

/** An index larger than this is refused (the release's is 60 MB). */
const MAX_INDEX_BYTES = 512 * 1024 * 1024;

/** Every shard read (absolute paths) and the language model's tensors. */
export interface ShardSet {
  shards: string[];
  /** Canonical name -> place on disk, for every tensor but the routed experts. */
  tensors: Map<string, TensorRef>;
  /** The routed experts of the config's MoE layers, in compact tables. */
  experts: ExpertIndex;
  /** Language-model tensors found (both kinds). */
  count: number;
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

/** The config fields the index needs. */
type ShardConfig = Pick<
  K3Config,
  "numLayers" | "numExperts" | "firstKDenseReplace" | "moeLayerFreq"
>;

/**
 * Allocates the routed-expert table for `config`, refusing one the checkpoint's own files
 * could not fill (a config that does not belong to the checkpoint must not allocate
 * gigabytes).
 * @param room how many tensors the files hold at most
 * @param what the files, for the message
 */
function allocateExperts(experts: ExpertIndex, config: ShardConfig, room: number, what: string) {
  if (experts.size > room) {
    throw badInput(
      `config.json asks for ${experts.size} routed-expert tensors (num_experts ` +
        `${config.numExperts} x ${experts.size / 6 / config.numExperts} MoE layers x 6), but ` +
        `${what} at most ${room}: config.json does not belong to this checkpoint`,
    );
  }
  experts.allocate();
}

/**
 * Reads every shard header of the checkpoint in `dir` and indexes its language-model tensors.
 * @param dir the checkpoint directory (or one already checked by openModelDir)
 * @param config sizes from config.json; tensors of layers >= numLayers are skipped
 * @throws K3Error (exit 2) for a bad index, a missing/truncated/invalid or non-regular shard,
 *   a file outside the directory, or a tensor name that appears twice
 */
export async function readShards(dir: string | ModelDir, config: ShardConfig): Promise<ShardSet> {
  const model = typeof dir === "string" ? await openModelDir(dir) : dir;
  const indexPath = path.join(model.dir, INDEX_FILE);
  const hasIndex = await Deno.lstat(indexPath).then(() => true, () => false);
  const moe = Array.from({ length: config.numLayers }, (_, i) => !isDenseLayer(config, i));
  const reader = new Reader(config, new ExpertIndex(moe, config.numExperts));
  if (hasIndex) {
    await checkModelFile(model, indexPath, "safetensors index");
    const size = (await Deno.stat(indexPath)).size;
    if (size > MAX_INDEX_BYTES) {
      throw badInput(
        `${indexPath}: safetensors index is ${size} bytes, over the ${MAX_INDEX_BYTES}-byte ` +
          `limit (the real one is 60 MB); the file is not an index`,
      );
    }
    const listed = await reader.readIndex(model, indexPath);
    allocateExperts(reader.experts, config, listed, `${indexPath} lists`);
    reader.applyClaims(indexPath);
  } else {
    reader.shards = await scanShards(model);
    // The shortest entry of a routed-expert tensor in a header takes over 80 bytes.
    let room = 0;
    for (const s of reader.shards) room += Math.floor(headerLengthOf(s) / 80);
    allocateExperts(reader.experts, config, room, "the shard headers can hold");
  }
  for (let k = 0; k < reader.shards.length; k++) reader.readShard(k);
  if (hasIndex) reader.checkIndexAgrees(indexPath);
  return {
    shards: reader.shards,
    tensors: reader.tensors,
    experts: reader.experts,
    count: reader.tensors.size + reader.experts.count,
  };
}

/** Every `*.safetensors` in the directory, sorted, as absolute paths; each checked. */
async function scanShards(model: ModelDir): Promise<string[]> {
  const names: string[] = [];
  for await (const e of Deno.readDir(model.dir)) {
    if (e.name.endsWith(".safetensors")) names.push(e.name);
  }
  if (names.length === 0) {
    throw badInput(`${model.dir}: no ${INDEX_FILE} and no *.safetensors files; not a checkpoint`);
  }
  if (names.length > MAX_SHARDS) {
    throw badInput(`${model.dir}: holds ${names.length} *.safetensors files, over ${MAX_SHARDS}`);
  }
  const shards = names.sort().map((n) => path.join(model.dir, n));
  for (const s of shards) await checkModelFile(model, s, "shard");
  return shards;
}

/** Opens a checked file for reading without ever blocking on a FIFO; fstat must agree. */
function openChecked(file: string, what: string): number {
  let fd: number;
  try {
    fd = fs.openSync(file, constants.O_RDONLY | constants.O_NONBLOCK);
  } catch (e) {
    throw badInput(`${file}: cannot open ${what} (${(e as Error).message})`, { cause: e });
  }
  if (!fs.fstatSync(fd).isFile()) {
    fs.closeSync(fd);
    throw badInput(`${file}: ${what} is not a regular file (it changed while being opened)`);
  }
  return fd;
}

/** A read of `file` at `position` into `into`; an OS error is bad input naming the file. */
function readerOf(fd: number, file: string): (into: Uint8Array, position: number) => number {
  return (into, position) => {
    try {
      return fs.readSync(fd, into, 0, into.length, position);
    } catch (e) {
      throw badInput(`${file}: cannot read at byte ${position} (${(e as Error).message})`, {
        cause: e,
      });
    }
  };
}

/** Reads up to `n` bytes at `position`; fewer only at the end of the file. */
function readAt(fd: number, file: string, n: number, position: number): Uint8Array {
  const buf = new Uint8Array(n);
  const read = readerOf(fd, file);
  let done = 0;
  while (done < n) {
    const got = read(buf.subarray(done), position + done);
    if (got === 0) break;
    done += got;
  }
  return buf.subarray(0, done);
}

/** A shard's header length from its first 8 bytes (checked like any header). */
function headerLengthOf(file: string): number {
  const fd = openChecked(file, "shard");
  try {
    return readHeaderLength(readAt(fd, file, 8, 0), file, fs.fstatSync(fd).size);
  } finally {
    fs.closeSync(fd);
  }
}

/** Fills the tables from the index and the shard headers. */
class Reader {
  shards: string[] = [];
  readonly tensors = new Map<string, TensorRef>();
  /** Stored names of tensors that are not routed experts -> shard, from the headers. */
  readonly #others = new Map<string, number>();
  /** The same, as the index lists them. */
  readonly #otherClaims = new Map<string, number>();
  /** Index shard number -> position in `shards`. */
  #claimShard: number[] = [];
  /** What the index says about routed experts: slot and index shard number, in pairs. */
  #expertClaims = new Int32Array(1 << 16);
  #expertClaimCount = 0;
  /** After applyClaims: index shard number of each slot, or -1. */
  #claim: Int16Array | null = null;
  readonly #name: ExpertName = { prefix: 0, layer: 0, expert: 0, kind: 0 };

  constructor(readonly config: ShardConfig, readonly experts: ExpertIndex) {}

  /** The expert slot of a name, or -1. */
  #slotOf(v: StringView): number {
    const n = this.#name;
    if (!parseExpertName(v.text, v.start, v.end, n)) return -1;
    if (n.layer >= this.config.numLayers) return -1;
    return this.experts.slot(n.layer, n.expert, n.kind);
  }

  /**
   * Scans the index: its shard list, and which shard it says holds each tensor.
   * @returns how many tensors it lists
   */
  async readIndex(model: ModelDir, indexPath: string): Promise<number> {
    const fd = openChecked(indexPath, "safetensors index");
    const names: string[] = [];
    let listed = 0;
    try {
      const what = `${indexPath}: safetensors index`;
      const size = fs.fstatSync(fd).size;
      const read = readerOf(fd, indexPath);
      const s = new JsonScanner(what, textChunks(read, 0, size, what));
      if (s.next() !== "object") {
        s.skipValue(); // a syntax error is named as one
        throw badInput(`${indexPath}: safetensors index must be a JSON object`);
      }
      s.beginObject();
      const top = new Set<string>();
      let sawMap = false;
      for (let i = 0;; i++) {
        const key = s.key(i);
        if (key === null) break;
        if (top.has(key)) throw badInput(`${indexPath}: the key "${key}" appears twice`);
        top.add(key);
        if (key !== "weight_map") {
          s.skipValue();
          continue;
        }
        sawMap = true;
        listed += this.#readWeightMap(s, model, indexPath, names);
      }
      s.finish();
      if (!sawMap) {
        throw badInput(`${indexPath}: "weight_map" must be an object of tensor name -> shard file`);
      }
    } finally {
      fs.closeSync(fd);
    }
    if (names.length === 0) throw badInput(`${indexPath}: weight_map is empty`);
    await this.#placeShards(model, indexPath, names);
    return listed;
  }

  /**
   * Reads `weight_map` (the scanner at its value), recording which shard each tensor is said
   * to be in; new shard names are appended to `names` (their index shard numbers).
   * @returns how many tensors it lists
   */
  #readWeightMap(s: JsonScanner, model: ModelDir, indexPath: string, names: string[]): number {
    const shardIds = new Map<string, number>();
    let last = "", lastId = -1, listed = 0;
    if (s.next() !== "object") {
      throw badInput(
        `${indexPath}: "weight_map" must be an object of tensor name -> shard file`,
      );
    }
    s.beginObject();
    for (let j = 0;; j++) {
      const v = s.keyView(j);
      if (v === null) break;
      const slot = this.#slotOf(v);
      const name = slot < 0 ? detach(viewText(v)) : null;
      if (s.next() !== "string") {
        const found = s.skipValue();
        throw badInput(
          `${indexPath}: weight_map["${name ?? viewText(v)}"] must be a shard file name ` +
            `relative to the checkpoint directory, found ${found}`,
        );
      }
      // Neighbouring entries mostly name the same shard: compare before making a string.
      // (This overwrites the key's view `v`.)
      const sv = s.stringView();
      let id: number | undefined;
      // (lastId < 0: nothing seen yet, so an empty name cannot match the empty `last`.)
      if (
        lastId >= 0 && sv.end - sv.start === last.length && sv.text.startsWith(last, sv.start)
      ) id = lastId;
      const shardName = id === undefined ? viewText(sv) : last;
      id ??= shardIds.get(shardName);
      if (id === undefined) {
        const field = `weight_map["${name ?? this.#expertName(slot)}"]`;
        resolveInside(model, shardName, indexPath, field);
        id = names.length;
        if (id >= MAX_SHARDS) {
          throw badInput(`${indexPath}: names more than ${MAX_SHARDS} shard files`);
        }
        shardIds.set(detach(shardName), id);
        names.push(detach(shardName));
      }
      last = id === lastId ? last : names[id];
      lastId = id;
      listed++;
      if (slot >= 0) this.#claimExpert(slot, id);
      else {
        if (this.#otherClaims.has(name!)) throw this.#listedTwice(indexPath, name!);
        this.#otherClaims.set(name!, id);
      }
    }
    return listed;
  }

  /** Records that the index puts expert `slot` in index shard `id` (checked in applyClaims). */
  #claimExpert(slot: number, id: number): void {
    let claims = this.#expertClaims;
    if (2 * this.#expertClaimCount + 2 > claims.length) {
      claims = new Int32Array(2 * claims.length);
      claims.set(this.#expertClaims);
      this.#expertClaims = claims;
    }
    claims[2 * this.#expertClaimCount] = slot;
    claims[2 * this.#expertClaimCount + 1] = id;
    this.#expertClaimCount++;
  }

  /** The index's shards, in name order, each checked to exist inside the checkpoint. */
  async #placeShards(model: ModelDir, indexPath: string, names: string[]): Promise<void> {
    // Shards in name order; the index's numbers map onto them.
    const order = names.map((n, id) => ({ n, id })).sort((a, b) => (a.n < b.n ? -1 : 1));
    this.shards = order.map((o) => resolveInside(model, o.n, indexPath, "weight_map"));
    this.#claimShard = new Array(names.length);
    order.forEach((o, k) => (this.#claimShard[o.id] = k));
    for (const shard of this.shards) {
      try {
        await checkModelFile(model, shard, "shard");
      } catch (e) {
        const absent = await Deno.lstat(shard).then(() => false, () => true);
        if (!absent) throw e;
        throw badInput(
          `${indexPath}: references shard ${path.relative(model.dir, shard)}, which does not ` +
            `exist (${shard}); the download is incomplete`,
          { cause: e },
        );
      }
    }
  }

  /** Records the index's routed-expert entries by slot (after allocation); one each. */
  applyClaims(indexPath: string): void {
    const claim = new Int16Array(this.experts.size).fill(-1);
    const pairs = this.#expertClaims;
    for (let k = 0; k < this.#expertClaimCount; k++) {
      const slot = pairs[2 * k];
      if (claim[slot] >= 0) throw this.#listedTwice(indexPath, this.#slotName(slot));
      claim[slot] = pairs[2 * k + 1];
    }
    this.#claim = claim;
    this.#expertClaims = new Int32Array(0);
  }

  #listedTwice(indexPath: string, name: string) {
    return badInput(
      `${indexPath}: weight_map lists tensor ${name} twice (JSON readers keep one of them); ` +
        `the index is corrupt: download it again`,
    );
  }

  /** The canonical name of an expert slot found by #slotOf (from #name). */
  #expertName(slot: number): string {
    const n = this.#name;
    return slot < 0 ? "?" : ExpertIndex.canonicalName(n.layer, n.expert, n.kind);
  }

  /** Scans shard k's header into the tables. */
  readShard(k: number): void {
    const file = this.shards[k];
    const fd = openChecked(file, "shard");
    try {
      this.#scanShard(k, file, fd);
    } finally {
      fs.closeSync(fd);
    }
  }

  #scanShard(k: number, file: string, fd: number): void {
    const size = fs.fstatSync(fd).size;
    const read = readerOf(fd, file);
    const dataStart = 8 + readHeaderLength(readAt(fd, file, Math.min(8, size), 0), file, size);
    const visit = (v: StringView, dtype: DType, shape: number[], begin: number, end: number) => {
      const slot = this.#slotOf(v);
      if (slot >= 0) {
        const was = this.experts.file[slot];
        if (was >= 0) {
          const name = viewText(v);
          if (was === k) throw duplicateTensor(file, name);
          throw badInput(
            `tensor ${this.#expertName(slot)} appears twice: in ${this.shards[was]} and as ` +
              `${name} in ${file}; remove the stale shard`,
          );
        }
        this.experts.set(slot, k, this.#name.prefix, dtype, shape, dataStart + begin);
        return;
      }
      const stored = detach(viewText(v));
      if (this.#others.get(stored) === k) throw duplicateTensor(file, stored);
      this.#others.set(stored, k);
      const canonical = canonicalName(stored, this.config.numLayers);
      if (canonical === null) return;
      const previous = this.tensors.get(canonical);
      if (previous) {
        throw badInput(
          `tensor ${canonical} appears twice: as ${previous.name} in ${previous.file} and as ` +
            `${stored} in ${file}; remove the stale shard`,
        );
      }
      this.tensors.set(canonical, {
        name: stored,
        file,
        dtype,
        shape: shape.slice(),
        offset: dataStart + begin,
        nbytes: end - begin,
      });
    };
    scanSafetensorsHeader(read, file, size, visit, { duplicates: "caller" });
  }

  /** Each tensor the index names is in the shard it names. */
  checkIndexAgrees(indexPath: string): void {
    const claim = this.#claim!, file = this.experts.file;
    for (let slot = 0; slot < claim.length; slot++) {
      const c = claim[slot];
      if (c < 0 || this.#claimShard[c] === file[slot]) continue;
      const name = this.#slotName(slot);
      throw this.#misplaced(indexPath, name, this.shards[this.#claimShard[c]], file[slot]);
    }
    for (const [name, c] of this.#otherClaims) {
      const found = this.#others.get(name) ?? -1;
      if (this.#claimShard[c] !== found) {
        throw this.#misplaced(indexPath, name, this.shards[this.#claimShard[c]], found);
      }
    }
  }

  #misplaced(indexPath: string, name: string, listed: string, found: number) {
    const where = found >= 0
      ? `it is in ${path.basename(this.shards[found])}`
      : "no shard contains it";
    return badInput(
      `${indexPath}: tensor ${name} is listed in ${path.basename(listed)}, but ${where}`,
    );
  }

  /** A name for an expert slot in messages: as stored when found, else canonical. */
  #slotName(slot: number): string {
    const per = this.experts.experts * 6;
    const kind = slot % 6, expert = Math.floor(slot / 6) % this.experts.experts;
    const row = Math.floor(slot / per);
    let layer = 0;
    for (let i = 0, r = -1; i < this.config.numLayers; i++) {
      if (this.experts.slot(i, 0, 0) >= 0 && ++r === row) {
        layer = i;
        break;
      }
    }
    return this.experts.has(slot)
      ? this.experts.storedName(layer, expert, kind, slot)
      : ExpertIndex.canonicalName(layer, expert, kind);
  }
}
