/**
 * `make-tiny --shape full`: every tensor of the released K3 *text* model (MODEL.md §3) with its
 * released name, shape and dtype, in shards named and filled like the release (96 for 93
 * layers: the embedding alone in the first, then the layers in order, each expert's six
 * tensors adjacent, about 16.4 GB a shard, lm_head in the last), plus the index, config and
 * tokenizer files.
 *
 * The shards are sparse files: the header is written, then only the tensors that keep a
 * forward pass from being degenerate (embedding, lm_head, routers and router biases random,
 * every norm gain 1.0), then the file is truncated to its full length. Everything else is a
 * hole, which reads as zeros without touching the disk. `data: "none"` leaves every tensor a
 * hole, so the 497,052-tensor layout costs only its headers (for tests of index, open, plan).
 *
 * Routing on this layout: the attention and MLP weights are holes, so every layer adds zero
 * and each token's hidden state stays its (real, random) embedding row, RMS-normalised with
 * gain 1. The router weights are real, so the router logits are a random projection of the
 * embedding (about N(0, 1) per expert) and a token's experts depend on its id alone, not on
 * its position. `routing: "skewed"` replaces the router biases (lib/synth/routing.ts).
 * `weights: "normal"` draws the tensors that hold data as trained weights are distributed
 * (lib/synth/tiny.ts `Weights`); the holes stay holes, since they are what makes the
 * full-size layout cost 6 GB of disk instead of 600.
 */

import * as path from "node:path";
import { buildHeader } from "../checkpoint/safetensors.ts";
import type { DType } from "../checkpoint/types.ts";
import { badInput } from "../errors.ts";
import { writeAll, writeAtomically } from "../io/atomic.ts";
import { formatTiktokenRanks, padVocabulary } from "./bpe.ts";
import {
  checkMxfp4Widths,
  checkRouting,
  checkWeights,
  embedTensor,
  eosTokenId,
  expertTensors,
  FIRST_K_DENSE,
  headTensors,
  jsonText,
  K3,
  layerTrunkTensors,
  modelConfig,
  namePrefixes,
  type PlannedTensor,
  prepareDirectory,
  requireInt,
  shardName,
  type SynthShape,
  synthVocabulary,
  tensorChunks,
  type TensorInit,
  tokenizerConfig,
  type Weights,
  withRouting,
  withWeights,
  writeTextAtomically,
} from "./tiny.ts";
import type { Routing } from "./routing.ts";
import { NUM_SPECIAL_TOKENS } from "../text/tokenizer.ts";

/** What a full-size checkpoint holds besides headers: see the module comment. */
export type FullData = "sparse" | "none";

export interface FullOptions {
  /** Decoder layers, 1..93 (default 93); the layer lists of config.json are cut to match. */
  layers?: number;
  /** PRNG seed of the random tensors (default 0). */
  seed?: number;
  /** Default "sparse". */
  data?: FullData;
  /** How the routers pick experts (lib/synth/routing.ts); default "uniform". */
  routing?: Routing;
  /**
   * How the tensors that hold data are drawn (lib/synth/tiny.ts `Weights`); default
   * "uniform". Holes stay holes: `normal` changes the embedding, lm_head and the routers.
   */
  weights?: Weights;
}

/** The released text model's counts (MODEL.md §1.1, §2.1). */
const K3_LAYERS = 93;
export const K3_EXPERTS = 896;
export const K3_TOP_K = 16;
export const K3_VOCAB_SIZE = 163_840;
/** Shards of the release, and of a 93-layer full-size checkpoint. */
const K3_SHARDS = 96;

/** 1-based MLA layers of the release (`full_attn_layers`, MODEL.md §2.2). */
const K3_MLA_LAYERS = [...Array.from({ length: 23 }, (_, k) => 4 * (k + 1)), 93];

/** K3's shape with the first `layers` layers; the MLA list cut to those layers. */
export function fullShape(layers = K3_LAYERS): SynthShape {
  requireInt(layers, "--layers", 1, K3_LAYERS);
  return {
    ...K3,
    layers,
    experts: K3_EXPERTS,
    topK: K3_TOP_K,
    mlaLayers: K3_MLA_LAYERS.filter((l) => l <= layers),
  };
}

// ---------------------------------------------------------------------------------------------
// Plan

/** Tensors placed together: the embedding, a layer's non-expert tensors, one expert, the head. */
type Unit =
  | { kind: "embed" }
  | { kind: "trunk"; layer: number }
  | { kind: "expert"; layer: number; expert: number }
  | { kind: "head" };

/** One shard of the plan: its file name and units [first, end) of `FullPlan.units`. */
interface FullShard {
  file: string;
  first: number;
  end: number;
  /** Tensor bytes (the file adds its header). */
  dataBytes: number;
}

interface FullPlan {
  shape: SynthShape;
  vocabSize: number;
  config: Record<string, unknown>;
  units: Unit[];
  shards: FullShard[];
  /** Sum of every tensor's bytes (`metadata.total_size` of the index). */
  totalTensorBytes: number;
  tensorCount: number;
  /** Tensors per dtype. */
  census: Partial<Record<DType, number>>;
}

const NESTED = false; // full-size checkpoints use the released `language_model.` names

/** The tensors of one unit, with the data policy applied. */
export function unitTensors(
  s: SynthShape,
  u: Unit,
  data: FullData,
  routing: Routing = "uniform",
  weights: Weights = "uniform",
): PlannedTensor[] {
  const layer = (i: number) => `${namePrefixes(NESTED).model}layers.${i}.`;
  const tensors = u.kind === "embed"
    ? [embedTensor(s, K3_VOCAB_SIZE, NESTED)]
    : u.kind === "head"
    ? headTensors(s, K3_VOCAB_SIZE, NESTED)
    : u.kind === "trunk"
    ? layerTrunkTensors(layer(u.layer), u.layer, s)
    : expertTensors(layer(u.layer), u.expert, s);
  return tensors.map((t) => {
    const routed = withWeights(withRouting(t, routing), weights);
    return { ...routed, init: fullInit(routed, data) };
  });
}

/** Tensors that stay random: they decide which tokens come out and which experts are read. */
const RANDOM_TENSORS =
  /(embed_tokens\.weight|lm_head\.weight|block_sparse_moe\.gate\.weight|gate\.e_score_correction_bias)$/;
const HOLE: TensorInit = { kind: "hole" };

function fullInit(t: PlannedTensor, data: FullData): TensorInit {
  if (data === "none") return HOLE;
  if (RANDOM_TENSORS.test(t.name)) return t.init;
  if (t.name.endsWith("norm.weight")) return { kind: "const", value: 1 };
  return HOLE;
}

function sumBytes(tensors: PlannedTensor[]): number {
  return tensors.reduce((n, t) => n + t.nbytes, 0);
}

/** Bytes after the first shard of a 93-layer checkpoint, spread over the other 95 shards. */
let shardTarget: number | undefined;
function shardTargetBytes(): number {
  if (shardTarget === undefined) {
    const full = unitsOf(fullShape());
    const rest = full.bytes.reduce((a, b) => a + b, 0) - full.bytes[0];
    shardTarget = Math.ceil(rest / (K3_SHARDS - 1));
  }
  return shardTarget;
}

/** Every unit in file order with its bytes, and the census of all tensors. */
function unitsOf(s: SynthShape) {
  const units: Unit[] = [{ kind: "embed" }];
  const bytes: number[] = [];
  const census: Partial<Record<DType, number>> = {};
  const count = (ts: PlannedTensor[], times = 1) => {
    for (const t of ts) census[t.dtype] = (census[t.dtype] ?? 0) + times;
  };
  const embed = unitTensors(s, units[0], "none");
  bytes.push(sumBytes(embed));
  count(embed);
  const oneExpert = unitTensors(s, { kind: "expert", layer: 1, expert: 0 }, "none");
  const expertBytes = sumBytes(oneExpert);
  for (let i = 0; i < s.layers; i++) {
    const trunk = unitTensors(s, { kind: "trunk", layer: i }, "none");
    units.push({ kind: "trunk", layer: i });
    bytes.push(sumBytes(trunk));
    count(trunk);
    if (i < FIRST_K_DENSE) continue;
    for (let e = 0; e < s.experts; e++) {
      units.push({ kind: "expert", layer: i, expert: e });
      bytes.push(expertBytes);
    }
    count(oneExpert, s.experts);
  }
  units.push({ kind: "head" });
  const head = unitTensors(s, { kind: "head" }, "none");
  bytes.push(sumBytes(head));
  count(head);
  return { units, bytes, census };
}

/**
 * Plans a full-size checkpoint: every unit and the shard it goes to. The embedding is shard 1;
 * the rest is cut by start offset into shards of about 16.4 GB (95 of them for 93 layers), so
 * no tensor and no expert straddles two shards.
 */
export function planFull(options: FullOptions = {}): FullPlan {
  const shape = fullShape(options.layers ?? K3_LAYERS);
  checkMxfp4Widths(shape);
  const { units, bytes, census } = unitsOf(shape);
  const total = bytes.reduce((a, b) => a + b, 0);
  const rest = total - bytes[0];
  const count = 1 + Math.max(1, Math.ceil(rest / shardTargetBytes()));
  // Shard of unit u (u >= 1): 1 + floor(start * (count - 1) / rest), start counted after the
  // embedding. Every unit is far smaller than a shard, so no shard is left empty.
  const shards: FullShard[] = [{
    file: shardName(1, count),
    first: 0,
    end: 1,
    dataBytes: bytes[0],
  }];
  let start = 0;
  for (let u = 1; u < units.length; u++) {
    const k = 1 + Math.floor((start * (count - 1)) / rest);
    if (k === shards.length) {
      shards.push({ file: shardName(k + 1, count), first: u, end: u, dataBytes: 0 });
    }
    const shard = shards[shards.length - 1];
    shard.end = u + 1;
    shard.dataBytes += bytes[u];
    start += bytes[u];
  }
  if (shards.length !== count) {
    throw new Error(`planFull: ${shards.length} shards filled, ${count} planned`);
  }
  const tensorCount = Object.values(census).reduce((a, b) => a + b, 0);
  return {
    shape,
    vocabSize: K3_VOCAB_SIZE,
    config: modelConfig(shape, K3_VOCAB_SIZE, NESTED),
    units,
    shards,
    totalTensorBytes: total,
    tensorCount,
    census,
  };
}

/** The tensors of one shard in file order. */
export function shardTensors(
  plan: FullPlan,
  shard: FullShard,
  data: FullData,
  routing: Routing = "uniform",
  weights: Weights = "uniform",
): PlannedTensor[] {
  const out: PlannedTensor[] = [];
  for (let u = shard.first; u < shard.end; u++) {
    for (const t of unitTensors(plan.shape, plan.units[u], data, routing, weights)) out.push(t);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Files

/** Bytes generated per step. */
const CHUNK_BYTES = 8 << 20;

/**
 * Writes one sparse shard: the header, the tensors that are not holes (each at its offset),
 * then a truncate to the full length. Returns the bytes actually written.
 */
export async function writeSparseShard(
  file: string,
  tensors: PlannedTensor[],
  seed: number,
  buffer: Uint8Array,
): Promise<number> {
  const { header, dataOffsets } = buildHeader(tensors, { format: "pt" });
  const size = header.length + sumBytes(tensors);
  let written = header.length;
  await writeAtomically(file, async (out) => {
    await writeAll(out, header);
    for (let k = 0; k < tensors.length; k++) {
      const t = tensors[k];
      if (t.init.kind === "hole") continue;
      await out.seek(header.length + dataOffsets[k], Deno.SeekMode.Start);
      for (const chunk of tensorChunks(t, seed, buffer)) await writeAll(out, chunk);
      written += t.nbytes;
    }
    await out.truncate(size);
  });
  return written;
}

/** model.safetensors.index.json as Hugging Face writes it: keys sorted, indent 2. */
function indexText(plan: FullPlan, entries: string[]): string {
  entries.sort();
  return `{\n  "metadata": {\n    "total_size": ${plan.totalTensorBytes}\n  },\n` +
    `  "weight_map": {\n${entries.join(",\n")}\n  }\n}\n`;
}

/** What `makeFull` wrote. */
interface FullResult {
  configPath: string;
  plan: FullPlan;
  /** Bytes written into files (headers, real tensors, JSON, tokenizer); the rest are holes. */
  writtenBytes: number;
  /** Apparent size of all files. */
  apparentBytes: number;
  /** Disk blocks the files occupy (st_blocks x 512). */
  diskBytes: number;
}

/**
 * Writes a full-size checkpoint (see the module comment) to `dir`.
 * @throws K3Error (bad input) for invalid options or a directory holding foreign shards
 */
export async function makeFull(dir: string, options: FullOptions = {}): Promise<FullResult> {
  const seed = requireInt(options.seed ?? 0, "--seed", 0, 2 ** 32 - 1);
  const data = options.data ?? "sparse";
  if (data !== "sparse" && data !== "none") {
    throw badInput(`make-tiny: --data must be "sparse" or "none", got ${JSON.stringify(data)}`);
  }
  const routing = checkRouting(options.routing);
  if (data === "none" && routing !== "uniform") {
    throw badInput(
      "make-tiny: --routing needs router data; --data none leaves every tensor a hole",
    );
  }
  const weights = checkWeights(options.weights);
  if (data === "none" && weights !== "uniform") {
    throw badInput(
      "make-tiny: --weights needs tensor data; --data none leaves every tensor a hole",
    );
  }
  const plan = planFull(options);
  await prepareDirectory(dir, plan.shards.map((s) => s.file));
  const files: string[] = [];
  let written = 0;
  const text = async (name: string, content: string) => {
    files.push(path.join(dir, name));
    written += await writeTextAtomically(files[files.length - 1], content);
  };
  const ranks = padVocabulary(synthVocabulary(), plan.vocabSize - NUM_SPECIAL_TOKENS);
  await text("tiktoken.model", formatTiktokenRanks(ranks));
  await text("tokenizer_config.json", jsonText(tokenizerConfig(plan.vocabSize)));
  await text(
    "generation_config.json",
    jsonText({ max_length: 1048576, eos_token_id: eosTokenId(plan.vocabSize) }),
  );
  const buffer = new Uint8Array(CHUNK_BYTES);
  const entries: string[] = [];
  for (const shard of plan.shards) {
    const tensors = shardTensors(plan, shard, data, routing, weights);
    const file = path.join(dir, shard.file);
    files.push(file);
    written += await writeSparseShard(file, tensors, seed, buffer);
    const where = JSON.stringify(shard.file);
    for (const t of tensors) entries.push(`    ${JSON.stringify(t.name)}: ${where}`);
  }
  await text("model.safetensors.index.json", indexText(plan, entries));
  // config.json last: its presence marks a complete checkpoint.
  const configPath = path.join(dir, "config.json");
  await text("config.json", jsonText(plan.config));
  let apparentBytes = 0, diskBytes = 0;
  for (const f of files) {
    const st = await Deno.stat(f);
    apparentBytes += st.size;
    diskBytes += (st.blocks ?? 0) * 512;
  }
  return { configPath, plan, writtenBytes: written, apparentBytes, diskBytes };
}
