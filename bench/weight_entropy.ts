/**
 * `deno run -A bench/weight_entropy.ts`: how much a lossless entropy coder could take out of
 * the weights make-tiny writes (a benchmark, not a test). Nothing is written to disk: the
 * tensors are drawn in memory by the generator itself (lib/synth/tiny.ts `tensorChunks`), at
 * K3's true widths, under `--weights uniform` and `--weights normal`.
 *
 * 1. Trunk (BF16): the exponent byte's entropy over every BF16 matrix of one KDA+MoE layer
 *    and one MLA layer, pooled and per tensor (a coder with a table per tensor gets the
 *    latter), and the size an ideal coder of the exponents would leave (sign and mantissa
 *    kept raw): (8 + H) / 16.
 * 2. Experts (MXFP4): the entropy of the 4-bit E2M1 codes, of the code pairs (one stored
 *    byte), and of the E8M0 scale bytes, over --experts experts' three matrices; the saving an
 *    ideal coder could give over the expert bytes.
 * 3. Decode cost: bench/weight_entropy.c (built here with cc) encodes the codes with a
 *    Huffman code of the measured frequencies and times a 12-bit-table decoder, one code a
 *    lookup; the codes/s it reaches, set against the codes/s a disk of --disk-gbps would
 *    deliver uncoded.
 *
 * Each tensor is sampled: its first --sample-mb MB (default 32; the generator's values are
 * i.i.d., so a prefix has the tensor's distribution). Prints a markdown table.
 *
 * Usage: deno run -A bench/weight_entropy.ts [--sample-mb N] [--experts N] [--disk-gbps G]
 */
import * as path from "node:path";
import {
  expertTensors,
  K3,
  layerTrunkTensors,
  type PlannedTensor,
  type SynthShape,
  tensorChunks,
  type Weights,
  withWeights,
} from "../lib/synth/tiny.ts";

const args = Deno.args;
const flag = (name: string, fallback: number) => {
  const i = args.indexOf(name);
  return i >= 0 ? Number(args[i + 1]) || fallback : fallback;
};
const sampleBytes = flag("--sample-mb", 32) * 1e6;
const expertCount = flag("--experts", 4);
const diskGbps = flag("--disk-gbps", 3);
const SEED = 1;

/** K3's true widths; layer 1 is KDA + MoE, layer 3 (1-based 4) MLA + MoE. */
const SHAPE: SynthShape = { ...K3, mlaLayers: [4] };

/** Shannon entropy in bits of a histogram. */
function entropy(hist: ArrayLike<number>): number {
  let n = 0, h = 0;
  for (let i = 0; i < hist.length; i++) n += hist[i];
  for (let i = 0; i < hist.length; i++) {
    if (hist[i] > 0) h -= (hist[i] / n) * Math.log2(hist[i] / n);
  }
  return h;
}

/** The first `limit` bytes of `t` as the generator writes them. */
function sample(t: PlannedTensor, limit: number): Uint8Array {
  const n = Math.min(limit, t.nbytes);
  const out = new Uint8Array(n);
  const buffer = new Uint8Array(Math.min(8 << 20, t.nbytes));
  let at = 0;
  for (const chunk of tensorChunks(t, SEED, buffer)) {
    const take = Math.min(chunk.length, n - at);
    out.set(chunk.subarray(0, take), at);
    at += take;
    if (at >= n) break;
  }
  return out;
}

interface TrunkEntropy {
  pooled: number;
  perTensor: number;
  elements: number;
  tensors: number;
}

/** Exponent-byte entropy of the BF16 matrices of layers 1 and 3 under `weights`. */
function trunkEntropy(weights: Weights): TrunkEntropy {
  const pooled = new Float64Array(256);
  let weighted = 0, elements = 0, tensors = 0;
  for (const layer of [1, 3]) {
    for (const planned of layerTrunkTensors(`model.layers.${layer}.`, layer, SHAPE)) {
      const t = withWeights(planned, weights);
      if (t.dtype !== "BF16" || t.shape.length !== 2 || t.shape[0] === 1) continue;
      const bytes = sample(t, sampleBytes);
      const bf16 = new Uint16Array(bytes.buffer, 0, bytes.length >> 1);
      const hist = new Float64Array(256);
      for (let i = 0; i < bf16.length; i++) hist[(bf16[i] >> 7) & 0xff]++;
      for (let e = 0; e < 256; e++) pooled[e] += hist[e];
      weighted += entropy(hist) * bf16.length;
      elements += bf16.length;
      tensors++;
    }
  }
  return { pooled: entropy(pooled), perTensor: weighted / elements, elements, tensors };
}

interface ExpertEntropy {
  code: number;
  pair: number;
  scale: number;
  codes: Uint8Array;
  codeHist: Float64Array;
  codeBytes: number;
  scaleBytes: number;
  distinctScales: number;
}

/** Code, code-pair and scale entropy of `expertCount` experts of layer 1 under `weights`. */
function expertEntropy(weights: Weights): ExpertEntropy {
  const codeHist = new Float64Array(16), pairHist = new Float64Array(256);
  const scaleHist = new Float64Array(256);
  const kept: Uint8Array[] = [];
  let codeBytes = 0, scaleBytes = 0;
  for (let e = 0; e < expertCount; e++) {
    for (const planned of expertTensors("model.layers.1.", e, SHAPE)) {
      const t = withWeights(planned, weights);
      const bytes = sample(t, t.name.endsWith("weight_scale") ? sampleBytes / 16 : sampleBytes);
      if (t.name.endsWith("weight_scale")) {
        for (const b of bytes) scaleHist[b]++;
        scaleBytes += bytes.length;
        continue;
      }
      const codes = new Uint8Array(2 * bytes.length);
      for (let i = 0; i < bytes.length; i++) {
        pairHist[bytes[i]]++;
        codes[2 * i] = bytes[i] & 15;
        codes[2 * i + 1] = bytes[i] >> 4;
        codeHist[bytes[i] & 15]++;
        codeHist[bytes[i] >> 4]++;
      }
      if (kept.length < 2) kept.push(codes);
      codeBytes += bytes.length;
    }
  }
  const codes = new Uint8Array(kept.reduce((n, k) => n + k.length, 0));
  kept.reduce((at, k) => (codes.set(k, at), at + k.length), 0);
  return {
    code: entropy(codeHist),
    pair: entropy(pairHist) / 2,
    scale: entropy(scaleHist),
    codes,
    codeHist,
    codeBytes,
    scaleBytes,
    distinctScales: scaleHist.filter((x) => x > 0).length,
  };
}

/** Bits per code of a Huffman code, decode ns per code and codes/s (bench/weight_entropy.c). */
async function decodeCost(e: ExpertEntropy): Promise<{ bits: number; ns: number; rate: number }> {
  const dir = await Deno.makeTempDir({ prefix: "k3-entropy-" });
  try {
    const exe = path.join(dir, "decode");
    const src = path.join(import.meta.dirname!, "weight_entropy.c");
    const cc = await new Deno.Command("cc", { args: ["-std=c99", "-O2", "-o", exe, src] })
      .output();
    if (cc.code !== 0) throw new Error(new TextDecoder().decode(cc.stderr));
    const input = new Uint8Array(16 * 8 + 8 + e.codes.length);
    const view = new DataView(input.buffer);
    e.codeHist.forEach((f, i) => view.setFloat64(8 * i, f, true));
    view.setBigInt64(128, BigInt(e.codes.length), true);
    input.set(e.codes, 136);
    const child = new Deno.Command(exe, { stdin: "piped", stdout: "piped" }).spawn();
    const writer = child.stdin.getWriter();
    await writer.write(input);
    await writer.close();
    const out = await child.output();
    if (out.code !== 0) throw new Error(`decoder exited ${out.code}`);
    const [bits, ns, rate] = new TextDecoder().decode(out.stdout).trim().split(" ").map(Number);
    return { bits, ns, rate };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

async function main(): Promise<void> {
  const load = Deno.loadavg().map((x) => x.toFixed(2)).join(" ");
  const f = (x: number, d = 3) => x.toFixed(d);
  const lines = [
    `weight entropy (K3 true widths, first ${sampleBytes / 1e6} MB of each tensor, seed ` +
    `${SEED}; load average ${load})`,
    "",
    "| weights | BF16 exponent entropy, pooled / per tensor (bits of 8) | ideal trunk size " +
    "(x BF16) | E2M1 code entropy (bits of 4) | code-pair entropy per code | E8M0 scale " +
    "entropy (bits of 8), distinct values | ideal expert saving |",
    "|---|---|---|---|---|---|---|",
  ];
  let normal: ExpertEntropy | undefined;
  for (const weights of ["uniform", "normal"] as const) {
    const t = trunkEntropy(weights);
    const e = expertEntropy(weights);
    if (weights === "normal") normal = e;
    const bits = e.codeBytes * 2 * Math.min(e.code, e.pair) + e.scaleBytes * e.scale;
    const saving = 1 - bits / (8 * (e.codeBytes + e.scaleBytes));
    lines.push(
      `| ${weights} | ${f(t.pooled)} / ${f(t.perTensor)} (${t.tensors} tensors, ` +
        `${(t.elements / 1e6).toFixed(0)} M values) | ${f((8 + t.perTensor) / 16)} | ` +
        `${f(e.code)} | ${f(e.pair)} | ${f(e.scale)}, ${e.distinctScales} | ` +
        `${(100 * saving).toFixed(1)}% |`,
    );
  }
  lines.push(
    "",
    "published for trained models (DFloat11, Zhang et al. 2025): BF16 exponent ~2.6 bits of 8, " +
      "coded size ~70% of BF16",
  );
  const d = await decodeCost(normal!);
  // A disk of G GB/s delivers 2G codes (and G/16 scale bytes) per second uncoded.
  const needed = 2 * diskGbps * 1e9;
  lines.push(
    "",
    `decode (normal codes, ${(normal!.codes.length / 1e6).toFixed(1)} M): Huffman ` +
      `${f(d.bits)} bits/code, 12-bit table decoder ${f(d.ns, 2)} ns/code (CPU time) = ` +
      `${(d.rate / 1e9).toFixed(2)} G codes/s on one thread; a ${diskGbps} GB/s disk ` +
      `delivers ${(needed / 1e9).toFixed(1)} G codes/s uncoded ` +
      `(decode / disk rate ${(d.rate / needed).toFixed(2)})`,
  );
  console.log(lines.join("\n"));
}

await main();
