/**
 * The forward pass (MODEL.md §4) as TypeScript orchestration over libk3 kernels.
 *
 * `forward(state, ids)` runs T new tokens through every layer at once: each weight matrix
 * is streamed once per layer for all T tokens (prefill as matrix x several vectors), and
 * each token's numbers are computed exactly as if it had come alone, so a prefill, a
 * chunked prefill, token-by-token decode and a full recompute give the same bytes.
 *
 * `forwardMany(seqs)` does the same for several sequences in one pass: the per-token work
 * runs once over all their tokens, the sequence mixers (KDA conv and recurrence, MLA
 * attention) per sequence on its own state, and the MoE reads the union of the experts
 * they chose. It returns the logits of every position a sequence asks for, and runs
 * verify passes that keep what an exact rewind needs (./rewind.ts).
 *
 * Who owns what: the weight access (BlockReader, #linear, the scratch table) is memory's;
 * the sequence batching and the verify records are speculation's and batching's.
 */
import { k3 } from "../../ffi/library.ts";
import { isDenseLayer, type K3Config } from "../checkpoint/config.ts";
import { overBudget, runInvalid } from "../errors.ts";
import {
  bankRows,
  CHUNK_SCRATCH,
  mlaRowWidth,
  scratchFloats,
  SHARED_SCRATCH,
} from "../layout/state.ts";
import type { EmbeddingRows, ExpertSource, TrunkSource } from "../memory/sources.ts";
import { kernel } from "./kernel.ts";
import type { PassRecord } from "./rewind.ts";
import type { KdaState, SequenceState } from "./state.ts";
import {
  bindExpert,
  BlockMap,
  BlockReader,
  type ExpertWeights,
  type LayerVectors,
  layerVectors,
} from "./weights.ts";

/** eps of the MLA low-rank norms: a constant of the reference code (MODEL.md §4.6). */
export const MLA_LOW_RANK_EPS = 1e-6;
/** eps of the KDA L2 normalisation of q and k (MODEL.md §4.1). */
export const KDA_L2_EPS = 1e-6;

/** Per-forward counters for the run report. */
export interface ForwardStats {
  expertRequests: number;
  expertSeconds: number;
}

/** The model-level vectors: the final norm and the output AttnRes score vector. */
export interface HeadVectors {
  norm: Float32Array;
  outputResSw: Float32Array;
}

/**
 * Float32 scratch buffers reused across calls, one per name of layout/state.ts's table
 * (which the planner adds up), each at most that many floats per token. The buffers of one
 * layer kind share a room with the other kind's (SHARED_SCRATCH): a name's buffer is its
 * slice of the room, so every name of a room must be asked for with the same T within a
 * layer (the pass's).
 */
class Scratch {
  #bufs = new Map<string, Float32Array>();
  /** Where a shared name sits: its room and its offset there, in floats per token. */
  #places = new Map<string, { room: string; offset: number }>();
  /** Floats per token of each room. */
  #rooms = new Map<string, number>();

  constructor(
    readonly perToken: Record<string, number>,
    /** Most tokens a chunk-sized buffer (CHUNK_SCRATCH) is asked for: the plan counts that. */
    readonly chunk: number,
  ) {
    SHARED_SCRATCH.forEach((kinds, r) => {
      const room = `room ${r}`;
      let width = 0;
      for (const kind of kinds) {
        let offset = 0;
        for (const name of kind) {
          this.#places.set(name, { room, offset });
          offset += perToken[name];
        }
        width = Math.max(width, offset);
      }
      this.#rooms.set(room, width);
    });
  }

  get(name: string, T: number): Float32Array {
    const per = this.perToken[name];
    if (per === undefined) throw new Error(`scratch buffer ${name} is not in the plan's table`);
    if (T > this.chunk && CHUNK_SCRATCH.includes(name)) {
      throw new Error(`scratch buffer ${name} asked for ${T} tokens, over the ${this.chunk} chunk`);
    }
    const place = this.#places.get(name);
    if (place) {
      const room = this.#buffer(place.room, T * this.#rooms.get(place.room)!);
      return room.subarray(T * place.offset, T * (place.offset + per));
    }
    return this.#buffer(name, T * per);
  }

  #buffer(key: string, n: number): Float32Array {
    let b = this.#bufs.get(key);
    if (!b || b.length < n) {
      b = new Float32Array(n);
      this.#bufs.set(key, b);
    }
    return b.subarray(0, n);
  }
  /** Bytes held now. */
  bytes(): number {
    let n = 0;
    for (const b of this.#bufs.values()) n += b.byteLength;
    return n;
  }
}

/** One sequence of a forward call. */
export interface SequenceInput {
  state: SequenceState;
  /** Its new tokens (at least one). */
  ids: number[];
  /** Whose logits to return: the last position (default) or every position of `ids`. */
  logits?: "last" | "all";
  /**
   * A verify pass: the state stays where it is, and `record` keeps what advancing it by any
   * prefix of `ids` needs (record.advance). Its ids must fit one pass (`maxTokens`).
   */
  record?: PassRecord;
}

/** How a forward call runs (not what it computes). */
export interface ForwardOptions {
  /**
   * Awaited after each layer, e.g. to give the event loop a turn during a long pass (a
   * server's scheduler does); nothing may touch this model's states meanwhile.
   */
  betweenLayers?: () => Promise<void>;
  /**
   * Checked before each pass and at each layer boundary of a pass (after betweenLayers): once
   * aborted, the call throws {@link ForwardAborted} within one layer. The pass it stops
   * commits nothing (every state is as the passes before it left it), so a pass with a
   * signal keeps a copy of the KDA states it changes until it ends: one sequence's KDA state
   * per sequence of the pass.
   */
  signal?: AbortSignal;
  /**
   * With a signal, whether a stopped pass puts its states back (default true). False for a
   * caller that discards a stopped call's states anyway (a server's cancelled request): it
   * keeps no copy, and a stopped pass leaves its states half-advanced, not to be used again.
   */
  restore?: boolean;
}

/**
 * A forward call stopped by its signal (ForwardOptions.signal). Each state holds exactly the
 * passes that completed before it (its position says how far); the stopped pass left none.
 */
export class ForwardAborted extends Error {
  constructor(readonly layer: number) {
    super(
      layer < 0 ? "forward call aborted before its pass" : `forward pass aborted at layer ${layer}`,
    );
    this.name = "ForwardAborted";
  }
}

/**
 * Copies of the KDA states an abortable pass changes, put back if it stops: the recurrence
 * and the conv update their state in place, layer by layer, and cannot be undone. The
 * copies' buffers are kept for the next abortable pass.
 */
class KdaUndo {
  #spare: KdaState[] = [];
  #kept: { state: KdaState; copy: KdaState }[] = [];

  /** Remembers `state` as it is now (before the pass changes it). */
  keep(state: KdaState): void {
    const copy = this.#spare.pop() ?? {
      S: new Float32Array(state.S.length),
      histQ: new Float32Array(state.histQ.length),
      histK: new Float32Array(state.histK.length),
      histV: new Float32Array(state.histV.length),
    };
    copyKda(copy, state);
    this.#kept.push({ state, copy });
  }

  /** Puts every kept state back (abort) or forgets the copies (commit). */
  end(restore: boolean): void {
    for (const { state, copy } of this.#kept) {
      if (restore) copyKda(state, copy);
      this.#spare.push(copy);
    }
    this.#kept = [];
  }
}

function copyKda(to: KdaState, from: KdaState): void {
  to.S.set(from.S);
  to.histQ.set(from.histQ);
  to.histK.set(from.histK);
  to.histV.set(from.histV);
}

type KdaHistory = "histQ" | "histK" | "histV";

/** A run of one sequence's tokens inside a pass. */
interface Span {
  seq: SequenceInput;
  /** Its tokens [from, to) of seq.ids. */
  from: number;
  to: number;
  /** Where they sit in the pass's token-major buffers. */
  at: number;
}

/** Logits rows a span owes its sequence: all of them, or the sequence's last, or none. */
function rowsOwed(s: Span): number {
  if (s.seq.logits === "all" || s.seq.record) return s.to - s.from;
  return s.to === s.seq.ids.length ? 1 : 0;
}

/** The sources a forward pass reads its bytes from. */
export interface ForwardSources {
  trunk: TrunkSource;
  experts: ExpertSource;
  embed: EmbeddingRows;
  head: HeadVectors;
}

export class Forward {
  readonly #c: K3Config;
  readonly #scratch: Scratch;
  readonly #maps: BlockMap[];
  /** Widened vectors of the blocks the trunk keeps resident. */
  readonly #vectors = new Map<number, LayerVectors>();
  readonly trunk: TrunkSource;
  readonly experts: ExpertSource;
  readonly chunk: number;
  stats: ForwardStats = { expertRequests: 0, expertSeconds: 0 };
  #busy = false;
  readonly #undo = new KdaUndo();
  /** The undo of the running pass, when it may stop. */
  #undoing: KdaUndo | undefined;

  constructor(
    config: K3Config,
    readonly sources: ForwardSources,
    /** Layers this engine runs: fewer than the config's only under --layers. */
    readonly layers = config.numLayers,
    /**
     * Most tokens per pass (the plan's): a pass goes through the model layer by layer, each
     * layer's weights read once for all its tokens; longer calls run as several passes.
     */
    readonly maxTokens = Number.MAX_SAFE_INTEGER,
    /**
     * Tokens computed at a time where a layer works per token group (MLA attention, each
     * routed expert): bounds that scratch, never the reads. At most maxTokens.
     */
    chunk = maxTokens,
  ) {
    this.chunk = Math.max(1, Math.min(chunk, maxTokens));
    this.#c = config;
    this.#scratch = new Scratch(scratchFloats(config, layers), this.chunk);
    this.trunk = sources.trunk;
    this.experts = sources.experts;
    this.#maps = sources.trunk.blocks.map((b) => new BlockMap(b));
  }

  /** Bytes of scratch held now (checked against the plan in tests). */
  scratchBytes(): number {
    return this.#scratch.bytes();
  }

  /**
   * Runs `ids` as the next tokens of `state` and returns the logits of the last one
   * (vocab fp32). The state advances by ids.length positions. More ids than `maxTokens`
   * run as consecutive chunks, which gives the same bytes.
   */
  async forward(state: SequenceState, ids: number[]): Promise<Float32Array> {
    return (await this.forwardMany([{ state, ids }]))[0][0];
  }

  /**
   * Runs several sequences (each state at most once) and returns, per sequence, the logits
   * it asked for: [last] or one row per id. Their tokens share passes of at most `maxTokens`
   * tokens; a sequence longer than the room left continues in the next pass. Every number
   * is the one a solo run of that sequence gives.
   */
  async forwardMany(
    seqs: SequenceInput[],
    options: ForwardOptions = {},
  ): Promise<Float32Array[][]> {
    // The scratch buffers are shared: two calls interleaving at an await would mix them.
    if (this.#busy) {
      throw new Error(
        "forward calls on one model overlap: run them one at a time (a Session does)",
      );
    }
    this.#busy = true;
    try {
      return await this.#forwardMany(seqs, options);
    } finally {
      this.#busy = false;
    }
  }

  async #forwardMany(seqs: SequenceInput[], options: ForwardOptions): Promise<Float32Array[][]> {
    if (seqs.length === 0) throw new Error("forward needs at least one sequence");
    if (new Set(seqs.map((s) => s.state)).size !== seqs.length) {
      throw new Error("a sequence state appears twice in one forward call");
    }
    const V = this.#c.vocabSize;
    for (const s of seqs) {
      if (s.ids.length === 0) throw new Error("forward needs at least one token per sequence");
      const bad = s.ids.find((id) => !Number.isInteger(id) || id < 0 || id >= V);
      if (bad !== undefined) {
        throw runInvalid(`token id outside the vocabulary (0..${V - 1}) in ${s.ids}`);
      }
      if (s.record && s.ids.length > this.maxTokens) {
        throw new Error(
          `a verify pass of ${s.ids.length} positions exceeds the plan's ${this.maxTokens} ` +
            "tokens per pass",
        );
      }
    }
    for (const s of seqs) s.record?.begin(s.state, s.ids);
    const out = new Map<SequenceInput, Float32Array[]>(seqs.map((s) => [s, []]));
    let pass: Span[] = [], used = 0;
    const flush = async () => {
      if (options.signal?.aborted) throw new ForwardAborted(-1);
      if (pass.length) await this.#pass(pass, used, out, options);
      pass = [];
      used = 0;
    };
    for (const seq of seqs) {
      // A verify pass is never split: it goes whole into a pass with room for it.
      if (seq.record && used + seq.ids.length > this.maxTokens) await flush();
      for (let from = 0; from < seq.ids.length;) {
        const to = Math.min(seq.ids.length, from + this.maxTokens - used);
        pass.push({ seq, from, to, at: used });
        used += to - from;
        from = to;
        if (used === this.maxTokens) await flush();
      }
    }
    await flush();
    return seqs.map((s) => out.get(s)!);
  }

  /** One pass of `T` tokens (the spans') through every layer and lm_head. */
  async #pass(
    spans: Span[],
    T: number,
    out: Map<SequenceInput, Float32Array[]>,
    options: ForwardOptions,
  ): Promise<void> {
    const c = this.#c, lib = k3();
    const H = c.hiddenSize;
    this.#undo.end(false); // copies a failed pass left behind
    this.#undoing = options.signal && options.restore !== false ? this.#undo : undefined;
    for (const s of spans) s.seq.state.reserve(s.seq.state.position + s.to - s.from);

    const rows = bankRows(c, this.layers);
    const bank = this.#scratch.get("bank", T);
    let nb = 0;
    const p = this.#scratch.get("p", T);
    const h = this.#scratch.get("h", T);
    const xn = this.#scratch.get("xn", T);

    // The embedding rows of these tokens only, read now; token t is row t of them.
    const ids = spans.flatMap((s) => s.seq.ids.slice(s.from, s.to));
    const embedded = this.sources.embed.read(ids);
    const rowOf = Int32Array.from(ids, (_, t) => t);
    await kernel(T * H, "k3_embed_bf16", p, embedded, rowOf, T, H, T);

    for (let i = 0; i < this.layers; i++) {
      const R = new BlockReader(this.trunk, i, this.#maps[i]);
      await R.start();
      const w = this.#layerVectors(R, i);

      // Attention side: mix the bank (skipped only while it is empty), snapshot at block starts.
      const eps = c.rmsNormEps;
      if (nb > 0) {
        await kernel(nb * T * H, "k3_attn_res", h, bank, nb, rows, p, w.attnResSw, H, eps, T);
      } else h.set(p);
      let fresh = false;
      if (i % c.attnResBlockSize === 0) {
        for (let t = 0; t < T; t++) {
          bank.set(p.subarray(t * H, (t + 1) * H), (t * rows + nb) * H);
        }
        nb++;
        fresh = true;
      }
      await kernel(T * H, "k3_rmsnorm", xn, h, w.inputNorm, H, eps, T);
      const a = w.kda
        ? await this.#kda(spans, R, i, w, xn, T)
        : await this.#mla(spans, R, i, w, xn, T);
      if (fresh) p.set(a);
      else await kernel(T * H, "k3_add", p, a, T * H);

      // FFN side: the bank is never empty here.
      await kernel(nb * T * H, "k3_attn_res", h, bank, nb, rows, p, w.mlpResSw, H, eps, T);
      await kernel(T * H, "k3_rmsnorm", xn, h, w.postAttnNorm, H, eps, T);
      const f = isDenseLayer(c, i) ? await this.#dense(R, xn, T) : await this.#moe(R, i, w, xn, T);
      await kernel(T * H, "k3_add", p, f, T * H);
      R.finish();
      await options.betweenLayers?.();
      if (options.signal?.aborted) this.#abort(i);
    }

    // Output: final mix over the whole bank, then final norm and lm_head on the rows asked
    // for, one read of lm_head for all of them. A pass that owes no row (a prefill chunk)
    // still computes its last one: lm_head is read in the trunk's cyclic order every pass.
    const head = this.sources.head;
    const eps = c.rmsNormEps;
    await kernel(nb * T * H, "k3_attn_res", h, bank, nb, rows, p, head.outputResSw, H, eps, T);
    const owed = spans.map(rowsOwed);
    const asked = spans.flatMap((s, n) =>
      Array.from({ length: owed[n] }, (_, j) => s.at + s.to - s.from - owed[n] + j)
    );
    const tokens = asked.length ? asked : [T - 1];
    const last = this.#scratch.get("last", tokens.length);
    tokens.forEach((t, r) => {
      lib.k3_rmsnorm(last.subarray(r * H), h.subarray(t * H), head.norm, H, c.rmsNormEps, 1);
    });
    const V = c.vocabSize;
    const logits = await this.#lmHead(last, tokens.length);
    // A non-finite logit must never become a token: sampling a NaN row would pick an
    // arbitrary id and the run would go on as if it were an answer. Stop the run, exit 4.
    const bad = logits.findIndex((v) => !Number.isFinite(v));
    if (bad >= 0) throw nonFinite(`lm_head (logit ${bad % V} is ${logits[bad]})`, -1);
    this.#undo.end(false);
    this.#handOut(spans, owed, logits, asked.length > 0, out);
  }

  /** Gives each span its logits rows and advances its state by the tokens the pass took. */
  #handOut(
    spans: Span[],
    owed: number[],
    logits: Float32Array,
    askedAny: boolean,
    out: Map<SequenceInput, Float32Array[]>,
  ): void {
    const V = this.#c.vocabSize;
    const row = (r: number) => logits.subarray(r * V, (r + 1) * V);
    let r = 0;
    spans.forEach((s, n) => {
      const mine = Array.from({ length: owed[n] }, (_, j) => row(r + j));
      r += owed[n];
      out.get(s.seq)!.push(...mine);
      if (s.seq.record) {
        s.seq.record.logits = mine;
        return;
      }
      const state = s.seq.state;
      state.position += s.to - s.from;
      // No spread: a 200k-token prefill overflows the stack as call arguments.
      for (let i = s.from; i < s.to; i++) state.tokens.push(s.seq.ids[i]);
      // The logits after the state's last position, when this pass computed them.
      const own = !askedAny && n === spans.length - 1 ? row(0) : undefined;
      state.lastLogits = mine.at(-1) ?? own;
    });
  }

  /** Stops a pass at the boundary after layer `i`, every KDA state it changed put back. */
  #abort(i: number): never {
    this.#undo.end(true);
    throw new ForwardAborted(i);
  }

  /** A layer's vectors: widened from its first piece, kept when the block is resident. */
  #layerVectors(R: BlockReader, i: number): LayerVectors {
    const kept = this.#vectors.get(i);
    const v = R.vectors();
    if (kept) return kept;
    const w = layerVectors(v);
    if (this.trunk.resident(i)) this.#vectors.set(i, w);
    return w;
  }

  /** logits [R][vocab] = lm_head x[R][H], one row block of lm_head at a time. */
  async #lmHead(x: Float32Array, n: number): Promise<Float32Array> {
    const c = this.#c, V = c.vocabSize;
    const logits = new Float32Array(n * V);
    const R = new BlockReader(this.trunk, this.layers, this.#maps[this.layers]);
    await this.#linear(R, "lmHead", logits, x, c.hiddenSize, n, V);
    R.finish();
    return logits;
  }

  /**
   * y[t][r] = W x[t] for the matrix `role` of the block R reads, row block by row block as
   * each is resident; y's rows are `stride` apart (its row count unless a caller says).
   */
  async #linear(
    R: BlockReader,
    role: string,
    y: Float32Array,
    x: Float32Array,
    cols: number,
    T: number,
    stride: number,
  ): Promise<void> {
    for (const block of R.rowBlocks(role)) {
      if (block.wait) {
        await block.wait;
        continue;
      }
      const { w, row0, rows, coded } = block;
      const out = row0 ? y.subarray(row0) : y;
      const work = rows * cols * T;
      if (coded) {
        const rc = await kernel(work, "k3_matmul_coded_rows", out, w, BigInt(coded), x, T, stride);
        if (rc) {
          const why = Deno.UnsafePointerView.getCString(k3().k3_codec_strerror(rc)!);
          throw runInvalid(
            `${R.map.layout.name} ${role}: the coded chunk of rows ${row0}..${row0 + rows - 1} ` +
              `is refused (${why}): the trunk pack is corrupted; re-run k3 pack`,
          );
        }
        continue;
      }
      if (await kernel(work, "k3_matmul_bf16_rows", out, w, x, rows, cols, T, stride)) {
        throw new Error(`${role}: row block ${row0}+${rows} does not fit a stride of ${stride}`);
      }
    }
  }

  /**
   * Kimi Delta Attention (MODEL.md §4.4): the projections once for all tokens, the conv and the
   * recurrence per sequence on its own state. A verify pass runs them on the record's
   * scratch copies and keeps their inputs, so the kept state is untouched.
   */
  async #kda(
    spans: Span[],
    R: BlockReader,
    i: number,
    w: LayerVectors,
    xn: Float32Array,
    T: number,
  ): Promise<Float32Array> {
    const c = this.#c, kv = w.kda!;
    const H = c.hiddenSize, nh = c.kda.numHeads, d = c.kda.headDim, C = nh * d;
    const K = c.kda.convKernel;
    const raw = this.#scratch.get("kda.raw", T);
    const q = this.#scratch.get("kda.q", T);
    const k = this.#scratch.get("kda.k", T);
    const v = this.#scratch.get("kda.v", T);
    const rows = (a: Float32Array, s: Span, width: number) =>
      a.subarray(s.at * width, (s.at + s.to - s.from) * width);
    for (const s of spans) if (!s.seq.record) this.#undoing?.keep(s.seq.state.kda.get(i)!);
    const conv = async (out: Float32Array, weight: Float32Array, which: KdaHistory) => {
      for (const s of spans) {
        const x = rows(raw, s, C), n = s.to - s.from;
        const hist = s.seq.record
          ? s.seq.record.scratchHistory(i, which, x)
          : s.seq.state.kda.get(i)![which];
        await kernel(n * C, "k3_kda_conv", rows(out, s, C), hist, x, weight, C, K, n);
      }
    };
    await this.#linear(R, "kda.q", raw, xn, H, T, C);
    await conv(q, kv.qConv, "histQ");
    await this.#linear(R, "kda.k", raw, xn, H, T, C);
    await conv(k, kv.kConv, "histK");
    await this.#linear(R, "kda.v", raw, xn, H, T, C);
    await conv(v, kv.vConv, "histV");
    await kernel(T * C, "k3_l2norm_heads", q, nh, d, KDA_L2_EPS, 1 / Math.sqrt(d), T);
    await kernel(T * C, "k3_l2norm_heads", k, nh, d, KDA_L2_EPS, 1, T);

    const fa = this.#scratch.get("kda.fa", T);
    const alpha = this.#scratch.get("kda.alpha", T);
    await this.#linear(R, "kda.fA", fa, xn, H, T, d);
    await this.#linear(R, "kda.fB", raw, fa, d, T, C);
    const lb = c.kda.gateLowerBound;
    await kernel(T * C, "k3_kda_gate", alpha, raw, kv.dtBias, kv.aLog, nh, d, lb, T);
    const beta = this.#scratch.get("kda.beta", T);
    await this.#linear(R, "kda.b", beta, xn, H, T, nh);
    await kernel(T * nh, "k3_sigmoid", beta, beta, T * nh);

    const o = this.#scratch.get("kda.o", T);
    for (const s of spans) {
      const [sk, sv, sa, sb] = [rows(k, s, C), rows(v, s, C), rows(alpha, s, C), rows(beta, s, nh)];
      const S = s.seq.record
        ? s.seq.record.scratchRecurrence(i, sk, sv, sa, sb)
        : s.seq.state.kda.get(i)!.S;
      const n = s.to - s.from, work = n * C * d;
      await kernel(
        work,
        "k3_kda_recurrence",
        rows(o, s, C),
        S,
        rows(q, s, C),
        sk,
        sv,
        sa,
        sb,
        nh,
        d,
        n,
      );
    }
    await this.#linear(R, "gProj", raw, xn, H, T, C);
    await kernel(T * C, "k3_gated_rmsnorm_heads", o, o, kv.oNorm, raw, nh, d, c.rmsNormEps, T);
    const out = this.#scratch.get("attn.out", T);
    await this.#linear(R, "oProj", out, o, C, T, H);
    return out;
  }

  /** Gated MLA over each sequence's latent cache, absorbed form (MODEL.md §4.6). */
  async #mla(
    spans: Span[],
    R: BlockReader,
    i: number,
    w: LayerVectors,
    xn: Float32Array,
    T: number,
  ): Promise<Float32Array> {
    const c = this.#c, lib = k3(), mv = w.mla!;
    const H = c.hiddenSize, nh = c.numHeads, dn = c.qkNopeHeadDim, dr = c.qkRopeHeadDim;
    const dv = c.vHeadDim, rq = c.qLoraRank, rkv = c.kvLoraRank, width = mlaRowWidth(c);

    const cq = this.#scratch.get("mla.cq", T);
    await this.#linear(R, "mla.qA", cq, xn, H, T, rq);
    await kernel(T * rq, "k3_rmsnorm", cq, cq, mv.qANorm, rq, MLA_LOW_RANK_EPS, T);
    const q = this.#scratch.get("mla.q", T);
    await this.#linear(R, "mla.qB", q, cq, rq, T, nh * (dn + dr));

    // New cache rows: [rmsnorm(latent), k_pe] for every token, then into each sequence's
    // cache at its position (a verify pass's rows past what it keeps are never read).
    const fresh = this.#scratch.get("mla.rows", T);
    await this.#linear(R, "mla.kvA", fresh, xn, H, T, width);
    for (let t = 0; t < T; t++) {
      const lat = fresh.subarray(t * width, t * width + rkv);
      lib.k3_rmsnorm(lat, lat, mv.kvANorm, rkv, MLA_LOW_RANK_EPS, 1);
    }

    // Absorb, attend and expand a chunk at a time: each token's numbers are its own, so the
    // chunk bounds the two widest buffers of the layer without changing a byte.
    await R.ready("mla.kvB");
    const kvB = R.whole("mla.kvB");
    const o = this.#scratch.get("mla.o", T);
    const scale = 1 / Math.sqrt(dn + dr), qWidth = nh * (dn + dr);
    for (const s of spans) {
      const n = s.to - s.from, pos = s.seq.state.position, cache = s.seq.state.mla.get(i)!.cache;
      cache.set(fresh.subarray(s.at * width, (s.at + n) * width), pos * width);
      for (let a = 0; a < n; a += this.chunk) {
        const m = Math.min(this.chunk, n - a), t0 = s.at + a;
        const qAbs = this.#scratch.get("mla.qabs", m);
        const qs = q.subarray(t0 * qWidth), heads = m * nh;
        await kernel(heads * dn * rkv, "k3_mla_absorb_q", qAbs, qs, kvB, nh, dn, dr, dv, rkv, m);
        const oLat = this.#scratch.get("mla.olat", m);
        const attend = heads * (pos + a + m) * (2 * rkv + dr);
        if (
          await kernel(attend, "k3_mla_attend", oLat, qAbs, cache, pos + a, m, nh, rkv, dr, scale)
        ) {
          throw overBudget(
            `MLA attention of layer ${i}: no memory for the ${pos + a + m}-score ` +
              "scratch; free memory or shorten the context",
          );
        }
        const os = o.subarray(t0 * nh * dv);
        await kernel(heads * dv * rkv, "k3_mla_expand_o", os, oLat, kvB, nh, dn, dv, rkv, m);
      }
    }
    R.done("mla.kvB");
    const g = this.#scratch.get("mla.g", T);
    await this.#linear(R, "gProj", g, xn, H, T, nh * dv);
    await kernel(T * nh * dv, "k3_mul_sigmoid", o, g, T * nh * dv);
    const out = this.#scratch.get("attn.out", T);
    await this.#linear(R, "oProj", out, o, nh * dv, T, H);
    return out;
  }

  /** SiTU-GLU MLP: down(situ(gate x, up x)), its three matrices under `roles`. */
  async #mlp(
    R: BlockReader,
    prefix: string,
    roles: [string, string, string],
    x: Float32Array,
    inner: number,
    T: number,
  ): Promise<Float32Array> {
    const c = this.#c, H = c.hiddenSize;
    const g = this.#scratch.get(`${prefix}.g`, T);
    const u = this.#scratch.get(`${prefix}.u`, T);
    await this.#linear(R, roles[0], g, x, H, T, inner);
    await this.#linear(R, roles[1], u, x, H, T, inner);
    await kernel(T * inner, "k3_situ_glu", g, g, u, inner, c.situBeta, c.situLinearBeta, T);
    const out = this.#scratch.get(`${prefix}.out`, T);
    await this.#linear(R, roles[2], out, g, inner, T, H);
    return out;
  }

  #dense(R: BlockReader, xn: Float32Array, T: number): Promise<Float32Array> {
    const roles: [string, string, string] = ["dense.gate", "dense.up", "dense.down"];
    return this.#mlp(R, "dense", roles, xn, this.#c.intermediateSize, T);
  }

  /** Stable LatentMoE (MODEL.md §4.8). */
  async #moe(
    R: BlockReader,
    layer: number,
    w: LayerVectors,
    xn: Float32Array,
    T: number,
  ): Promise<Float32Array> {
    const c = this.#c, lib = k3(), mv = w.moe!;
    const H = c.hiddenSize, E = c.numExperts, k = c.topK, L = c.latentSize;

    const logits = this.#scratch.get("moe.logits", T);
    await this.#linear(R, "moe.router", logits, xn, H, T, E);
    const ids = new Int32Array(T * k);
    const weights = this.#scratch.get("moe.weights", T);
    const topk = await kernel(
      T * E,
      "k3_router_topk",
      ids,
      weights,
      logits,
      mv.routerBias,
      E,
      k,
      // MODEL.md §4.8: renormalise only when asked and there is more than one expert to share.
      c.moeRenormalize && k > 1 ? 1 : 0,
      c.routedScalingFactor,
      T,
    );
    if (topk !== 0) throw nonFinite(`the router of layer ${layer}`, topk);

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
    const y = this.#scratch.get("moe.y", T);
    const t0 = performance.now();
    // The misses start reading now (the generator runs to its first yield); the latent
    // projection and the shared experts compute while they arrive.
    const fetched = this.experts.fetch(layer, wanted)[Symbol.asyncIterator]();
    const first = fetched.next();
    // Awaited only after the kernels below, which give the event loop turns: a fetch that
    // fails meanwhile (a read the background loader collected) would be an unhandled
    // rejection, which ends the process. Marked handled here; `await first` still throws it.
    first.catch(() => {});
    const z = this.#scratch.get("moe.z", T);
    await this.#linear(R, "moe.latentDown", z, xn, H, T, L);
    const shared = await this.#mlp(
      R,
      "shared",
      ["moe.sharedGate", "moe.sharedUp", "moe.sharedDown"],
      xn,
      c.numSharedExperts * c.moeIntermediateSize,
      T,
    );
    try {
      for (let r = await first; !r.done; r = await fetched.next()) {
        const ew = bindExpert(r.value), mine = users.get(r.value.id)!;
        // Read once, applied to every token that chose it, a chunk of them at a time.
        for (let a = 0; a < mine.length; a += this.chunk) {
          await this.#runExpert(layer, r.value.id, ew, z, y, mine.slice(a, a + this.chunk));
        }
      }
    } finally {
      await fetched.return?.(undefined);
    }
    this.experts.release(layer);
    this.stats.expertSeconds += (performance.now() - t0) / 1000;

    const acc = this.#scratch.get("moe.acc", T);
    for (let t = 0; t < T; t++) {
      lib.k3_moe_combine(
        acc.subarray(t * L, (t + 1) * L),
        y.subarray(t * k * L, (t + 1) * k * L),
        weights.subarray(t * k, (t + 1) * k),
        k,
        L,
      );
    }
    if (c.latentMoeUseNorm) {
      await kernel(T * L, "k3_rmsnorm", acc, acc, mv.latentNorm, L, c.rmsNormEps, T);
    }
    const routed = this.#scratch.get("moe.routed", T);
    await this.#linear(R, "moe.latentUp", routed, acc, L, T, H);
    await kernel(T * H, "k3_add", routed, shared, T * H);
    return routed;
  }

  /** One expert on the tokens that chose it; outputs go to y[t][j]. */
  async #runExpert(
    layer: number,
    id: number,
    ew: ExpertWeights,
    z: Float32Array,
    y: Float32Array,
    users: { t: number; j: number }[],
  ): Promise<void> {
    const c = this.#c, L = c.latentSize, I = c.moeIntermediateSize, k = c.topK;
    const n = users.length, G = c.quantGroupSize;
    const zin = this.#scratch.get("exp.z", n);
    users.forEach(({ t }, r) => zin.set(z.subarray(t * L, (t + 1) * L), r * L));
    const g = this.#scratch.get("exp.g", n);
    const u = this.#scratch.get("exp.u", n);
    const out = this.#scratch.get("exp.out", n);
    const work = I * L * n;
    const rc = await kernel(work, "k3_matmul_mxfp4", g, ew.w1Packed, ew.w1Scale, zin, I, L, G, n) ||
      await kernel(work, "k3_matmul_mxfp4", u, ew.w3Packed, ew.w3Scale, zin, I, L, G, n);
    await kernel(I * n, "k3_situ_glu", g, g, u, I, c.situBeta, c.situLinearBeta, n);
    const rc2 = rc ||
      await kernel(work, "k3_matmul_mxfp4", out, ew.w2Packed, ew.w2Scale, g, L, I, G, n);
    if (rc2 !== 0) {
      throw runInvalid(
        `expert ${id} of layer ${layer}: ` +
          (rc2 === -1 ? "an E8M0 scale byte is 255 (NaN)" : "unsupported MXFP4 group layout"),
      );
    }
    users.forEach(({ t, j }, r) => y.set(out.subarray(r * L, (r + 1) * L), (t * k + j) * L));
  }
}

/** RUN INVALID for a NaN or Inf that reached a decision (router scores, logits). */
function nonFinite(where: string, code: number): Error {
  return runInvalid(
    code === -2
      ? `${where}: expert count or top-k outside what the router takes`
      : `${where} produced a non-finite value (NaN or Inf): the weights hold a NaN, an Inf ` +
        `or an overflowing scale; check the checkpoint (k3 verify) and re-download it`,
  );
}
