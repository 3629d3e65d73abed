/**
 * config.json -> K3Config. Nested (`text_config`, `linear_attn_config`,
 * `quantization_config`) and flat shapes. Every shape key is required; a missing key is
 * never replaced by a default (MODEL.md §1.2, §2.1).
 *
 * "Nested" is the released multimodal wrapper: the text model's keys under `text_config`.
 * "Flat" is the same text keys at the top level. In both, `linear_attn_config` is an object
 * inside the text block, and `quantization_config` sits in the text block or at the top.
 */

import * as path from "node:path";
import { badInput, type K3Error } from "../errors.ts";
import { readUserText } from "../io/files.ts";

/** KDA (linear attention) settings from `linear_attn_config`. */
interface KdaConfig {
  numHeads: number;
  headDim: number;
  convKernel: number; // short_conv_kernel_size
  gateLowerBound: number; // gate_lower_bound, -5 <= lb < 0
  useFullRankGate: boolean;
}

/** Everything the engine reads from config.json, in engine units. */
export interface K3Config {
  /** Path of the config.json this came from. */
  source: string;
  layout: "nested" | "flat";
  vocabSize: number;
  hiddenSize: number;
  numLayers: number;
  /** Dense MLP width (layers below firstKDenseReplace). */
  intermediateSize: number;
  firstKDenseReplace: number;
  moeLayerFreq: number;
  rmsNormEps: number;
  situBeta: number; // activation_situ_beta (gate cap)
  situLinearBeta: number; // activation_situ_linear_beta (up cap)
  // MLA
  numHeads: number;
  qLoraRank: number;
  kvLoraRank: number;
  qkNopeHeadDim: number;
  qkRopeHeadDim: number;
  vHeadDim: number;
  // MoE
  numExperts: number;
  topK: number;
  numSharedExperts: number;
  moeIntermediateSize: number;
  /** routed_expert_hidden_size: the latent width the experts run in. */
  latentSize: number;
  latentMoeUseNorm: boolean;
  moeRenormalize: boolean;
  routedScalingFactor: number;
  // AttnRes
  attnResBlockSize: number;
  // KDA
  kda: KdaConfig;
  /** 1-based lists as in the file. */
  kdaLayers: number[];
  fullAttnLayers: number[];
  /** 0-based per-layer attention kind, derived from the lists. */
  layerKinds: ("kda" | "mla")[];
  /** MXFP4 group size from quantization_config. */
  quantGroupSize: number;
  /** max_position_embeddings, when the file has it: no run may hold more positions. */
  maxPositions?: number;
  /** Generation stop ids from eos_token_id (a number or a list), possibly empty. */
  eosTokenIds: number[];
  /** Behavioural defaults that were applied because their key was absent (named). */
  defaultsApplied: string[];
}

/** True when layer i (0-based) uses a dense MLP rather than LatentMoE. */
export function isDenseLayer(
  c: Pick<K3Config, "firstKDenseReplace" | "moeLayerFreq">,
  i: number,
): boolean {
  return !(i >= c.firstKDenseReplace && i % c.moeLayerFreq === 0);
}

/** A JSON object as parsed. */
type JsonObject = Record<string, unknown>;

function isObject(v: unknown): v is JsonObject {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

/** Joins a JSON path for messages: "" + "x" = "x", "a" + "x" = "a.x". */
function joinPath(base: string, key: string): string {
  return base ? `${base}.${key}` : key;
}

/**
 * Reads typed fields out of one JSON object while collecting every problem, so that a
 * config with several faults is reported in one error rather than one fault per run.
 */
class FieldReader {
  readonly missing: string[] = [];
  readonly problems: string[] = [];
  readonly defaultsApplied: string[] = [];

  /** The raw value at obj[key] (or an alias), or undefined after recording it as missing. */
  required(obj: JsonObject, base: string, key: string, aliases: string[] = []): unknown {
    for (const k of [key, ...aliases]) {
      if (obj[k] !== undefined) return obj[k];
    }
    this.missing.push(joinPath(base, key));
    return undefined;
  }

  /** A JSON object at obj[key]; when absent or wrong, {} so its own keys still get checked. */
  object(obj: JsonObject, base: string, key: string): JsonObject {
    const v = obj[key];
    if (v === undefined) return {};
    if (isObject(v)) return v;
    this.wrongType(joinPath(base, key), "an object", v);
    return {};
  }

  /** An integer in [min, max]; `max` is a {@link Bound} (the value, and why). */
  int(
    obj: JsonObject,
    base: string,
    key: string,
    min: number,
    max: Bound,
    aliases: string[] = [],
  ): number {
    const v = this.required(obj, base, key, aliases);
    if (v === undefined) return 0;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min) {
      this.wrongType(joinPath(base, key), min > 0 ? "a positive integer" : "an integer >= 0", v);
      return 0;
    }
    if (v > max.value) {
      this.problems.push(
        `${joinPath(base, key)} is ${v}, over the ${max.value} k3 accepts (${max.why})`,
      );
      return 0;
    }
    return v;
  }

  number(obj: JsonObject, base: string, key: string): number {
    const v = this.required(obj, base, key);
    if (v === undefined) return 0;
    if (typeof v !== "number" || !Number.isFinite(v)) {
      this.wrongType(joinPath(base, key), "a number", v);
      return 0;
    }
    return v;
  }

  /** A number in [range.lo, range.hi]; outside it is nonsense for this key, so refused. */
  ranged(obj: JsonObject, base: string, key: string, range: Range): number {
    const v = this.number(obj, base, key);
    const present = typeof obj[key] === "number" && Number.isFinite(obj[key]);
    if (present) checkRange(this, joinPath(base, key), v, range);
    return v;
  }

  string(obj: JsonObject, base: string, key: string): string {
    const v = this.required(obj, base, key);
    if (v === undefined) return "";
    if (typeof v !== "string") {
      this.wrongType(joinPath(base, key), "a string", v);
      return "";
    }
    return v;
  }

  bool(obj: JsonObject, base: string, key: string): boolean {
    const v = this.required(obj, base, key);
    if (v === undefined) return false;
    if (typeof v !== "boolean") {
      this.wrongType(joinPath(base, key), "true or false", v);
      return false;
    }
    return v;
  }

  intList(obj: JsonObject, base: string, key: string): number[] {
    const v = this.required(obj, base, key);
    if (v === undefined) return [];
    if (!Array.isArray(v) || !v.every((x) => typeof x === "number" && Number.isSafeInteger(x))) {
      this.wrongType(joinPath(base, key), "a list of integers", v);
      return [];
    }
    return v as number[];
  }

  /**
   * A behavioural flag (MODEL.md §2.1): the value when present (type-checked), else the
   * universal default, recorded in `defaultsApplied`.
   */
  flag<T extends number | boolean | string>(obj: JsonObject, base: string, key: string, def: T): T {
    const v = obj[key];
    if (v === undefined) {
      this.defaultsApplied.push(`${joinPath(base, key)}=${JSON.stringify(def)}`);
      return def;
    }
    if (typeof v !== typeof def || (typeof v === "number" && !Number.isFinite(v))) {
      this.wrongType(joinPath(base, key), `a ${typeof def}`, v);
      return def;
    }
    return v as T;
  }

  /** Records a problem unless `ok`. */
  check(ok: boolean, message: string): void {
    if (!ok) this.problems.push(message);
  }

  /** The optional positive integer at obj[key], at most `max`; undefined when absent. */
  optionalInt(obj: JsonObject, base: string, key: string, max: Bound): number | undefined {
    if (obj[key] === undefined || obj[key] === null) return undefined;
    return this.int(obj, base, key, 1, max) || undefined;
  }

  private wrongType(path: string, expected: string, found: unknown): void {
    this.problems.push(`${path} must be ${expected}, found ${JSON.stringify(found)}`);
  }
}

/** The most a config value may be, and why (named in the error). */
interface Bound {
  value: number;
  why: string;
}

/** The values a float key may take, and what they are for (named in the error). */
interface Range {
  lo: number;
  hi: number;
  /** True when lo itself is excluded. */
  loOpen?: boolean;
  why: string;
}

function checkRange(f: FieldReader, at: string, v: number, r: Range): void {
  const low = r.loOpen ? v <= r.lo : v < r.lo;
  if (low || v > r.hi) {
    f.problems.push(
      `${at} is ${v}; it must be ${r.loOpen ? "above" : "at least"} ${r.lo} and at most ${r.hi} ` +
        `(${r.why})`,
    );
  }
}

/*
 * Bounds on config values: far past any real model (K3's values in the
 * reasons), and small enough that nothing sized from them before the checkpoint's own
 * tensors are compared with them can exhaust memory or overflow: the layer lists and kinds,
 * the bind loop over layers, the expert table (which shards.ts also bounds by the tensors
 * the index lists). A value within them that the tensors disagree with is refused by bind.
 */
const WIDTH: Bound = { value: 1 << 20, why: "no tensor is that wide; K3's widest is 33792" };
const VOCAB: Bound = { value: 1 << 24, why: "K3 has 163840 tokens" };
const LAYERS: Bound = { value: 1024, why: "K3 has 93 layers" };
const EXPERTS: Bound = { value: 1 << 16, why: "K3 has 896 experts per layer" };
const HEADS: Bound = { value: 4096, why: "K3 has 64 attention heads" };
const SMALL: Bound = { value: 256, why: "K3's is below 16" };
const GROUP: Bound = { value: 1 << 16, why: "K3's MXFP4 group is 32" };
const POSITIONS: Bound = { value: 1 << 30, why: "K3 has 1048576" };
const EPS: Range = { lo: 1e-12, hi: 0.1, why: "an RMSNorm epsilon; K3's is 1e-5" };
const SITU_BETA: Range = { lo: 0.01, hi: 1e4, why: "a SiTU soft cap; K3's are 4 and 25" };
const SCALING: Range = {
  lo: 0,
  hi: 1000,
  loOpen: true,
  why: "it scales the routed experts' sum; K3's is 1.0, and 0 or less silences or inverts them",
};

/** The parts of a config.json: where the text model's keys and the sub-blocks live. */
interface ConfigShape {
  layout: "nested" | "flat";
  text: JsonObject;
  textPath: string;
  linear: JsonObject;
  linearPath: string;
  quant: JsonObject;
  quantPath: string;
}

/** Finds text_config / linear_attn_config / quantization_config in either layout. */
function locateBlocks(root: JsonObject, f: FieldReader): ConfigShape {
  const nested = root.text_config !== undefined;
  const textPath = nested ? "text_config" : "";
  const text = nested ? f.object(root, "", "text_config") : root;
  const linearPath = joinPath(textPath, "linear_attn_config");
  const linear = f.object(text, textPath, "linear_attn_config");
  // Quantisation sits in text_config in the released file; some exporters copy it to the top.
  const quantHome = text.quantization_config !== undefined ? text : root;
  const quantPath = joinPath(quantHome === text ? textPath : "", "quantization_config");
  const quant = f.object(quantHome, quantHome === text ? textPath : "", "quantization_config");
  return {
    layout: nested ? "nested" : "flat",
    text,
    textPath,
    linear,
    linearPath,
    quant,
    quantPath,
  };
}

/** Quantisation config groups read (the release has one). */
const MAX_GROUPS = 64;

/** The MXFP4 group size: every config group must agree on `weights.group_size`. */
function readGroupSize(quant: JsonObject, quantPath: string, f: FieldReader): number {
  const groupsPath = joinPath(quantPath, "config_groups");
  const groups = f.object(quant, quantPath, "config_groups");
  const names = Object.keys(groups);
  if (names.length > MAX_GROUPS) {
    f.check(false, `${groupsPath} has ${names.length} groups; k3 reads at most ${MAX_GROUPS}`);
    return 0;
  }
  if (names.length === 0) {
    f.missing.push(`${groupsPath}.<group>.weights.group_size`);
    return 0;
  }
  const sizes = new Set<number>();
  for (const name of names) {
    const groupPath = joinPath(groupsPath, name);
    const weights = f.object(f.object(groups, groupsPath, name), groupPath, "weights");
    sizes.add(f.int(weights, joinPath(groupPath, "weights"), "group_size", 1, GROUP));
  }
  f.check(
    sizes.size <= 1,
    `${groupsPath}: groups disagree on weights.group_size (${[...sizes].join(", ")})`,
  );
  return [...sizes][0];
}

/** A number or a list of numbers at obj[key], as a list; absent = []. */
function readEosIds(obj: JsonObject, base: string, f: FieldReader): number[] {
  const v = obj.eos_token_id;
  if (v === undefined || v === null) return [];
  const list = Array.isArray(v) ? v : [v];
  if (!list.every((x) => typeof x === "number" && Number.isSafeInteger(x) && x >= 0)) {
    f.check(
      false,
      `${joinPath(base, "eos_token_id")} must be a token id or a list of token ids, found ${
        JSON.stringify(v)
      }`,
    );
    return [];
  }
  return list as number[];
}

/**
 * Checks that two 1-based layer lists are disjoint and together cover 1..numLayers exactly,
 * naming each index that is out of range, listed twice, or missing.
 */
function checkLayerLists(
  kda: number[],
  full: number[],
  numLayers: number,
  linearPath: string,
  f: FieldReader,
): void {
  const seen = new Map<number, string>();
  const lists: [string, number[]][] = [["kda_layers", kda], ["full_attn_layers", full]];
  for (const [name, list] of lists) {
    const where = joinPath(linearPath, name);
    if (list.length > numLayers) {
      f.check(false, `${where} has ${list.length} entries; the model has ${numLayers} layers`);
      continue;
    }
    for (const i of list) {
      if (i < 1 || i > numLayers) {
        const hint = i === 0 ? " (the lists are 1-based)" : "";
        f.check(false, `${where}: layer ${i} is out of range 1..${numLayers}${hint}`);
      } else if (seen.has(i)) {
        f.check(false, `${where}: layer ${i} is listed twice (also in ${seen.get(i)})`);
      } else {
        seen.set(i, name);
      }
    }
  }
  const missing: number[] = [];
  for (let i = 1; i <= numLayers; i++) if (!seen.has(i)) missing.push(i);
  f.check(
    missing.length === 0,
    `${linearPath}: layers ${listSome(missing)} are in neither kda_layers nor full_attn_layers ` +
      `(together they must cover 1..${numLayers})`,
  );
}

/** Values whose only supported setting is the reference one (the engine implements no other). */
function checkSupportedFlags(
  text: JsonObject,
  textPath: string,
  f: FieldReader,
): void {
  const act = f.flag(text, textPath, "moe_router_activation_func", "sigmoid");
  f.check(
    act === "sigmoid",
    `${joinPath(textPath, "moe_router_activation_func")} is ${
      JSON.stringify(act)
    }; only "sigmoid" is supported`,
  );
  const groups = f.flag(text, textPath, "num_expert_group", 1);
  f.check(
    groups === 1,
    `${joinPath(textPath, "num_expert_group")} is ${groups}; only 1 (no group-limited routing) ` +
      `is supported`,
  );
  for (const key of ["mla_use_nope", "mla_use_output_gate"]) {
    const v = f.flag(text, textPath, key, true);
    f.check(v, `${joinPath(textPath, key)} is false; K3 requires true`);
  }
  // Not needed by the math (MLA has no GQA), so optional; but a different value is a different model.
  const kvHeads = text.num_key_value_heads;
  f.check(
    kvHeads === undefined || kvHeads === text.num_attention_heads,
    `${joinPath(textPath, "num_key_value_heads")} is ${
      JSON.stringify(kvHeads)
    }; K3's MLA needs it equal to num_attention_heads`,
  );
  f.check(
    text.tie_word_embeddings !== true,
    `${joinPath(textPath, "tie_word_embeddings")} is true; K3 ships a separate lm_head`,
  );
}

/**
 * Builds a K3Config from parsed config.json content.
 * @param json the parsed config.json
 * @param source the file's path, named in every error
 * @param generationConfig parsed generation_config.json, if any (adds its eos_token_id)
 * @throws K3Error (exit 2) naming every missing key and every invalid value at once
 */
export function parseConfig(json: unknown, source: string, generationConfig?: unknown): K3Config {
  if (!isObject(json)) throw badInput(`${source}: config must be a JSON object`);
  const f = new FieldReader();
  const { layout, text, textPath: t, linear, linearPath: l, quant, quantPath } = locateBlocks(
    json,
    f,
  );
  const numLayers = f.int(text, t, "num_hidden_layers", 1, LAYERS);
  const hiddenAct = f.string(text, t, "hidden_act");
  const config: K3Config = {
    source,
    layout,
    vocabSize: f.int(text, t, "vocab_size", 1, VOCAB),
    hiddenSize: f.int(text, t, "hidden_size", 1, WIDTH),
    numLayers,
    intermediateSize: f.int(text, t, "intermediate_size", 1, WIDTH),
    firstKDenseReplace: f.int(text, t, "first_k_dense_replace", 0, LAYERS),
    moeLayerFreq: f.int(text, t, "moe_layer_freq", 1, LAYERS),
    rmsNormEps: f.ranged(text, t, "rms_norm_eps", EPS),
    situBeta: f.ranged(text, t, "activation_situ_beta", SITU_BETA),
    situLinearBeta: f.ranged(text, t, "activation_situ_linear_beta", SITU_BETA),
    numHeads: f.int(text, t, "num_attention_heads", 1, HEADS),
    qLoraRank: f.int(text, t, "q_lora_rank", 1, WIDTH),
    kvLoraRank: f.int(text, t, "kv_lora_rank", 1, WIDTH),
    qkNopeHeadDim: f.int(text, t, "qk_nope_head_dim", 1, WIDTH),
    qkRopeHeadDim: f.int(text, t, "qk_rope_head_dim", 0, WIDTH),
    vHeadDim: f.int(text, t, "v_head_dim", 1, WIDTH),
    numExperts: f.int(text, t, "num_experts", 1, EXPERTS, ["n_routed_experts"]),
    topK: f.int(text, t, "num_experts_per_token", 1, EXPERTS, ["num_experts_per_tok"]),
    numSharedExperts: f.int(text, t, "num_shared_experts", 1, SMALL),
    moeIntermediateSize: f.int(text, t, "moe_intermediate_size", 1, WIDTH),
    latentSize: f.int(text, t, "routed_expert_hidden_size", 1, WIDTH),
    attnResBlockSize: f.int(text, t, "attn_res_block_size", 1, LAYERS),
    kda: {
      numHeads: f.int(linear, l, "num_heads", 1, HEADS),
      headDim: f.int(linear, l, "head_dim", 1, WIDTH),
      convKernel: f.int(linear, l, "short_conv_kernel_size", 1, SMALL),
      gateLowerBound: f.number(linear, l, "gate_lower_bound"),
      useFullRankGate: f.flag(linear, l, "use_full_rank_gate", true),
    },
    kdaLayers: f.intList(linear, l, "kda_layers"),
    fullAttnLayers: f.intList(linear, l, "full_attn_layers"),
    layerKinds: [],
    quantGroupSize: readGroupSize(quant, quantPath, f),
    maxPositions: f.optionalInt(text, t, "max_position_embeddings", POSITIONS),
    latentMoeUseNorm: f.flag(text, t, "latent_moe_use_norm", true),
    moeRenormalize: f.flag(text, t, "moe_renormalize", true),
    routedScalingFactor: f.flag(text, t, "routed_scaling_factor", 1.0),
    eosTokenIds: [],
    defaultsApplied: f.defaultsApplied,
  };
  checkSupportedFlags(text, t, f);
  config.eosTokenIds = collectEosIds(json, text, t, generationConfig, f);
  if (f.missing.length > 0 || f.problems.length > 0) throw configError(source, f);
  validateValues(config, hiddenAct, t, l, quantPath, f);
  if (f.problems.length > 0) throw configError(source, f);
  const kdaSet = new Set(config.kdaLayers);
  config.layerKinds = Array.from(
    { length: numLayers },
    (_, i) => kdaSet.has(i + 1) ? "kda" : "mla",
  );
  return config;
}

/** eos ids from config.json (text block, then top level) and generation_config.json, deduplicated. */
function collectEosIds(
  root: JsonObject,
  text: JsonObject,
  textPath: string,
  generationConfig: unknown,
  f: FieldReader,
): number[] {
  const ids = [...readEosIds(text, textPath, f)];
  if (text !== root) ids.push(...readEosIds(root, "", f));
  if (generationConfig !== undefined) {
    if (isObject(generationConfig)) ids.push(...readEosIds(generationConfig, GENERATION_CONFIG, f));
    else f.check(false, `${GENERATION_CONFIG} must be a JSON object`);
  }
  return [...new Set(ids)];
}

/** Cross-field checks that only make sense once every key has the right type. */
function validateValues(
  c: K3Config,
  hiddenAct: string,
  t: string,
  l: string,
  quantPath: string,
  f: FieldReader,
): void {
  f.check(
    hiddenAct === "situ",
    `${joinPath(t, "hidden_act")} is ${JSON.stringify(hiddenAct)}; K3 uses "situ"`,
  );
  checkLayerLists(c.kdaLayers, c.fullAttnLayers, c.numLayers, l, f);
  for (
    const [key, v] of [
      ["first_k_dense_replace", c.firstKDenseReplace],
      ["moe_layer_freq", c.moeLayerFreq],
    ] as const
  ) {
    f.check(
      v <= c.numLayers,
      `${joinPath(t, key)} is ${v}, more than num_hidden_layers (${c.numLayers})`,
    );
  }
  checkRange(f, joinPath(t, "routed_scaling_factor"), c.routedScalingFactor, SCALING);
  const lb = c.kda.gateLowerBound;
  f.check(
    lb >= -5 && lb < 0,
    `${joinPath(l, "gate_lower_bound")} is ${lb}; it must satisfy -5 <= gate_lower_bound < 0`,
  );
  f.check(
    c.kda.useFullRankGate,
    `${joinPath(l, "use_full_rank_gate")} is false; only the full-rank output gate (g_proj) ` +
      `is supported`,
  );
  const g = c.quantGroupSize;
  for (
    const [key, width] of [["routed_expert_hidden_size", c.latentSize], [
      "moe_intermediate_size",
      c.moeIntermediateSize,
    ]] as const
  ) {
    f.check(
      width % g === 0 && width % 2 === 0,
      `${joinPath(t, key)} = ${width} must be even and a multiple of the MXFP4 group size ` +
        `${g} (${quantPath}.config_groups.*.weights.group_size)`,
    );
  }
  f.check(
    c.topK <= c.numExperts,
    `${joinPath(t, "num_experts_per_token")} = ${c.topK} exceeds ${
      joinPath(t, "num_experts")
    } = ${c.numExperts}`,
  );
}

/** At most this many problems are listed; the rest are counted. */
const MAX_PROBLEMS = 20;

/** "1, 2, 3" for a short list; the first 20 and a count for a long one. */
function listSome(items: number[]): string {
  if (items.length <= MAX_PROBLEMS) return items.join(", ");
  return `${items.slice(0, MAX_PROBLEMS).join(", ")} and ${items.length - MAX_PROBLEMS} more`;
}

/** One error for everything wrong with a config, missing keys first (capped at 20 lines). */
function configError(source: string, f: FieldReader): K3Error {
  const lines: string[] = [];
  if (f.missing.length > 0) {
    lines.push(
      `missing ${f.missing.length} required key(s): ${f.missing.join(", ")}` +
        ` (shape keys have no defaults; add them to the file)`,
    );
  }
  for (const p of f.problems.slice(0, MAX_PROBLEMS)) lines.push(p);
  if (f.problems.length > MAX_PROBLEMS) {
    lines.push(`... and ${f.problems.length - MAX_PROBLEMS} more problem(s)`);
  }
  return badInput(`${source}: invalid config:\n  ${lines.join("\n  ")}`);
}

/** The file next to config.json that may also carry eos_token_id. */
const GENERATION_CONFIG = "generation_config.json";

/**
 * Reads config.json (and generation_config.json next to it, if present).
 * @param file path of config.json
 * @throws K3Error (exit 2) when the file is missing, not JSON, or invalid
 */
export async function readConfig(file: string): Promise<K3Config> {
  const json = await readJsonFile(file, "config");
  const genPath = path.join(path.dirname(file), GENERATION_CONFIG);
  const gen = await readJsonFile(genPath, "generation config", true);
  return parseConfig(json, file, gen);
}

/** The release's config.json is a few KB; no config or generation config comes near this. */
const MAX_JSON_BYTES = 16 << 20;

/**
 * Reads and parses a JSON file; a missing file (unless `missingOk`: then undefined), a symlink
 * loop or bad JSON is bad input naming the file.
 */
async function readJsonFile(
  file: string,
  what: string,
  missingOk = false,
): Promise<unknown> {
  // A FIFO, /dev/zero, a symlink loop or a huge file is refused before it is read.
  const text = await readUserText(file, `${what} file`, { limit: MAX_JSON_BYTES, missingOk });
  if (text === null) return undefined;
  try {
    return JSON.parse(text);
  } catch (e) {
    throw badInput(`${file}: ${what} file is not valid JSON (${(e as Error).message})`, {
      cause: e,
    });
  }
}
