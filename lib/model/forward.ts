/**
 * The forward pass (SPEC §4) as TypeScript orchestration over libk3 kernels.
 *
 * `forward(state, ids)` runs T new tokens through every layer at once: each weight matrix
 * is streamed once per layer for all T tokens (prefill as matrix x several vectors), and
 * each token's numbers are computed exactly as if it had come alone, so a prefill, a
 * chunked prefill, token-by-token decode and a full recompute give the same bytes.
 */
import { k3 } from "../../ffi/library.ts";
import { isDenseLayer, type K3Config } from "../config.ts";
import { overBudget, runInvalid } from "../errors.ts";
import type { ExpertSource, HeadWeights, TrunkSource } from "../memory/sources.ts";
import { mlaRowWidth, type SequenceState } from "./state.ts";
import type { ExpertWeights, LayerWeights } from "./weights.ts";

/** eps of the MLA low-rank norms: a constant of the reference code (SPEC decision 7). */
export const MLA_LOW_RANK_EPS = 1e-6;
/** eps of the KDA L2 normalisation of q and k (SPEC §4.1). */
export const KDA_L2_EPS = 1e-6;

/** Per-forward counters for the run report. */
export interface ForwardStats {
  expertRequests: number;
  expertSeconds: number;
  trunkWaitSeconds: number;
}

/** Float32 scratch buffers reused across calls, one per purpose. */
class Scratch {
  #bufs = new Map<string, Float32Array>();
  get(name: string, n: number): Float32Array {
    let b = this.#bufs.get(name);
    if (!b || b.length < n) {
      b = new Float32Array(n);
      this.#bufs.set(name, b);
    }
    return b.subarray(0, n);
  }
}

export class Forward {
  readonly #c: K3Config;
  readonly #scratch = new Scratch();
  stats: ForwardStats = { expertRequests: 0, expertSeconds: 0, trunkWaitSeconds: 0 };

  constructor(
    config: K3Config,
    readonly head: HeadWeights,
    readonly trunk: TrunkSource,
    readonly experts: ExpertSource,
    /** Layers this engine runs: fewer than the config's only under --layers. */
    readonly layers = config.numLayers,
  ) {
    this.#c = config;
  }

  /**
   * Runs `ids` as the next tokens of `state` and returns the logits of the last one
   * (vocab fp32). The state advances by ids.length positions.
   */
  async forward(state: SequenceState, ids: number[]): Promise<Float32Array> {
    const c = this.#c, lib = k3();
    const T = ids.length, H = c.hiddenSize;
    if (T === 0) throw new Error("forward needs at least one token");
    state.reserve(state.position + T);

    const bankRows = Math.ceil(this.layers / c.attnResBlockSize);
    const bank = this.#scratch.get("bank", T * bankRows * H);
    let nb = 0;
    const p = this.#scratch.get("p", T * H);
    const h = this.#scratch.get("h", T * H);
    const xn = this.#scratch.get("xn", T * H);

    const idArr = Int32Array.from(ids);
    if (lib.k3_embed_bf16(p, this.head.embed, idArr, c.vocabSize, H, T) !== 0) {
      throw runInvalid(`token id outside the vocabulary (0..${c.vocabSize - 1}) in ${ids}`);
    }

    for (let i = 0; i < this.layers; i++) {
      const t0 = performance.now();
      const w = await this.trunk.acquire(i);
      this.stats.trunkWaitSeconds += (performance.now() - t0) / 1000;

      // Attention side: mix the bank (skipped only while it is empty), snapshot at block starts.
      if (nb > 0) lib.k3_attn_res(h, bank, nb, bankRows, p, w.attnResSw, H, c.rmsNormEps, T);
      else h.set(p);
      let fresh = false;
      if (i % c.attnResBlockSize === 0) {
        for (let t = 0; t < T; t++) {
          bank.set(p.subarray(t * H, (t + 1) * H), (t * bankRows + nb) * H);
        }
        nb++;
        fresh = true;
      }
      lib.k3_rmsnorm(xn, h, w.inputNorm, H, c.rmsNormEps, T);
      const a = w.kind === "kda" ? this.#kda(state, w, xn, T) : this.#mla(state, w, xn, T);
      if (fresh) p.set(a);
      else lib.k3_add(p, a, T * H);

      // FFN side: the bank is never empty here.
      lib.k3_attn_res(h, bank, nb, bankRows, p, w.mlpResSw, H, c.rmsNormEps, T);
      lib.k3_rmsnorm(xn, h, w.postAttnNorm, H, c.rmsNormEps, T);
      const f = isDenseLayer(c, i) ? this.#dense(w, xn, T) : await this.#moe(w, xn, T);
      lib.k3_add(p, f, T * H);
      this.trunk.release(i);
    }

    // Output: final mix over the whole bank, final norm, lm_head on the last token only.
    const last = this.#scratch.get("last", H);
    lib.k3_attn_res(
      h,
      bank,
      nb,
      bankRows,
      p,
      this.head.outputResSw,
      H,
      c.rmsNormEps,
      T,
    );
    lib.k3_rmsnorm(last, h.subarray((T - 1) * H), this.head.norm, H, c.rmsNormEps, 1);
    const logits = new Float32Array(c.vocabSize);
    lib.k3_matmul_bf16(logits, this.head.lmHead, last, c.vocabSize, H, 1);

    state.position += T;
    state.tokens.push(...ids);
    state.lastLogits = logits;
    return logits;
  }

  /** Kimi Delta Attention for T tokens (SPEC §4.4), advancing the layer's state. */
  #kda(state: SequenceState, w: LayerWeights, xn: Float32Array, T: number): Float32Array {
    const c = this.#c, lib = k3(), kw = w.kda!, s = state.kda.get(w.index)!;
    const H = c.hiddenSize, nh = c.kda.numHeads, d = c.kda.headDim, C = nh * d;
    const K = c.kda.convKernel;
    const raw = this.#scratch.get("kda.raw", T * C);
    const q = this.#scratch.get("kda.q", T * C);
    const k = this.#scratch.get("kda.k", T * C);
    const v = this.#scratch.get("kda.v", T * C);
    lib.k3_matmul_bf16(raw, kw.q, xn, C, H, T);
    lib.k3_kda_conv(q, s.histQ, raw, kw.qConv, C, K, T);
    lib.k3_matmul_bf16(raw, kw.k, xn, C, H, T);
    lib.k3_kda_conv(k, s.histK, raw, kw.kConv, C, K, T);
    lib.k3_matmul_bf16(raw, kw.v, xn, C, H, T);
    lib.k3_kda_conv(v, s.histV, raw, kw.vConv, C, K, T);
    lib.k3_l2norm_heads(q, nh, d, KDA_L2_EPS, 1 / Math.sqrt(d), T);
    lib.k3_l2norm_heads(k, nh, d, KDA_L2_EPS, 1, T);

    const fa = this.#scratch.get("kda.fa", T * d);
    const alpha = this.#scratch.get("kda.alpha", T * C);
    lib.k3_matmul_bf16(fa, kw.fA, xn, d, H, T);
    lib.k3_matmul_bf16(raw, kw.fB, fa, C, d, T);
    lib.k3_kda_gate(alpha, raw, kw.dtBias, kw.aLog, nh, d, c.kda.gateLowerBound, T);
    const beta = this.#scratch.get("kda.beta", T * nh);
    lib.k3_matmul_bf16(beta, kw.b, xn, nh, H, T);
    lib.k3_sigmoid(beta, beta, T * nh);

    const o = this.#scratch.get("kda.o", T * C);
    lib.k3_kda_recurrence(o, s.S, q, k, v, alpha, beta, nh, d, T);
    lib.k3_matmul_bf16(raw, w.gProj, xn, C, H, T);
    lib.k3_gated_rmsnorm_heads(o, o, kw.oNorm, raw, nh, d, c.rmsNormEps, T);
    const out = this.#scratch.get("attn.out", T * H);
    lib.k3_matmul_bf16(out, w.oProj, o, H, C, T);
    return out;
  }

  /** Gated MLA over the latent cache, absorbed form (SPEC §4.6). */
  #mla(state: SequenceState, w: LayerWeights, xn: Float32Array, T: number): Float32Array {
    const c = this.#c, lib = k3(), mw = w.mla!, cache = state.mla.get(w.index)!.cache;
    const H = c.hiddenSize, nh = c.numHeads, dn = c.qkNopeHeadDim, dr = c.qkRopeHeadDim;
    const dv = c.vHeadDim, rq = c.qLoraRank, rkv = c.kvLoraRank, width = mlaRowWidth(c);

    const cq = this.#scratch.get("mla.cq", T * rq);
    lib.k3_matmul_bf16(cq, mw.qA, xn, rq, H, T);
    lib.k3_rmsnorm(cq, cq, mw.qANorm, rq, MLA_LOW_RANK_EPS, T);
    const q = this.#scratch.get("mla.q", T * nh * (dn + dr));
    lib.k3_matmul_bf16(q, mw.qB, cq, nh * (dn + dr), rq, T);

    // New cache rows: [rmsnorm(latent), k_pe], written straight into the cache.
    const rows = cache.subarray(state.position * width, (state.position + T) * width);
    lib.k3_matmul_bf16(rows, mw.kvA, xn, width, H, T);
    for (let t = 0; t < T; t++) {
      const lat = rows.subarray(t * width, t * width + rkv);
      lib.k3_rmsnorm(lat, lat, mw.kvANorm, rkv, MLA_LOW_RANK_EPS, 1);
    }

    const qAbs = this.#scratch.get("mla.qabs", T * nh * width);
    lib.k3_mla_absorb_q(qAbs, q, mw.kvB, nh, dn, dr, dv, rkv, T);
    const oLat = this.#scratch.get("mla.olat", T * nh * rkv);
    const scale = 1 / Math.sqrt(dn + dr);
    if (lib.k3_mla_attend(oLat, qAbs, cache, state.position, T, nh, rkv, dr, scale) !== 0) {
      throw overBudget(
        `MLA attention of layer ${w.index}: no memory for the ${state.position + T}-score ` +
          "scratch; free memory or shorten the context",
      );
    }
    const o = this.#scratch.get("mla.o", T * nh * dv);
    lib.k3_mla_expand_o(o, oLat, mw.kvB, nh, dn, dv, rkv, T);
    const g = this.#scratch.get("mla.g", T * nh * dv);
    lib.k3_matmul_bf16(g, w.gProj, xn, nh * dv, H, T);
    lib.k3_mul_sigmoid(o, g, T * nh * dv);
    const out = this.#scratch.get("attn.out", T * H);
    lib.k3_matmul_bf16(out, w.oProj, o, H, nh * dv, T);
    return out;
  }

  /** SiTU-GLU MLP: down(situ(gate x, up x)). */
  #mlp(
    prefix: string,
    gate: Deno.PointerObject,
    up: Deno.PointerObject,
    down: Deno.PointerObject,
    x: Float32Array,
    inner: number,
    T: number,
  ): Float32Array {
    const c = this.#c, lib = k3(), H = c.hiddenSize;
    const g = this.#scratch.get(`${prefix}.g`, T * inner);
    const u = this.#scratch.get(`${prefix}.u`, T * inner);
    lib.k3_matmul_bf16(g, gate, x, inner, H, T);
    lib.k3_matmul_bf16(u, up, x, inner, H, T);
    lib.k3_situ_glu(g, g, u, inner, c.situBeta, c.situLinearBeta, T);
    const out = this.#scratch.get(`${prefix}.out`, T * H);
    lib.k3_matmul_bf16(out, down, g, H, inner, T);
    return out;
  }

  #dense(w: LayerWeights, xn: Float32Array, T: number): Float32Array {
    const d = w.dense!;
    return this.#mlp("dense", d.gate, d.up, d.down, xn, this.#c.intermediateSize, T);
  }

  /** Stable LatentMoE (SPEC §4.8). */
  async #moe(w: LayerWeights, xn: Float32Array, T: number): Promise<Float32Array> {
    const c = this.#c, lib = k3(), mw = w.moe!;
    const H = c.hiddenSize, E = c.numExperts, k = c.topK, L = c.latentSize;

    const logits = this.#scratch.get("moe.logits", T * E);
    lib.k3_matmul_bf16(logits, mw.router, xn, E, H, T);
    const ids = new Int32Array(T * k);
    const weights = this.#scratch.get("moe.weights", T * k);
    lib.k3_router_topk(
      ids,
      weights,
      logits,
      mw.routerBias,
      E,
      k,
      // SPEC §4.8: renormalise only when asked and there is more than one expert to share.
      c.moeRenormalize && k > 1 ? 1 : 0,
      c.routedScalingFactor,
      T,
    );

    // Which tokens chose each expert, and in which of their k slots.
    const users = new Map<number, { t: number; j: number }[]>();
    for (let t = 0; t < T; t++) {
      for (let j = 0; j < k; j++) {
        const e = ids[t * k + j];
        if (!users.has(e)) users.set(e, []);
        users.get(e)!.push({ t, j });
      }
    }
    const wanted = [...users.keys()].sort((a, b) => a - b);
    this.stats.expertRequests += wanted.length;

    // Each expert's outputs land in their own slot, so arrival order cannot change the sum.
    const y = this.#scratch.get("moe.y", T * k * L);
    const t0 = performance.now();
    // The misses start reading now (the generator runs to its first yield); the latent
    // projection and the shared experts compute while they arrive.
    const fetched = this.experts.fetch(w.index, wanted)[Symbol.asyncIterator]();
    const first = fetched.next();
    const z = this.#scratch.get("moe.z", T * L);
    lib.k3_matmul_bf16(z, mw.latentDown, xn, L, H, T);
    const shared = this.#mlp(
      "shared",
      mw.sharedGate,
      mw.sharedUp,
      mw.sharedDown,
      xn,
      c.numSharedExperts * c.moeIntermediateSize,
      T,
    );
    try {
      for (let r = await first; !r.done; r = await fetched.next()) {
        this.#runExpert(w.index, r.value.id, r.value.weights, z, y, users.get(r.value.id)!);
      }
    } finally {
      await fetched.return?.(undefined);
    }
    this.experts.release(w.index);
    this.stats.expertSeconds += (performance.now() - t0) / 1000;

    const acc = this.#scratch.get("moe.acc", T * L);
    for (let t = 0; t < T; t++) {
      lib.k3_moe_combine(
        acc.subarray(t * L, (t + 1) * L),
        y.subarray(t * k * L, (t + 1) * k * L),
        weights.subarray(t * k, (t + 1) * k),
        k,
        L,
      );
    }
    if (c.latentMoeUseNorm) lib.k3_rmsnorm(acc, acc, mw.latentNorm, L, c.rmsNormEps, T);
    const routed = this.#scratch.get("moe.routed", T * H);
    lib.k3_matmul_bf16(routed, mw.latentUp, acc, H, L, T);
    lib.k3_add(routed, shared, T * H);
    return routed;
  }

  /** One expert on the tokens that chose it; outputs go to y[t][j]. */
  #runExpert(
    layer: number,
    id: number,
    ew: ExpertWeights,
    z: Float32Array,
    y: Float32Array,
    users: { t: number; j: number }[],
  ): void {
    const c = this.#c, lib = k3(), L = c.latentSize, I = c.moeIntermediateSize, k = c.topK;
    const n = users.length, G = c.quantGroupSize;
    const zin = this.#scratch.get("exp.z", n * L);
    users.forEach(({ t }, r) => zin.set(z.subarray(t * L, (t + 1) * L), r * L));
    const g = this.#scratch.get("exp.g", n * I);
    const u = this.#scratch.get("exp.u", n * I);
    const out = this.#scratch.get("exp.out", n * L);
    const rc = lib.k3_matmul_mxfp4(g, ew.w1Packed, ew.w1Scale, zin, I, L, G, n) ||
      lib.k3_matmul_mxfp4(u, ew.w3Packed, ew.w3Scale, zin, I, L, G, n);
    lib.k3_situ_glu(g, g, u, I, c.situBeta, c.situLinearBeta, n);
    const rc2 = rc || lib.k3_matmul_mxfp4(out, ew.w2Packed, ew.w2Scale, g, L, I, G, n);
    if (rc2 !== 0) {
      throw runInvalid(
        `expert ${id} of layer ${layer}: ` +
          (rc2 === -1 ? "an E8M0 scale byte is 255 (NaN)" : "unsupported MXFP4 group layout"),
      );
    }
    users.forEach(({ t, j }, r) => y.set(out.subarray(r * L, (r + 1) * L), (t * k + j) * L));
  }
}
