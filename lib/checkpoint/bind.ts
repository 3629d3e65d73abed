/**
 * Binds the tensors the model needs (MODEL.md §3.3) by canonical name, checking each one's
 * exact shape and dtype against sizes read from the config (never K3's literal numbers).
 * Every missing or mismatched tensor is collected and reported in one error.
 */

import { isDenseLayer, type K3Config } from "./config.ts";
import { badInput } from "../errors.ts";
import { EXPERT_KINDS, ExpertIndex } from "./expert_index.ts";
import { layerTensorName, type ShardSet } from "./shards.ts";
import type {
  AttnResRefs,
  DenseMlpRefs,
  DType,
  ExpertRefs,
  ExpertTable,
  KdaRefs,
  LayerRefs,
  MlaRefs,
  ModelRefs,
  MoeRefs,
  TensorRef,
} from "./types.ts";

/** At most this many problems are listed; the rest are counted. */
const MAX_LISTED_PROBLEMS = 20;

/** What a tensor must look like: accepted dtypes, and a shape test with its description. */
interface Expectation {
  dtypes: DType[];
  shapeOk: (shape: number[]) => boolean;
  shapeText: string;
}

/** An exact shape. */
function exact(dtype: DType | DType[], shape: number[]): Expectation {
  const want = shape.join(",");
  return {
    dtypes: Array.isArray(dtype) ? dtype : [dtype],
    shapeOk: (s) => s.join(",") === want,
    shapeText: `[${shape.join(", ")}]`,
  };
}

/** Looks tensors up and records every problem instead of stopping at the first. */
class Binder {
  /** The first MAX_LISTED_PROBLEMS problems; `problemCount` counts them all. */
  readonly problems: string[] = [];
  problemCount = 0;

  constructor(
    private readonly tensors: Map<string, TensorRef>,
    readonly experts: ExpertIndex,
    readonly shards: readonly string[],
  ) {}

  /** Records a problem; the text is made only while the list has room. */
  problem(text: () => string): void {
    if (this.problemCount++ < MAX_LISTED_PROBLEMS) this.problems.push(text());
  }

  /** The tensor `name` if it meets `want`; otherwise records the problem and returns a stub. */
  take(name: string, want: Expectation): TensorRef {
    const ref = this.tensors.get(name);
    const expected = `expected ${want.dtypes.join(" or ")} ${want.shapeText}`;
    if (!ref) {
      this.problem(() => `${name}: missing (${expected})`);
      return { name, file: "", dtype: want.dtypes[0], shape: [], offset: 0, nbytes: 0 };
    }
    if (!want.dtypes.includes(ref.dtype) || !want.shapeOk(ref.shape)) {
      this.problem(() =>
        `${name} (${ref.name} in ${ref.file}): ${expected}, found ${ref.dtype} [${
          ref.shape.join(", ")
        }]`
      );
    }
    return ref;
  }

  /** A BF16 tensor of an exact shape (most weights). */
  bf16(name: string, shape: number[]): TensorRef {
    return this.take(name, exact("BF16", shape));
  }

  /**
   * A small vector the engine widens to fp32 once (norm gains, AttnRes vectors, KDA vectors,
   * conv taps): F32 or BF16 are both exact, so either is accepted. K3 ships norm gains in BF16
   * and the KDA vectors in F32.
   */
  vec(name: string, shape: number[]): TensorRef {
    return this.take(name, exact(["F32", "BF16"], shape));
  }
}

/**
 * Binds every tensor of the model described by `config`.
 * @param config the parsed config (all sizes come from here)
 * @param set the tensors, from readShards
 * @param options.layers bind only the first N decoder layers (default: all)
 * @throws K3Error (exit 2) listing each missing or mismatched tensor with expected/found
 */
export function bindModel(
  config: K3Config,
  set: ShardSet,
  options: { layers?: number } = {},
): ModelRefs {
  const numLayers = options.layers ?? config.numLayers;
  if (!Number.isSafeInteger(numLayers) || numLayers < 1 || numLayers > config.numLayers) {
    throw badInput(`layers must be an integer in 1..${config.numLayers}, got ${numLayers}`);
  }
  const b = new Binder(set.tensors, set.experts, set.shards);
  const { vocabSize: V, hiddenSize: H } = config;
  const refs: ModelRefs = {
    embed: b.bf16("model.embed_tokens.weight", [V, H]),
    norm: b.vec("model.norm.weight", [H]),
    outputRes: bindAttnRes(b, "model.output_attn_res", H),
    lmHead: b.bf16("lm_head.weight", [V, H]),
    layers: Array.from({ length: numLayers }, (_, i) => bindLayer(b, config, i)),
  };
  if (b.problemCount > 0) throw bindError(config, b);
  return refs;
}

/** One error listing the first problems and counting the rest. */
function bindError(config: K3Config, b: Binder) {
  const listed = [...b.problems];
  const more = b.problemCount - listed.length;
  if (more > 0) listed.push(`... and ${more} more`);
  return badInput(
    `checkpoint does not match ${config.source}: ${b.problemCount} tensor problem(s):\n  ` +
      listed.join("\n  "),
  );
}

/** `{prefix}_norm.weight` [H] and `{prefix}_proj.weight` [1, H]. */
function bindAttnRes(b: Binder, prefix: string, H: number): AttnResRefs {
  return {
    norm: b.vec(`${prefix}_norm.weight`, [H]),
    proj: b.vec(`${prefix}_proj.weight`, [1, H]),
  };
}

function bindLayer(b: Binder, c: K3Config, i: number): LayerRefs {
  const p = (suffix: string) => layerTensorName(i, suffix);
  const H = c.hiddenSize;
  const kind = c.layerKinds[i];
  // The output gate and o_proj act on the attention output: KDA heads x head_dim, or MLA
  // heads x v_head_dim.
  const attnWidth = kind === "kda" ? c.kda.numHeads * c.kda.headDim : c.numHeads * c.vHeadDim;
  const layer: LayerRefs = {
    index: i,
    kind,
    inputNorm: b.vec(p("input_layernorm.weight"), [H]),
    postAttnNorm: b.vec(p("post_attention_layernorm.weight"), [H]),
    attnRes: bindAttnRes(b, p("self_attention_res"), H),
    mlpRes: bindAttnRes(b, p("mlp_res"), H),
    gProj: b.bf16(p("self_attn.g_proj.weight"), [attnWidth, H]),
    oProj: b.bf16(p("self_attn.o_proj.weight"), [H, attnWidth]),
  };
  if (kind === "kda") layer.kda = bindKda(b, c, p);
  else layer.mla = bindMla(b, c, p);
  if (isDenseLayer(c, i)) layer.dense = bindDense(b, c, p);
  else layer.moe = bindMoe(b, c, i, p);
  return layer;
}

/** A_log: F32, 1-D with at least `heads` entries (K3 pads to head_dim), or old [1,1,heads,1]. */
function aLogExpectation(heads: number): Expectation {
  return {
    dtypes: ["F32", "BF16"],
    shapeOk: (s) => (s.length === 1 && s[0] >= heads) || s.join(",") === `1,1,${heads},1`,
    shapeText: `[n >= ${heads}] or [1, 1, ${heads}, 1]`,
  };
}

/** Conv taps: [C, 1, K] as released (nn.Conv1d, depthwise), or squeezed [C, K]. */
function convExpectation(width: number, K: number): Expectation {
  return {
    dtypes: ["F32", "BF16"],
    shapeOk: (s) => s.join(",") === `${width},1,${K}` || s.join(",") === `${width},${K}`,
    shapeText: `[${width}, 1, ${K}] or [${width}, ${K}]`,
  };
}

function bindKda(b: Binder, c: K3Config, p: (s: string) => string): KdaRefs {
  const H = c.hiddenSize;
  const { numHeads: heads, headDim: d, convKernel: K } = c.kda;
  const width = heads * d;
  return {
    q: b.bf16(p("self_attn.q_proj.weight"), [width, H]),
    k: b.bf16(p("self_attn.k_proj.weight"), [width, H]),
    v: b.bf16(p("self_attn.v_proj.weight"), [width, H]),
    qConv: b.take(p("self_attn.q_conv1d.weight"), convExpectation(width, K)),
    kConv: b.take(p("self_attn.k_conv1d.weight"), convExpectation(width, K)),
    vConv: b.take(p("self_attn.v_conv1d.weight"), convExpectation(width, K)),
    fA: b.bf16(p("self_attn.f_a_proj.weight"), [d, H]),
    fB: b.bf16(p("self_attn.f_b_proj.weight"), [width, d]),
    b: b.bf16(p("self_attn.b_proj.weight"), [heads, H]),
    aLog: b.take(p("self_attn.A_log"), aLogExpectation(heads)),
    dtBias: b.vec(p("self_attn.dt_bias"), [width]),
    oNorm: b.vec(p("self_attn.o_norm.weight"), [d]),
  };
}

function bindMla(b: Binder, c: K3Config, p: (s: string) => string): MlaRefs {
  const H = c.hiddenSize;
  const heads = c.numHeads, rope = c.qkRopeHeadDim, nope = c.qkNopeHeadDim;
  return {
    qA: b.bf16(p("self_attn.q_a_proj.weight"), [c.qLoraRank, H]),
    qANorm: b.vec(p("self_attn.q_a_layernorm.weight"), [c.qLoraRank]),
    qB: b.bf16(p("self_attn.q_b_proj.weight"), [heads * (nope + rope), c.qLoraRank]),
    kvA: b.bf16(p("self_attn.kv_a_proj_with_mqa.weight"), [c.kvLoraRank + rope, H]),
    kvANorm: b.vec(p("self_attn.kv_a_layernorm.weight"), [c.kvLoraRank]),
    kvB: b.bf16(p("self_attn.kv_b_proj.weight"), [heads * (nope + c.vHeadDim), c.kvLoraRank]),
  };
}

function bindDense(b: Binder, c: K3Config, p: (s: string) => string): DenseMlpRefs {
  const H = c.hiddenSize, I = c.intermediateSize;
  return {
    gate: b.bf16(p("mlp.gate_proj.weight"), [I, H]),
    up: b.bf16(p("mlp.up_proj.weight"), [I, H]),
    down: b.bf16(p("mlp.down_proj.weight"), [H, I]),
  };
}

function bindMoe(b: Binder, c: K3Config, i: number, p: (s: string) => string): MoeRefs {
  const m = (s: string) => p(`block_sparse_moe.${s}`);
  const H = c.hiddenSize, E = c.numExperts, L = c.latentSize;
  const shared = c.numSharedExperts * c.moeIntermediateSize;
  return {
    router: b.bf16(m("gate.weight"), [E, H]),
    routerBias: b.vec(m("gate.e_score_correction_bias"), [E]),
    latentDown: b.bf16(m("routed_expert_down_proj.weight"), [L, H]),
    latentNorm: b.vec(m("routed_expert_norm.weight"), [L]),
    latentUp: b.bf16(m("routed_expert_up_proj.weight"), [H, L]),
    sharedGate: b.bf16(m("shared_experts.gate_proj.weight"), [shared, H]),
    sharedUp: b.bf16(m("shared_experts.up_proj.weight"), [shared, H]),
    sharedDown: b.bf16(m("shared_experts.down_proj.weight"), [H, shared]),
    experts: bindExperts(b, c, i),
  };
}

/** The shape of an MXFP4 tensor of each slot kind (EXPERT_KINDS order): [rows, bytes/row]. */
function expertShapes(c: K3Config): [number, number][] {
  const L = c.latentSize, I = c.moeIntermediateSize, g = c.quantGroupSize;
  // w1 = gate and w3 = up (latent -> moe_intermediate), w2 = down (moe_intermediate -> latent).
  return [[I, L / 2], [I, L / g], [L, I / 2], [L, I / g], [I, L / 2], [I, L / g]];
}

/** Checks every routed expert of one layer in the compact table; refs come from the view. */
function bindExperts(b: Binder, c: K3Config, layer: number): ExpertTable {
  const shapes = expertShapes(c);
  const x = b.experts;
  for (let e = 0; e < c.numExperts; e++) {
    for (let k = 0; k < EXPERT_KINDS.length; k++) {
      const slot = x.slot(layer, e, k);
      const [rows, cols] = shapes[k];
      if (slot >= 0 && x.has(slot) && x.matches(slot, "U8", rows, cols)) continue;
      b.problem(() => {
        const name = ExpertIndex.canonicalName(layer, e, k);
        const expected = `expected U8 [${rows}, ${cols}]`;
        if (slot < 0 || !x.has(slot)) return `${name}: missing (${expected})`;
        const found = `${x.dtypeOf(slot)} [${x.shapeOf(slot).join(", ")}]`;
        const where = `${x.storedName(layer, e, k, slot)} in ${b.shards[x.file[slot]]}`;
        return `${name} (${where}): ${expected}, found ${found}`;
      });
    }
  }
  return new LayerExperts(x, layer, c, b.shards);
}

/** One layer's routed experts, refs made from the compact table when asked for. */
class LayerExperts implements ExpertTable {
  readonly count: number;
  readonly #shapes: [number, number][];

  constructor(
    readonly index: ExpertIndex,
    readonly layer: number,
    readonly config: K3Config,
    readonly shards: readonly string[],
  ) {
    this.count = config.numExperts;
    this.#shapes = expertShapes(config);
  }

  get(e: number): ExpertRefs {
    if (!Number.isInteger(e) || e < 0 || e >= this.count) {
      throw new RangeError(`expert ${e} is not in 0..${this.count - 1}`);
    }
    const ref = (k: number) => this.index.ref(this.layer, e, k, this.shards);
    const L = this.config.latentSize, I = this.config.moeIntermediateSize;
    return {
      w1: { packed: ref(0), scale: ref(1), rows: I, cols: L },
      w2: { packed: ref(2), scale: ref(3), rows: L, cols: I },
      w3: { packed: ref(4), scale: ref(5), rows: I, cols: L },
    };
  }
}
