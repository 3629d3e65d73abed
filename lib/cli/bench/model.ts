/**
 * `k3 bench model`: decode and prefill on a synthetic checkpoint with K3's true widths
 * (a few layers, few experts, all resident), against the bandwidth floor: the weight bytes
 * one decoded token must read, divided by the measured read bandwidth.
 */
import { existsSync } from "node:fs";
import * as path from "node:path";
import { k3Isa, k3Threads } from "../../../ffi/library.ts";
import { generate } from "../../generate/decode.ts";
import { Model } from "../../model/model.ts";
import { makeTiny, planCheckpoint, type TinyOptions } from "../../synth/tiny.ts";
import { streamReadGbps } from "./kernels.ts";

/** What `bench model` measured. */
interface ModelBench {
  layers: number;
  threads: number;
  isa: string;
  streamGbps: number;
  /** Weight bytes one decoded token reads (experts: top-k of them per MoE layer). */
  bytesPerToken: number;
  floorSecondsPerToken: number;
  decodeSecondsPerToken: number;
  prefillTokens: number;
  prefillSecondsPerToken: number;
}

/** Bump when the options below change, so a stale cached checkpoint is not reused. */
const BENCH_MODEL_REVISION = 1;

/** The benchmark checkpoint: K3 widths, `layers` layers (layer 0 dense, MLA last). */
function benchModelOptions(layers: number): TinyOptions {
  return { shape: "k3", layers, experts: 16, seed: 5 };
}

/** Generates the checkpoint under `root` once and returns its folder. */
export async function ensureBenchModel(root: string, layers: number): Promise<string> {
  const dir = path.join(root, `bench-k3-r${BENCH_MODEL_REVISION}-l${layers}`);
  if (!existsSync(path.join(dir, ".complete"))) {
    console.error(`generating the K3-width benchmark model in ${dir} (a few GB, once) ...`);
    await Deno.mkdir(dir, { recursive: true });
    await makeTiny(dir, benchModelOptions(layers));
    await Deno.writeTextFile(path.join(dir, ".complete"), "");
  }
  return dir;
}

/** Weight bytes a decoded token reads: every trunk tensor but the embedding (one row),
 * and topK / experts of the routed experts. */
function bytesPerToken(options: TinyOptions): number {
  const plan = planCheckpoint(options);
  const { topK, experts } = plan.shape;
  let bytes = 0;
  for (const shard of plan.shards) {
    for (const t of shard.tensors) {
      if (t.name.includes("embed_tokens")) continue;
      const routed = t.name.includes(".experts.") && !t.name.includes("shared_experts");
      bytes += routed ? t.nbytes * topK / experts : t.nbytes;
    }
  }
  return bytes;
}

/** Prefill `prefill` tokens, then decode `steps` tokens; medians of the decode steps. */
export async function benchModel(
  dir: string,
  layers: number,
  prefill: number,
  steps: number,
): Promise<ModelBench> {
  const streamGbps = streamReadGbps();
  const model = await Model.open(dir);
  try {
    const prompt = Array.from({ length: prefill }, (_, i) => (i * 37 + 11) % 1000);
    const seconds: number[] = [];
    for await (const s of generate(model, prompt, { maxTokens: steps + 1, stopIds: [] })) {
      seconds.push(s.seconds);
    }
    const decode = seconds.slice(1).sort((a, b) => a - b)[Math.floor(steps / 2)];
    const bytes = bytesPerToken(benchModelOptions(layers));
    return {
      layers,
      threads: k3Threads(),
      isa: k3Isa(),
      streamGbps,
      bytesPerToken: bytes,
      floorSecondsPerToken: bytes / (streamGbps * 1e9),
      decodeSecondsPerToken: decode,
      prefillTokens: prefill,
      prefillSecondsPerToken: seconds[0] / prefill,
    };
  } finally {
    model.close();
  }
}

/** The report lines of a model benchmark. */
export function formatModelBench(b: ModelBench): string {
  const perLayer = (s: number) => `${(1000 * s / b.layers).toFixed(2)} ms`;
  return [
    `model: K3 widths, ${b.layers} layers, 16 experts (top-8), ${b.threads} threads, ${b.isa}`,
    `read bandwidth (measured):     ${b.streamGbps.toFixed(1)} GB/s`,
    `weight bytes per token:        ${(b.bytesPerToken / 1e9).toFixed(3)} GB`,
    `decode per token per layer:    ${perLayer(b.decodeSecondsPerToken)}`,
    `floor per token per layer:     ${perLayer(b.floorSecondsPerToken)}`,
    `decode / floor:                ${
      (b.decodeSecondsPerToken / b.floorSecondsPerToken).toFixed(2)
    }x (goal <= 1.15x)`,
    `prefill T=${b.prefillTokens} per token per layer: ${perLayer(b.prefillSecondsPerToken)}`,
    `prefill tok/s / decode tok/s:  ${
      (b.decodeSecondsPerToken / b.prefillSecondsPerToken).toFixed(1)
    }x (goal >= 8x)`,
  ].join("\n");
}
