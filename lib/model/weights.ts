/**
 * A layer's weights as the kernels take them. Large matrices stay in native memory as
 * stored (BF16, MXFP4) and are passed as pointers; small vectors (norm gains, biases, conv
 * taps, A_log, dt_bias) are widened once to fp32 (exactly) and kept in TypeScript.
 *
 * A layer's non-expert tensors live in one block ("trunk run"), laid out by {@link layoutOf}
 * in the order of {@link trunkTensors}; the same layout is used resident, streamed and packed.
 */
import type { NativeBuffer } from "../../ffi/native.ts";
import type { ExpertRefs, LayerRefs, TensorRef } from "../checkpoint/types.ts";

/** Offsets inside a block are aligned for SIMD loads. */
export const TENSOR_ALIGN = 64;
/** Blocks are whole pages so O_DIRECT can read them. */
export const BLOCK_ALIGN = 4096;

export function alignUp(n: number, a: number): number {
  return Math.ceil(n / a) * a;
}

/** Offsets of `refs` laid one after another, each aligned; total size page-aligned. */
export function layoutOf(refs: TensorRef[]): { offsets: number[]; bytes: number } {
  const offsets: number[] = [];
  let at = 0;
  for (const r of refs) {
    at = alignUp(at, TENSOR_ALIGN);
    offsets.push(at);
    at += r.nbytes;
  }
  return { offsets, bytes: alignUp(Math.max(at, 1), BLOCK_ALIGN) };
}

/** Every non-expert tensor of a layer, in block order. */
export function trunkTensors(l: LayerRefs): TensorRef[] {
  const out: TensorRef[] = [
    l.inputNorm,
    l.postAttnNorm,
    l.attnRes.norm,
    l.attnRes.proj,
    l.mlpRes.norm,
    l.mlpRes.proj,
    l.gProj,
    l.oProj,
  ];
  if (l.kda) out.push(...Object.values(l.kda));
  if (l.mla) out.push(...Object.values(l.mla));
  if (l.dense) out.push(...Object.values(l.dense));
  if (l.moe) {
    const { experts: _experts, ...shared } = l.moe;
    out.push(...Object.values(shared));
  }
  return out;
}

/** The six tensors of one routed expert, in block order. */
export function expertTensors(e: ExpertRefs): TensorRef[] {
  return [e.w1.packed, e.w1.scale, e.w3.packed, e.w3.scale, e.w2.packed, e.w2.scale];
}

/** Widens a BF16 or F32 tensor's bytes to a new Float32Array (exact). */
export function widen(ref: TensorRef, bytes: Uint8Array): Float32Array {
  const n = ref.nbytes / (ref.dtype === "BF16" ? 2 : 4);
  if (ref.dtype === "F32") {
    return new Float32Array(bytes.slice(0, ref.nbytes).buffer);
  }
  if (ref.dtype !== "BF16") throw new Error(`cannot widen ${ref.name} of dtype ${ref.dtype}`);
  const src = new Uint16Array(bytes.slice(0, ref.nbytes).buffer);
  const bits = new Uint32Array(n);
  for (let i = 0; i < n; i++) bits[i] = src[i] << 16;
  return new Float32Array(bits.buffer);
}

/** Where a block's tensors are: pointer and bytes by tensor name. */
class Block {
  #index = new Map<string, number>();
  constructor(readonly buffer: NativeBuffer, refs: TensorRef[], offsets: number[]) {
    refs.forEach((r, i) => this.#index.set(r.name, offsets[i]));
  }
  #offset(r: TensorRef): number {
    const off = this.#index.get(r.name);
    if (off === undefined) throw new Error(`${r.name} is not in this block`);
    return off;
  }
  ptr(r: TensorRef): Deno.PointerObject {
    return this.buffer.at(this.#offset(r));
  }
  f32(r: TensorRef): Float32Array {
    return widen(r, this.buffer.view(this.#offset(r), r.nbytes));
  }
}

/** Folded AttnRes score vector: res_norm.weight * res_proj.weight (exact in fp32). */
export function foldAttnRes(norm: Float32Array, proj: Float32Array): Float32Array {
  const sw = new Float32Array(norm.length);
  for (let i = 0; i < sw.length; i++) sw[i] = norm[i] * proj[i];
  return sw;
}

export interface KdaWeights {
  q: Deno.PointerObject;
  k: Deno.PointerObject;
  v: Deno.PointerObject;
  qConv: Float32Array;
  kConv: Float32Array;
  vConv: Float32Array;
  fA: Deno.PointerObject;
  fB: Deno.PointerObject;
  b: Deno.PointerObject;
  aLog: Float32Array;
  dtBias: Float32Array;
  oNorm: Float32Array;
}

export interface MlaWeights {
  qA: Deno.PointerObject;
  qANorm: Float32Array;
  qB: Deno.PointerObject;
  kvA: Deno.PointerObject;
  kvANorm: Float32Array;
  kvB: Deno.PointerObject;
}

export interface DenseWeights {
  gate: Deno.PointerObject;
  up: Deno.PointerObject;
  down: Deno.PointerObject;
}

export interface MoeWeights {
  router: Deno.PointerObject;
  routerBias: Float32Array;
  latentDown: Deno.PointerObject;
  latentNorm: Float32Array;
  latentUp: Deno.PointerObject;
  sharedGate: Deno.PointerObject;
  sharedUp: Deno.PointerObject;
  sharedDown: Deno.PointerObject;
}

/** One decoder layer's non-expert weights, ready for the kernels. */
export interface LayerWeights {
  index: number;
  kind: "kda" | "mla";
  inputNorm: Float32Array;
  postAttnNorm: Float32Array;
  attnResSw: Float32Array;
  mlpResSw: Float32Array;
  gProj: Deno.PointerObject;
  oProj: Deno.PointerObject;
  kda?: KdaWeights;
  mla?: MlaWeights;
  dense?: DenseWeights;
  moe?: MoeWeights;
}

/** Binds a layer's block (laid out by layoutOf(trunkTensors(l))) to kernel arguments. */
export function bindLayer(l: LayerRefs, buffer: NativeBuffer, offsets: number[]): LayerWeights {
  const b = new Block(buffer, trunkTensors(l), offsets);
  const w: LayerWeights = {
    index: l.index,
    kind: l.kind,
    inputNorm: b.f32(l.inputNorm),
    postAttnNorm: b.f32(l.postAttnNorm),
    attnResSw: foldAttnRes(b.f32(l.attnRes.norm), b.f32(l.attnRes.proj)),
    mlpResSw: foldAttnRes(b.f32(l.mlpRes.norm), b.f32(l.mlpRes.proj)),
    gProj: b.ptr(l.gProj),
    oProj: b.ptr(l.oProj),
  };
  if (l.kda) {
    const r = l.kda;
    w.kda = {
      q: b.ptr(r.q),
      k: b.ptr(r.k),
      v: b.ptr(r.v),
      qConv: b.f32(r.qConv),
      kConv: b.f32(r.kConv),
      vConv: b.f32(r.vConv),
      fA: b.ptr(r.fA),
      fB: b.ptr(r.fB),
      b: b.ptr(r.b),
      aLog: b.f32(r.aLog),
      dtBias: b.f32(r.dtBias),
      oNorm: b.f32(r.oNorm),
    };
  }
  if (l.mla) {
    const r = l.mla;
    w.mla = {
      qA: b.ptr(r.qA),
      qANorm: b.f32(r.qANorm),
      qB: b.ptr(r.qB),
      kvA: b.ptr(r.kvA),
      kvANorm: b.f32(r.kvANorm),
      kvB: b.ptr(r.kvB),
    };
  }
  if (l.dense) {
    w.dense = { gate: b.ptr(l.dense.gate), up: b.ptr(l.dense.up), down: b.ptr(l.dense.down) };
  }
  if (l.moe) {
    const r = l.moe;
    w.moe = {
      router: b.ptr(r.router),
      routerBias: b.f32(r.routerBias),
      latentDown: b.ptr(r.latentDown),
      latentNorm: b.f32(r.latentNorm),
      latentUp: b.ptr(r.latentUp),
      sharedGate: b.ptr(r.sharedGate),
      sharedUp: b.ptr(r.sharedUp),
      sharedDown: b.ptr(r.sharedDown),
    };
  }
  return w;
}

/** One routed expert's MXFP4 weights. */
export interface ExpertWeights {
  w1Packed: Deno.PointerObject;
  w1Scale: Deno.PointerObject;
  w3Packed: Deno.PointerObject;
  w3Scale: Deno.PointerObject;
  w2Packed: Deno.PointerObject;
  w2Scale: Deno.PointerObject;
}

/** Binds an expert block (laid out by layoutOf(expertTensors(e))) at `base` bytes into `buffer`. */
export function bindExpert(buffer: NativeBuffer, base: number, offsets: number[]): ExpertWeights {
  const p = (i: number) => buffer.at(base + offsets[i]);
  return {
    w1Packed: p(0),
    w1Scale: p(1),
    w3Packed: p(2),
    w3Scale: p(3),
    w2Packed: p(4),
    w2Scale: p(5),
  };
}
