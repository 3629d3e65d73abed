/**
 * The memory plans of a checkpoint's presets with its trunk packed as BF16 (`--codec none`)
 * and coded (`k3c1`), side by side: layers pinned, lm_head, trunk bytes.
 *
 *   deno run -A bench/codec_plan.ts MODEL_DIR [PRESET...]     (default: laptop desktop)
 *
 * The coded sizes are those of normal weights (std 1/sqrt(fan-in), as trained weights are
 * distributed) at the checkpoint's shapes, not of its own data: the full-size layout
 * (`make-tiny --shape full --data none`) is holes, whose zeros code smaller than any trained
 * matrix would. Each distinct chunk shape is coded once from such weights and that size is
 * used for every chunk of that shape (a chunk's size varies by its escapes only, a few bytes
 * per thousand weights).
 */
import { k3 } from "../ffi/library.ts";
import { openCheckpoint } from "../lib/checkpoint/checkpoint.ts";
import { tryPlanFor } from "../lib/engine/open.ts";
import {
  CODEC_BLOCK_ROWS,
  codedChunkRows,
  type CodedSizes,
  isCodedEntry,
  layerBlockEntries,
} from "../lib/layout/block.ts";
import { formatBytes } from "../lib/io/sizes.ts";
import { trunkBlocks } from "../lib/memory/sources.ts";
import { fillBf16Normal, XorShift128 } from "../lib/synth/numerics.ts";

/** Coded size of a rows x cols chunk of normal weights (std 1/sqrt(cols)), memoized. */
const sizes = new Map<string, number>();
function normalCodedSize(rows: number, cols: number): number {
  const key = `${rows}x${cols}`;
  let size = sizes.get(key);
  if (size === undefined) {
    const w = new Uint16Array(rows * cols);
    fillBf16Normal(new XorShift128(rows * 7919 + cols), w, 1 / Math.sqrt(cols));
    const lib = k3(), bound = Number(lib.k3_codec_bound(rows, cols, CODEC_BLOCK_ROWS));
    const dst = new Uint8Array(bound);
    size = Number(lib.k3_codec_encode(dst, BigInt(bound), w, rows, cols, CODEC_BLOCK_ROWS));
    if (size < 0) throw new Error(`k3_codec_encode ${key}: ${size}`);
    sizes.set(key, size);
  }
  return size;
}

const [dir, ...presets] = Deno.args;
if (!dir) throw new Error("usage: bench/codec_plan.ts MODEL_DIR [PRESET...]");
const ckpt = await openCheckpoint(dir);
let bf16 = 0, coded = 0;
const perLayer: CodedSizes[] = ckpt.refs.layers.map((l) => {
  const out: CodedSizes = new Map();
  for (const e of layerBlockEntries(l)) {
    if (!isCodedEntry(e)) continue;
    const [rows, cols] = e.ref.shape, per = codedChunkRows(e.ref);
    const chunks: number[] = [];
    for (let r = 0; r < rows; r += per) chunks.push(normalCodedSize(Math.min(per, rows - r), cols));
    out.set(e.ref.name, chunks);
    bf16 += e.ref.nbytes;
    coded += chunks.reduce((a, b) => a + b, 0);
  }
  return out;
});
// lm_head, which a coded pack holds too.
const head = ckpt.refs.lmHead, headPer = codedChunkRows(head), headChunks: number[] = [];
for (let r = 0; r < head.shape[0]; r += headPer) {
  headChunks.push(normalCodedSize(Math.min(headPer, head.shape[0] - r), head.shape[1]));
}
perLayer.push(new Map([[head.name, headChunks]]));
bf16 += head.nbytes;
coded += headChunks.reduce((a, b) => a + b, 0);
console.log(
  `${dir}: ${ckpt.refs.layers.length} layers; coded matrices ${formatBytes(coded)} of ` +
    `${formatBytes(bf16)} BF16 with lm_head (${
      (coded / bf16).toFixed(4)
    }x, normal weights at these shapes)`,
);
function sizesOf(codec: string): CodedSizes[] | undefined {
  return codec === "none" ? undefined : perLayer;
}
for (const preset of presets.length ? presets : ["laptop", "desktop"]) {
  for (const codec of ["none", "k3c1"]) {
    const r = tryPlanFor(
      ckpt,
      { preset, trunkPack: "(pack)", stoppable: true },
      0,
      sizesOf(codec),
    );
    const t = r.plan.trunk;
    // The trunk bytes a token reads: every block that is not resident.
    const blocks = trunkBlocks(ckpt.refs, t.pieceBytes, "packed", sizesOf(codec));
    const last = blocks.length - 1;
    const streamed = blocks.reduce(
      (a, b, i) => a + (i < t.pinned || (i === last && t.headResident) ? 0 : b.bytes),
      0,
    );
    const pinnedBytes = r.plan.items.find((i) => i.name === "trunk pinned")?.bytes ?? 0;
    console.log(
      `  ${preset.padEnd(8)} --codec ${
        codec.padEnd(5)
      } pinned ${t.pinned}/${ckpt.refs.layers.length} ` +
        `(${formatBytes(pinnedBytes)}), lm_head ${t.headResident ? "resident" : "streamed"}, ` +
        `ring ${t.ringSlots} x ${formatBytes(t.slotBytes)}, total ${formatBytes(r.plan.total)}, ` +
        `trunk read per token ${formatBytes(streamed)}` +
        (r.refusal ? ` (refused: ${r.refusal.message.split("\n")[0]})` : ""),
    );
  }
}
