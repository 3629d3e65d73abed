/**
 * The coded trunk pack: the same tokens and logits as the uncoded one at several budgets, its
 * index checked field by field at open, and a tampered coded chunk refused, never multiplied.
 */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import * as path from "node:path";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import type { TensorRef } from "../../lib/checkpoint/types.ts";
import { blockLayout, codedChunkRows, type CodedSizes, pieceSpan } from "../../lib/layout/block.ts";
import { checkPackIndex, codedSizeRange } from "../../lib/layout/pack.ts";
import { runK3, sameBytes, tempDir, tinyModel } from "../support/helpers.ts";

const RUN = ["--ids", "9,40,301,7", "--gen", "4", "--ignore-eos"];

/** Budgets from all resident to everything streamed in the smallest pieces. */
const BUDGETS = [
  [],
  ["--pin-layers", "2", "--ring-slots", "1", "--cache-slots", "3"],
  ["--pin-layers", "0", "--ring-slots", "1", "--piece-mb", "0.004096", "--lm-head", "stream"],
];

async function runOf(args: string[]): Promise<{ logits: Float32Array; stdout: string }> {
  const file = path.join(tempDir(), "l.bin");
  const r = await runK3([...args, ...RUN, "--dump-logits", file]);
  assertEquals(r.code, 0, r.stderr);
  return { logits: new Float32Array((await Deno.readFile(file)).buffer), stdout: r.stdout };
}

async function pack(model: string, codec?: string): Promise<string> {
  const trunk = path.join(tempDir(), "trunk");
  const r = await runK3(["pack", ...(codec ? ["--codec", codec] : []), model, trunk]);
  assertEquals(r.code, 0, r.stderr);
  return trunk;
}

for (const weights of ["uniform", "normal"] as const) {
  Deno.test(`a coded pack (${weights} weights) gives the tokens and logits of the uncoded one at three budgets`, async () => {
    const model = await tinyModel({ seed: 5, weights });
    const coded = await pack(model), raw = await pack(model, "none");
    const index = JSON.parse(await Deno.readTextFile(path.join(coded, "trunk.json")));
    assertEquals(index.codec, "k3c1", "k3 pack codes by default");
    const rawSize = (await Deno.stat(path.join(raw, "trunk.bin"))).size;
    const codedSize = (await Deno.stat(path.join(coded, "trunk.bin"))).size;
    // Tiny matrices carry the per-chunk header and padding; trunk-size ones code to ~0.70.
    // The coded pack holds lm_head too: compare the layers.
    const layers = codedSize - index.head.bytes;
    assert(layers < 0.8 * rawSize, `coded layers ${layers} bytes against ${rawSize}`);
    const want = await runOf(["run", model]);
    for (const budget of BUDGETS) {
      for (const trunk of [coded, raw]) {
        const got = await runOf(["run", model, "--trunk", trunk, "--verify-pack", ...budget]);
        assert(sameBytes(got.logits, want.logits), `${trunk} ${budget.join(" ")}: logits differ`);
        assertEquals(got.stdout, want.stdout, `${trunk} ${budget.join(" ")}: tokens differ`);
      }
    }
  });
}

Deno.test("a pack made before the codec (no codec field) still opens and runs", async () => {
  const model = await tinyModel({ seed: 5 });
  const raw = await pack(model, "none");
  const index = JSON.parse(await Deno.readTextFile(path.join(raw, "trunk.json")));
  assertEquals("codec" in index, false, "--codec none writes today's index");
  const a = await runOf(["run", model, "--trunk", raw, "--pin-layers", "1", "--ring-slots", "1"]);
  const b = await runOf(["run", model]);
  assert(sameBytes(a.logits, b.logits));
  // Packing again with the other codec is not "up to date": it packs again.
  const again = await runK3(["pack", model, raw]);
  assertEquals(again.code, 0, again.stderr);
  assert(/packing again: .*codec none, not k3c1/.test(again.stderr), again.stderr);
  const now = JSON.parse(await Deno.readTextFile(path.join(raw, "trunk.json")));
  assertEquals(now.codec, "k3c1");
  const bad = await runK3(["pack", "--codec", "zstd", model, raw]);
  assertEquals(bad.code, 2, bad.stderr);
  assert(/--codec zstd: not one of none, k3c1/.test(bad.stderr), bad.stderr);
});

/** Where the first coded chunk of layer `l` sits in trunk.bin, and its tensor's entry. */
function firstChunk(index: any, l: number): { at: number; name: string } {
  const t = index.layers[l].tensors.find((t: any) => t.chunks);
  return { at: index.layers[l].offset + t.offset, name: t.name };
}

Deno.test("a tampered coded chunk is refused when read (exit 4, named), never multiplied", async () => {
  const model = await tinyModel({ seed: 5, weights: "normal" });
  const trunk = await pack(model);
  const index = JSON.parse(await Deno.readTextFile(path.join(trunk, "trunk.json")));
  const bin = path.join(trunk, "trunk.bin");
  const good = await Deno.readFile(bin);
  const { at, name } = firstChunk(index, 1);
  const headAt = index.head.offset + index.head.tensors[0].offset;
  const cases: [string, (b: Uint8Array) => void, RegExp][] = [
    [
      "rows in the header",
      (b) => b[at + 4] ^= 1,
      /layer 1: the coded chunk of .* has a bad header/,
    ],
    ["cols in the header", (b) => b[at + 8] ^= 0x40, /bad header/],
    ["the magic", (b) => b[at] ^= 0xff, /bad header/],
    // Two codes naming one exponent: the kernel's own check refuses the table.
    ["a table entry", (b) => b[at + 33] = b[at + 32], /layer 1 .*coded chunk of rows .* refused/],
    ["lm_head's rows", (b) => b[headAt + 4] ^= 2, /lm_head: the coded chunk of .* bad header/],
  ];
  for (const [what, tamper, says] of cases) {
    const bad = good.slice();
    tamper(bad);
    await Deno.writeFile(bin, bad);
    for (const budget of [BUDGETS[0], BUDGETS[2]]) {
      const r = await runK3(["run", model, "--trunk", trunk, ...budget, ...RUN]);
      assertEquals(r.code, 4, `${what}: ${r.stderr}`);
      assert(says.test(r.stderr) && /RUN INVALID/.test(r.stderr), `${what}: ${r.stderr}`);
      assert(!/\n\s+at /.test(r.stderr), `${what}: no stack trace`);
    }
  }
  assert(name.length > 0);
  // A flipped mantissa bit decodes to another valid matrix: the layer's SHA-256 finds it.
  const bad = good.slice();
  bad[at + 2000] ^= 1;
  await Deno.writeFile(bin, bad);
  const r = await runK3(["run", model, "--trunk", trunk, "--verify-pack", ...RUN]);
  assertEquals(r.code, 4, r.stderr);
  assert(/RUN INVALID.*layer 1.*SHA-256/.test(r.stderr), r.stderr);
});

Deno.test("a tampered coded index is refused at open, naming the field", async () => {
  const model = await tinyModel({ seed: 5, weights: "normal" });
  const trunk = await pack(model);
  const json = path.join(trunk, "trunk.json");
  const good = JSON.parse(await Deno.readTextFile(json));
  const ckpt = await openCheckpoint(model);
  const chunked = (ix: any) => ix.layers[0].tensors.find((t: any) => t.chunks);
  const cases: [string, (ix: any) => void, RegExp][] = [
    ["codec unknown", (ix) => ix.codec = "zstd", /codec is "zstd", not one of none, k3c1/],
    ["block rows", (ix) => ix.block_rows = 32, /block_rows is 32, not 64/],
    ["block rows on none", (ix) => ix.codec = "none", /block_rows is 64, not absent/],
    ["chunks missing", (ix) => delete chunked(ix).chunks, /tensors\[.*\]\.chunks is undefined/],
    ["a chunk more", (ix) => chunked(ix).chunks.push(4096), /chunks is .*not a list of 1/],
    ["size not /8", (ix) => chunked(ix).chunks[0] += 4, /chunks\[0\] is \d+, not a coded size/],
    ["size too small", (ix) => chunked(ix).chunks[0] = 8, /chunks\[0\] is 8/],
    ["size huge", (ix) => chunked(ix).chunks[0] = 2 ** 40, /chunks\[0\]/],
    ["size negative", (ix) => chunked(ix).chunks[0] = -8, /chunks\[0\]/],
    ["size a string", (ix) => chunked(ix).chunks[0] = "8", /chunks\[0\]/],
    ["offset moved", (ix) => chunked(ix).offset += 64, /layers\[0\]\.tensors do not match/],
    ["head missing", (ix) => delete ix.head, /head is undefined, not lm_head's run/],
    ["head offset", (ix) => ix.head.offset += 4096, /head\.offset is \d+, but the previous run/],
    ["head index", (ix) => ix.head.index = 0, /head\.index is 0/],
    ["head chunk", (ix) => ix.head.tensors[0].chunks[0] = 16, /head\.tensors\[.*\]\.chunks\[0\]/],
    [
      "head on none",
      (ix) => (ix.codec = "none", delete ix.block_rows),
      /head is there, but codec is none/,
    ],
  ];
  for (const [what, tamper, says] of cases) {
    const index = structuredClone(good);
    tamper(index);
    assert.throws(
      () =>
        checkPackIndex(
          index,
          ckpt.refs.layers,
          ckpt.refs.lmHead,
          good.total_bytes,
          json,
          "re-run k3 pack",
        ),
      (e: any) => e.exitCode === 2 && says.test(e.message),
      what,
    );
  }
  checkPackIndex(good, ckpt.refs.layers, ckpt.refs.lmHead, good.total_bytes, json, "");
  // A chunk size changed within its range and the layer's padding: the index is consistent,
  // so the chunk's own header (its size) refuses it when it is read (exit 4, named).
  const index = structuredClone(good);
  chunked(index).chunks[0] += 8;
  await Deno.writeTextFile(json, JSON.stringify(index));
  const r = await runK3(["run", model, "--trunk", trunk, ...RUN]);
  assertEquals(r.code, 4, r.stderr);
  assert(/RUN INVALID: layer 0: the coded chunk of .* has a bad header/.test(r.stderr), r.stderr);
});

Deno.test("a coded matrix is cut into pieces at its chunks, which cover its rows in order", () => {
  const ref = (name: string, rows: number, cols: number): TensorRef => ({
    name,
    file: "x",
    offset: 0,
    nbytes: rows * cols * 2,
    dtype: "BF16",
    shape: [rows, cols],
  });
  const big = ref("big", 5000, 7168), small = ref("small", 96, 64);
  const per = codedChunkRows(big);
  assertEquals(per % 64, 0);
  assert(per * 7168 * 2 <= 8 << 20, "a chunk's BF16 is at most 8 MiB");
  const chunks = Math.ceil(5000 / per);
  const sizes: CodedSizes = new Map([
    [
      "big",
      Array.from({ length: chunks }, (_, k) => {
        const rows = Math.min(per, 5000 - k * per);
        return codedSizeRange(rows, 7168)[0] + 8 * k;
      }),
    ],
    ["small", [codedSizeRange(96, 64)[1]]],
  ]);
  const entries = [
    { role: "small", ref: small, kind: "rows" as const },
    { role: "big", ref: big, kind: "rows" as const },
  ];
  const pieceBytes = 12 << 20;
  const b = blockLayout("test", entries, pieceBytes, "packed", sizes);
  const parts = b.pieces.flatMap((p) => p.parts);
  assertEquals(parts.length, 1 + chunks);
  let row = 0, end = 0;
  for (const p of parts.filter((p) => p.entry === 1)) {
    assertEquals(p.row0, row);
    assertEquals(p.coded!.at % 64, 0);
    assert(p.coded!.at >= end, "chunks do not overlap");
    end = p.coded!.at + p.coded!.bytes;
    row += p.rows;
  }
  assertEquals(row, 5000);
  assert(b.bytes >= end && b.bytes % 4096 === 0);
  for (const p of b.pieces) {
    assert(p.end - p.start <= pieceBytes || p.parts.length === 1, "pieces keep to their size");
    assert(pieceSpan(p).room >= p.end - p.start);
  }
  assert(b.pieces.length >= 2, "the large matrix spans several pieces");
  // A layout whose sizes do not fit the chunk count is refused.
  assert.throws(
    () => blockLayout("test", entries, pieceBytes, "packed", new Map([...sizes, ["big", [1]]])),
    /no coded chunk sizes for big/,
  );
});
