/**
 * The block of a layer: which tensors, in what order, at what aligned offsets, and how it
 * is cut into pieces. Resident layers, pinned layers, the streaming ring and the trunk pack
 * all hold this same layout, so the bytes of a tensor sit at the same block offset
 * wherever they came from.
 *
 * Block order is the order the forward pass consumes a layer: every small vector first
 * (norm gains, AttnRes vectors, conv taps, biases: widened to fp32 once, when the layer
 * starts), then the matrices in the order they are multiplied. A streamed layer can then
 * be read front to back while it computes, and each piece is released as soon as the
 * forward pass is past it.
 *
 * Pieces: a block is cut into pieces of at most `pieceBytes`, at tensor boundaries, and a
 * matrix larger than that at row boundaries (each output row is an independent dot, so a
 * row block computes exactly the rows it holds). A tensor that cannot be cut (a vector, or
 * kv_b, which two kernels read per head) is one piece by itself when it is larger.
 *
 * Sits on the checkpoint's type declarations and dtype sizes only, below everything that
 * moves bytes: the pack, the memory layer and the model.
 */
import { DTYPE_SIZES } from "../checkpoint/safetensors.ts";
import type { ExpertRefs, LayerRefs, TensorRef } from "../checkpoint/types.ts";

/** Offsets inside a block are aligned for SIMD loads. */
const TENSOR_ALIGN = 64;
/** Blocks (and the room of pieces) are whole pages so O_DIRECT can read them. */
export const BLOCK_ALIGN = 4096;

/**
 * The default piece size, 128 MiB: the smallest ring (two pieces) stays near 270 MB, so it
 * fits the 3 GB floor; one piece reads in ~0.15 s at disk speed, so a forward's first wait
 * is short; and the per-piece bookkeeping (a few FFI calls) is far below 0.1% of its read.
 */
export const PIECE_BYTES = 128 * 1024 * 1024;

export function alignUp(n: number, a: number): number {
  return Math.ceil(n / a) * a;
}

function alignDown(n: number, a: number): number {
  return Math.floor(n / a) * a;
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

/**
 * Where a block's tensors sit. `packed`: one after another, 64-aligned (`layoutOf`; the
 * trunk pack stores this). `file`: each large tensor at its file offset modulo a page, on
 * pages of its own, so the enclosing page-aligned window of any of its row ranges can be read
 * with O_DIRECT straight into place: the payload keeps its offset inside the window, and the
 * bytes the window adds before and after land on pages no other tensor uses.
 */
export type Placement = "packed" | "file";

/**
 * Tensors below a page stay packed under `file` placement: their window would be mostly
 * their neighbours' bytes, and their reads are too small to matter.
 */
const IN_PLACE_MIN_BYTES = BLOCK_ALIGN;

/** Offsets of `refs` under `placement`, the block size, and which tensors sit in place. */
export function placeTensors(
  refs: TensorRef[],
  placement: Placement,
): { offsets: number[]; bytes: number; inPlace: boolean[] } {
  if (placement === "packed") return { ...layoutOf(refs), inPlace: refs.map(() => false) };
  const offsets: number[] = [];
  const inPlace: boolean[] = [];
  let at = 0;
  for (const r of refs) {
    // The file offset must suit the dtype, as the packed offsets do (element-aligned views).
    const fits = r.nbytes >= IN_PLACE_MIN_BYTES && r.offset % DTYPE_SIZES[r.dtype] === 0;
    if (fits) {
      at = alignUp(at, BLOCK_ALIGN) + (r.offset % BLOCK_ALIGN);
      offsets.push(at);
      at = alignUp(at + r.nbytes, BLOCK_ALIGN);
    } else {
      at = alignUp(at, TENSOR_ALIGN);
      offsets.push(at);
      at += r.nbytes;
    }
    inPlace.push(fits);
  }
  return { offsets, bytes: alignUp(Math.max(at, 1), BLOCK_ALIGN), inPlace };
}

/**
 * How the model uses a tensor of a block: a vector widened to fp32 when the layer starts, a
 * matrix multiplied row by row (k3_matmul_bf16, so it may be cut at row boundaries), or a
 * matrix a kernel reads whole.
 */
type EntryKind = "vector" | "rows" | "whole";

/** One tensor of a block: the role the model knows it by, and how it is used. */
export interface BlockEntry {
  /** e.g. "inputNorm", "kda.q", "moe.sharedDown", "lmHead". */
  role: string;
  ref: TensorRef;
  kind: EntryKind;
}

/**
 * Rows [row0, row0 + rows) of entry `entry` (a whole tensor: 0 and all its rows). `coded`:
 * the part is a row chunk of a coded matrix, `coded` bytes at block offset `at`, coded alone
 * (csrc/codec.h); else its rows are stored as they are at offsets[entry] + row0 * row bytes.
 */
export interface PiecePart {
  entry: number;
  row0: number;
  rows: number;
  coded?: { at: number; bytes: number };
}

/**
 * The coded row chunks of the matrices of one block, by tensor name: each chunk's coded
 * size, in row order (rows per chunk: {@link codedChunkRows}). A trunk pack records them.
 */
export type CodedSizes = Map<string, number[]>;

/** Row block of the codec's exponent tables (rows per table). */
export const CODEC_BLOCK_ROWS = 64;

/**
 * Rows of the BF16 of a coded chunk, at most: 8 MiB. A chunk is the smallest unit a coded
 * matrix can be cut at, so it bounds the smallest useful piece; at this size the per-chunk
 * header, tables and padding stay below 0.2% of the chunk.
 */
const CODED_CHUNK_BYTES = 8 << 20;

/** Rows per coded chunk of `ref` (a multiple of the table rows; the last chunk shorter). */
export function codedChunkRows(ref: TensorRef): number {
  const rows = tensorRows(ref), per = Math.floor(CODED_CHUNK_BYTES / rowBytes(ref));
  return Math.min(rows, Math.max(CODEC_BLOCK_ROWS, per - (per % CODEC_BLOCK_ROWS)));
}

/**
 * Whether entry `e` is stored coded when its block is coded: the one place that decides.
 * BF16 matrices multiplied row by row are; vectors, F32 tensors and kv_b (read per head by
 * the MLA kernels) stay as they are.
 */
export function isCodedEntry(e: { ref: TensorRef; kind: EntryKind }): boolean {
  return e.kind === "rows" && e.ref.dtype === "BF16" && e.ref.shape.length === 2;
}

/** Bytes [start, end) of the block, holding `parts` in block order. */
interface Piece {
  start: number;
  end: number;
  parts: PiecePart[];
}

/** A block laid out and cut into pieces. */
export interface BlockLayout {
  /** "layer 3", "lm_head": for messages. */
  name: string;
  entries: BlockEntry[];
  /** Block offset of each entry. */
  offsets: number[];
  /** Entry i sits in place (`file` placement): block offset = file offset mod a page. */
  inPlace: boolean[];
  /** Page-aligned size of the whole block. */
  bytes: number;
  pieces: Piece[];
  /** Role -> entry index. */
  roles: Map<string, number>;
}

/** Rows of a tensor as the matmul sees them: its first dimension (1 for a vector). */
function tensorRows(ref: TensorRef): number {
  return ref.shape.length >= 2 ? ref.shape[0] : 1;
}

/** Bytes of one row of `ref`. */
export function rowBytes(ref: TensorRef): number {
  return ref.nbytes / tensorRows(ref);
}

/** The vectors of a layer, then its matrices, both in the order the forward pass uses them. */
function layerEntries(l: LayerRefs): BlockEntry[] {
  const vec = (role: string, ref: TensorRef): BlockEntry => ({ role, ref, kind: "vector" });
  const mat = (role: string, ref: TensorRef): BlockEntry => ({ role, ref, kind: "rows" });
  const vectors: BlockEntry[] = [
    vec("inputNorm", l.inputNorm),
    vec("postAttnNorm", l.postAttnNorm),
    vec("attnRes.norm", l.attnRes.norm),
    vec("attnRes.proj", l.attnRes.proj),
    vec("mlpRes.norm", l.mlpRes.norm),
    vec("mlpRes.proj", l.mlpRes.proj),
  ];
  const matrices: BlockEntry[] = [];
  if (l.kda) {
    const k = l.kda;
    vectors.push(
      vec("kda.qConv", k.qConv),
      vec("kda.kConv", k.kConv),
      vec("kda.vConv", k.vConv),
      vec("kda.aLog", k.aLog),
      vec("kda.dtBias", k.dtBias),
      vec("kda.oNorm", k.oNorm),
    );
    matrices.push(
      mat("kda.q", k.q),
      mat("kda.k", k.k),
      mat("kda.v", k.v),
      mat("kda.fA", k.fA),
      mat("kda.fB", k.fB),
      mat("kda.b", k.b),
    );
  }
  if (l.mla) {
    const m = l.mla;
    vectors.push(vec("mla.qANorm", m.qANorm), vec("mla.kvANorm", m.kvANorm));
    // kv_b is read per head by the absorb and expand kernels: never cut.
    matrices.push(
      mat("mla.qA", m.qA),
      mat("mla.qB", m.qB),
      mat("mla.kvA", m.kvA),
      { role: "mla.kvB", ref: m.kvB, kind: "whole" },
    );
  }
  matrices.push(mat("gProj", l.gProj), mat("oProj", l.oProj));
  if (l.dense) {
    matrices.push(
      mat("dense.gate", l.dense.gate),
      mat("dense.up", l.dense.up),
      mat("dense.down", l.dense.down),
    );
  }
  if (l.moe) {
    const m = l.moe;
    vectors.push(vec("moe.routerBias", m.routerBias), vec("moe.latentNorm", m.latentNorm));
    matrices.push(
      mat("moe.router", m.router),
      mat("moe.latentDown", m.latentDown),
      mat("moe.sharedGate", m.sharedGate),
      mat("moe.sharedUp", m.sharedUp),
      mat("moe.sharedDown", m.sharedDown),
      mat("moe.latentUp", m.latentUp),
    );
  }
  return [...vectors, ...matrices];
}

/** Every non-expert tensor of a layer, in block order. */
export function trunkTensors(l: LayerRefs): TensorRef[] {
  return layerEntries(l).map((e) => e.ref);
}

/** The six tensors of one routed expert, in block order. */
export function expertTensors(e: ExpertRefs): TensorRef[] {
  return [e.w1.packed, e.w1.scale, e.w3.packed, e.w3.scale, e.w2.packed, e.w2.scale];
}

/**
 * Cuts entries laid at `offsets` into pieces of at most `pieceBytes` (see the top comment).
 * A matrix larger than a piece is cut into equal row blocks (the last one shorter), each
 * its own piece; smaller tensors are packed greedily. A single row larger than a piece is
 * still one piece.
 */
function cutPieces(
  entries: BlockEntry[],
  offsets: number[],
  pieceBytes: number,
  chunks: (PiecePart[] | null)[],
): Piece[] {
  const pieces: Piece[] = [];
  let cur: Piece | null = null;
  const close = () => {
    if (cur) pieces.push(cur);
    cur = null;
  };
  entries.forEach((e, i) => {
    const coded = chunks[i];
    if (coded) {
      // Chunks are the units: a large matrix starts a piece, then chunks fill pieces greedily.
      const last = coded[coded.length - 1].coded!;
      if (last.at + last.bytes - offsets[i] > pieceBytes) close();
      for (const part of coded) {
        const end = part.coded!.at + part.coded!.bytes;
        if (cur && end - cur.start > pieceBytes) close();
        cur ??= { start: part.coded!.at, end, parts: [] };
        cur.end = end;
        cur.parts.push(part);
      }
      return;
    }
    const start = offsets[i], end = start + e.ref.nbytes;
    if (e.ref.nbytes > pieceBytes) {
      close();
      const rows = tensorRows(e.ref), rb = rowBytes(e.ref);
      if (e.kind !== "rows" || rows === 1) {
        pieces.push({ start, end, parts: [{ entry: i, row0: 0, rows }] });
        return;
      }
      const blocks = Math.ceil(e.ref.nbytes / pieceBytes);
      const per = Math.max(1, Math.min(Math.floor(pieceBytes / rb), Math.ceil(rows / blocks)));
      for (let r = 0; r < rows; r += per) {
        const n = Math.min(per, rows - r);
        pieces.push({
          start: start + r * rb,
          end: start + (r + n) * rb,
          parts: [{ entry: i, row0: r, rows: n }],
        });
      }
      return;
    }
    if (cur && end - cur.start > pieceBytes) close();
    cur ??= { start, end, parts: [] };
    cur.end = end;
    cur.parts.push({ entry: i, row0: 0, rows: tensorRows(e.ref) });
  });
  close();
  return pieces;
}

/** Lays out `entries` and cuts the block into pieces. */
export function blockLayout(
  name: string,
  entries: BlockEntry[],
  pieceBytes: number,
  placement: Placement = "packed",
  coded?: CodedSizes,
): BlockLayout {
  if (coded) {
    const c = codedPlacement(name, entries, coded);
    return {
      name,
      entries,
      offsets: c.offsets,
      inPlace: entries.map(() => false),
      bytes: c.bytes,
      pieces: cutPieces(entries, c.offsets, pieceBytes, c.chunks),
      roles: new Map(entries.map((e, i) => [e.role, i])),
    };
  }
  const { offsets, bytes, inPlace } = placeTensors(entries.map((e) => e.ref), placement);
  return {
    name,
    entries,
    offsets,
    inPlace,
    bytes,
    pieces: cutPieces(entries, offsets, pieceBytes, entries.map(() => null)),
    roles: new Map(entries.map((e, i) => [e.role, i])),
  };
}

/**
 * The packed layout of a coded block: tensors one after another as {@link layoutOf} lays
 * them, except that a coded matrix is its chunks one after another (each 64-aligned, of the
 * sizes `coded` gives). Chunks hold rows [k * codedChunkRows, ...) each.
 */
function codedPlacement(
  name: string,
  entries: BlockEntry[],
  coded: CodedSizes,
): { offsets: number[]; bytes: number; chunks: (PiecePart[] | null)[] } {
  const offsets: number[] = [], chunks: (PiecePart[] | null)[] = [];
  let at = 0;
  entries.forEach((e, entry) => {
    at = alignUp(at, TENSOR_ALIGN);
    offsets.push(at);
    if (!isCodedEntry(e)) {
      chunks.push(null);
      at += e.ref.nbytes;
      return;
    }
    const sizes = coded.get(e.ref.name);
    const rows = tensorRows(e.ref), per = codedChunkRows(e.ref);
    if (!sizes || sizes.length !== Math.ceil(rows / per)) {
      throw new Error(`${name}: no coded chunk sizes for ${e.ref.name}`);
    }
    chunks.push(sizes.map((bytes, k) => {
      at = alignUp(at, TENSOR_ALIGN);
      const part = {
        entry,
        row0: k * per,
        rows: Math.min(per, rows - k * per),
        coded: { at, bytes },
      };
      at += bytes;
      return part;
    }));
  });
  return { offsets, bytes: alignUp(Math.max(at, 1), BLOCK_ALIGN), chunks };
}

/** The entries of decoder layer `l`'s block, in block order. */
export function layerBlockEntries(l: LayerRefs): BlockEntry[] {
  return layerEntries(l);
}

/** The block of decoder layer `l`; `coded`: its matrices as a coded pack stores them. */
export function layerBlock(
  l: LayerRefs,
  pieceBytes = PIECE_BYTES,
  placement: Placement = "packed",
  coded?: CodedSizes,
): BlockLayout {
  return blockLayout(`layer ${l.index}`, layerEntries(l), pieceBytes, placement, coded);
}

/** The block of lm_head, streamed in row blocks when it is not resident; `coded` as a coded
 * pack stores it. */
export function headBlock(
  lmHead: TensorRef,
  pieceBytes = PIECE_BYTES,
  placement: Placement = "packed",
  coded?: CodedSizes,
): BlockLayout {
  return blockLayout("lm_head", headBlockEntries(lmHead), pieceBytes, placement, coded);
}

/** The one entry of lm_head's block. */
export function headBlockEntries(lmHead: TensorRef): BlockEntry[] {
  return [{ role: "lmHead", ref: lmHead, kind: "rows" }];
}

/** The page-aligned span of a piece: where a read of it starts, and the room it needs. */
export function pieceSpan(p: Piece): { start: number; room: number } {
  const start = alignDown(p.start, BLOCK_ALIGN);
  return { start, room: alignUp(p.end, BLOCK_ALIGN) - start };
}

/** The largest room any piece of `blocks` needs (a ring slot), 0 for none. */
export function largestPieceRoom(blocks: BlockLayout[]): number {
  let room = 0;
  for (const b of blocks) for (const p of b.pieces) room = Math.max(room, pieceSpan(p).room);
  return room;
}
