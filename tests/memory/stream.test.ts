/** Streaming under a memory budget: every budget gives the same bytes; refusals and failures. */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import * as path from "node:path";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { NativeBuffer } from "../../ffi/native.ts";
import { FileReader } from "../../lib/io/reader.ts";
import { IoPool } from "../../lib/io/stream.ts";
import { BLOCK_ALIGN, blockLayout, pieceSpan } from "../../lib/layout/block.ts";
import { planTrunk } from "../../lib/memory/plan.ts";
import { trunkBlocks } from "../../lib/memory/sources.ts";
import { ShardTrunkStore } from "../../lib/memory/trunk.ts";
import { runK3, runRecorded, sameBytes, tempDir, tinyModel } from "../support/helpers.ts";

const IDS = "5,17,250,3,99,1000";
const GEN = "5";

/** Runs the tiny model with `flags`; returns the generated ids, logits and stderr. */
function runWith(dir: string, flags: string[], env: Record<string, string> = {}) {
  return runRecorded(dir, IDS, GEN, flags, env);
}

Deno.test("every memory budget gives byte-identical tokens and logits", async () => {
  const dir = await tinyModel({ seed: 3 });
  const resident = await runWith(dir, []);
  assertEquals(resident.record.memory.plan.trunk.ringSlots, 0, "the reference run is resident");
  assertEquals(resident.record.memory.plan.experts.mode, "resident");
  assertEquals(resident.ids.length, Number(GEN));
  const budgets: [string, string[], (rec: any) => void][] = [
    ["0 pinned, 1-slot ring, 1-slot cache", [
      "--pin-layers",
      "0",
      "--ring-slots",
      "1",
      "--cache-slots",
      "1",
    ], (rec) => {
      assertEquals(rec.memory.plan.trunk.pinned, 0);
      assertEquals(rec.memory.plan.trunk.ringSlots, 1);
      assertEquals(rec.memory.plan.experts.slots, 1);
      assertEquals(rec.memory.cache.hits, 0);
      assert(rec.memory.io.expert_reads > 0 && rec.memory.io.trunk_reads > 0);
    }],
    ["partial pin, 2-slot ring, small cache", [
      "--pin-layers",
      "3",
      "--ring-slots",
      "2",
      "--cache-slots",
      "9",
    ], (rec) => {
      assertEquals(rec.memory.plan.trunk.pinned, 3);
      assertEquals(rec.memory.plan.experts.slots, 9);
    }],
    // The ring is a circular byte buffer: small layers read ahead several at a time and
    // wrap around its end, and each must still arrive whole and in order.
    ["0 pinned, 3-slot byte ring, small cache", [
      "--pin-layers",
      "0",
      "--ring-slots",
      "3",
      "--cache-slots",
      "4",
    ], (rec) => {
      assertEquals(rec.memory.plan.trunk.pinned, 0);
      assertEquals(rec.memory.plan.trunk.ringSlots, 3);
      assert(rec.memory.io.trunk_reads > 0);
    }],
    // Pieces of 8 KB: every matrix is cut at row boundaries, lm_head streams in row blocks
    // through the same ring, and read-ahead runs across pieces, layers and forward calls.
    ["8 KB pieces, 2-slot ring, lm_head streamed", [
      "--pin-layers",
      "0",
      "--ring-slots",
      "2",
      "--piece-mb",
      "0.008",
      "--lm-head",
      "stream",
      "--cache-slots",
      "3",
    ], (rec) => {
      const t = rec.memory.plan.trunk;
      assertEquals([t.pinned, t.headResident, t.ringSlots], [0, false, 2]);
      // An 8 KB piece spans at most 3 pages; kv_b (9,600 bytes, never cut) 4 when it sits
      // at its shard offset modulo a page (read from the shards in place).
      assert(t.slotBytes <= 16384, `a slot holds one 8 KB piece or kv_b (${t.slotBytes})`);
      assert(rec.memory.io.trunk_reads > 8 * 30, "many piece reads");
    }],
    // The smallest ring: one page-sized piece at a time, so no read overlaps another piece.
    ["4 KB pieces, 1-slot ring, 2 pinned, lm_head resident", [
      "--pin-layers",
      "2",
      "--ring-slots",
      "1",
      "--piece-mb",
      "0.004096",
      "--lm-head",
      "resident",
      "--cache-slots",
      "1",
    ], (rec) => {
      const t = rec.memory.plan.trunk;
      assertEquals([t.pinned, t.headResident, t.ringSlots], [2, true, 1]);
    }],
    ["trunk resident, large cache", ["--cache-slots", "200"], (rec) => {
      assertEquals(rec.memory.plan.trunk.ringSlots, 0);
      assert(rec.memory.cache.hits > 0, "a cache holding every expert hits on reuse");
    }],
    [
      "decimal GB budgets chosen by the planner",
      ["--trunk-gb", "0.0009", "--cache-gb", "0.0003"],
      (rec) => {
        const t = rec.memory.plan.trunk;
        assert(t.ringSlots >= 1 && t.pinned < 8, `the trunk streams (${JSON.stringify(t)})`);
        assertEquals(rec.memory.plan.experts.mode, "cache");
      },
    ],
  ];
  for (const [name, flags, check] of budgets) {
    const run = await runWith(dir, flags);
    assertEquals(run.ids, resident.ids, name);
    assert(sameBytes(run.logits, resident.logits), `${name}: logits differ`);
    check(run.record);
  }
});

Deno.test("a plan over --memory-max exits 3 before allocating", async () => {
  const dir = await tinyModel({ seed: 3 });
  const r = await runK3(["run", dir, "--ids", IDS, "--gen", GEN, "--memory-max", "0.02"]);
  assertEquals(r.code, 3, r.stderr);
  assert(/shortfall of/.test(r.stderr), r.stderr);
  assert(/--memory-max/.test(r.stderr) && /smaller preset/.test(r.stderr), r.stderr);
  assert(!r.stderr.includes("STEP"), "nothing ran");
  assert(!r.stderr.includes("loading ["), "nothing was loaded");
  // An explicit trunk budget below one ring slot is refused the same way.
  const t = await runK3(["run", dir, "--ids", IDS, "--gen", GEN, "--trunk-gb", "0.00001"]);
  assertEquals(t.code, 3, t.stderr);
  assert(/cannot hold one ring slot/.test(t.stderr), t.stderr);
});

Deno.test("an injected read failure exits 4 with RUN INVALID and prints no later token", async () => {
  const dir = await tinyModel({ seed: 3 });
  const flags = ["--pin-layers", "0", "--ring-slots", "1", "--cache-slots", "1"];
  const good = await runWith(dir, flags);
  const io = good.record.memory.io;
  const poolReads = io.trunk_reads + io.expert_reads;
  // Head reads (5 tensors) come first; fail a pool read well inside the decode.
  const n = 5 + Math.floor(poolReads * 0.6);
  const quiet = ["run", dir, "--ids", IDS, "--gen", GEN, "--ignore-eos", "--quiet", ...flags];
  const clean = await runK3(quiet);
  assertEquals(clean.code, 0, clean.stderr);
  const r = await runK3(quiet, { K3_FAULT_READ: String(n) });
  assertEquals(r.code, 4, r.stderr);
  assert(r.stderr.includes("RUN INVALID"), r.stderr);
  // Streamed output stops at the failure: a strict prefix of the clean run's output.
  assert(
    r.stdout.length < clean.stdout.trimEnd().length,
    `stopped early (${JSON.stringify(r.stdout)})`,
  );
  assert(clean.stdout.startsWith(r.stdout), "only tokens computed before the failure were printed");
  assert(!r.stderr.includes("tokens in"), "no end-of-run report");
});

Deno.test("planTrunk keeps the most bytes resident and rings the largest piece", () => {
  // Blocks of one matrix each, in rows of one page; pieces of 16 rows (16 pages).
  const U = 4096, piece = 16 * U;
  const block = (name: string, rows: number) =>
    blockLayout(name, [{
      role: "m",
      kind: "rows",
      ref: { name, file: "", dtype: "BF16", shape: [rows, U / 2], offset: 0, nbytes: rows * U },
    }], piece);
  const layers = [10, 50, 20, 20, 20].map((r, i) => block(`layer ${i}`, r));
  const head = block("lm_head", 30);
  const plan = (budget: number, force = {}) => planTrunk(layers, head, budget * U, piece, force);
  const t = (pinned: number, headResident: boolean, ringSlots: number, slot: number) => ({
    pinned,
    headResident,
    ringSlots,
    slotBytes: slot * U,
    pieceBytes: piece,
  });
  // Pieces are balanced row blocks: 20 rows -> 2 x 10, 50 -> 4 x 13, lm_head 30 -> 2 x 15.
  assertEquals(plan(1000), t(5, true, 0, 0));
  // 2 pinned (60) + lm_head (30) + 2 slots of 10 keeps 90 resident; 3 pinned alone keeps 80.
  assertEquals(plan(110), t(2, true, 2, 10));
  // Now lm_head and 1 layer (40) lose to 2 layers without it (60, streaming lm_head's 15s).
  assertEquals(plan(100), t(2, false, 2, 15));
  // Two slots never fit; one does.
  assertEquals(plan(20), t(0, false, 1, 15));
  assertEquals(plan(14), null);
  assertEquals(plan(0, { pin: 1, ring: 1 }), t(1, false, 1, 15));
  // A layer larger than the ring still streams: only the piece must fit a slot.
  assert(layers[1].pieces.length === 4 && layers[1].pieces.every((p) => p.end - p.start <= piece));
});

Deno.test("a pack read as small pieces gives the same bytes; --verify-pack checks streamed layers", async () => {
  const dir = await tinyModel({ seed: 3 });
  const trunk = path.join(tempDir(), "trunk");
  // BF16 as it is, so the flipped byte below reaches the SHA-256 check (a coded chunk's own
  // checks may refuse it first: tests/layout/pack_codec.test.ts).
  const p = await runK3(["pack", "--codec", "none", dir, trunk]);
  assertEquals(p.code, 0, p.stderr);
  const resident = await runWith(dir, []);
  // Every layer streamed from the pack in 8 KB spans of its run, lm_head from its shard.
  const pieces = [
    "--trunk",
    trunk,
    "--verify-pack",
    "--pin-layers",
    "0",
    "--ring-slots",
    "2",
    "--piece-mb",
    "0.008",
    "--lm-head",
    "stream",
    "--cache-slots",
    "2",
  ];
  const packed = await runWith(dir, pieces);
  assertEquals(packed.ids, resident.ids);
  assert(sameBytes(packed.logits, resident.logits), "pieces of a pack give the resident bytes");

  // A flipped byte inside a streamed layer's run: its SHA-256, checked at its last piece.
  const index = JSON.parse(await Deno.readTextFile(path.join(trunk, "trunk.json")));
  const bin = path.join(trunk, "trunk.bin");
  const bytes = await Deno.readFile(bin);
  bytes[index.layers[5].offset + 20000] ^= 0x40;
  await Deno.writeFile(bin, bytes);
  const r = await runK3(["run", dir, "--ids", IDS, "--gen", GEN, "--ignore-eos", ...pieces]);
  assertEquals(r.code, 4, r.stderr);
  assert(/RUN INVALID.*layer 5.*SHA-256/.test(r.stderr), r.stderr);
});

/** One read the shard store asked for: where in the file, how much, where it lands. */
interface AskedRead {
  offset: number;
  nbytes: number;
  at: number;
  aligned: boolean;
}

/** The reads ShardTrunkStore queues for piece `p` of `block` (a stand-in pool records them). */
function askedReads(
  block: ReturnType<typeof trunkBlocks>[number],
  parts: typeof block.pieces[number]["parts"],
  spanStart: number,
  room: number,
): AskedRead[] {
  const base = Deno.UnsafePointer.create(1n << 20n)!;
  const asked: AskedRead[] = [];
  const pool = {
    read(_k: number, _f: string, offset: number, nbytes: number, target: {
      dst: Deno.PointerObject;
      aligned: boolean;
    }) {
      const at = Number(Deno.UnsafePointer.value(target.dst) - Deno.UnsafePointer.value(base));
      asked.push({ offset, nbytes, at, aligned: target.aligned });
      return { tickets: [], need: [], what: "", file: "", offset };
    },
  } as unknown as IoPool;
  new ShardTrunkStore().read(pool, block, 0, parts, spanStart, base, room);
  return asked;
}

Deno.test("the trunk from the shards: tensors placed in place are read as page-aligned windows", async () => {
  const ckpt = await openCheckpoint(await tinyModel({ seed: 3 }));
  for (const pieceBytes of [8000, 1 << 20]) {
    const blocks = trunkBlocks(ckpt.refs, pieceBytes, "file");
    let windows = 0;
    for (const block of blocks) {
      block.entries.forEach((e, i) => {
        const expect = e.ref.nbytes >= BLOCK_ALIGN;
        assertEquals(block.inPlace[i], expect, `${e.ref.name} in place`);
        if (expect) assert((block.offsets[i] - e.ref.offset) % BLOCK_ALIGN === 0, e.ref.name);
      });
      for (const piece of block.pieces) {
        const { start, room } = pieceSpan(piece);
        const reads = askedReads(block, piece.parts, start, room);
        assertEquals(reads.length, piece.parts.length);
        piece.parts.forEach((part, k) => {
          const r = reads[k], ref = block.entries[part.entry].ref;
          const rb = ref.nbytes / (ref.shape.length >= 2 ? ref.shape[0] : 1);
          // The payload lands at its block offset, whatever the window adds before it.
          const lead = (ref.offset + part.row0 * rb) - r.offset;
          assertEquals(r.at + lead, block.offsets[part.entry] + part.row0 * rb - start);
          assertEquals(r.nbytes, lead + part.rows * rb);
          if (!block.inPlace[part.entry]) return assertEquals(lead, 0);
          windows++;
          assert(r.aligned && r.offset % BLOCK_ALIGN === 0, `${ref.name}: an O_DIRECT window`);
          assert(r.at + Math.ceil(r.nbytes / BLOCK_ALIGN) * BLOCK_ALIGN <= room);
        });
      }
    }
    assert(windows > 50, `most trunk reads are windows (${windows})`);
    // A whole block read at once joins the row blocks of a cut tensor into one read.
    for (const block of blocks) {
      const all = block.pieces.flatMap((p) => p.parts);
      const tensors = new Set(all.map((p) => p.entry)).size;
      if (pieceBytes === 8000 && block.name === "layer 0") assert(all.length > tensors, "cut");
      assertEquals(askedReads(block, all, 0, block.bytes).length, tensors, block.name);
    }
  }
});

/** Every trunk block of `dir` read whole through ShardTrunkStore: each tensor's bytes, by name. */
async function blockPayloads(dir: string): Promise<Map<string, Uint8Array>> {
  const ckpt = await openCheckpoint(dir);
  const pool = new IoPool(2);
  const out = new Map<string, Uint8Array>();
  try {
    for (const block of trunkBlocks(ckpt.refs, 8000, "file")) {
      const buf = NativeBuffer.alloc(block.bytes);
      try {
        const parts = block.pieces.flatMap((p) => p.parts);
        const reads = new ShardTrunkStore().read(
          pool,
          block,
          0,
          parts,
          0,
          buf.pointer,
          block.bytes,
        );
        for (const r of reads) pool.wait(r);
        block.entries.forEach((e, i) =>
          out.set(e.ref.name, buf.view(block.offsets[i], e.ref.nbytes).slice())
        );
      } finally {
        buf.free();
      }
    }
  } finally {
    pool.close();
  }
  return out;
}

Deno.test("the trunk from shards on tmpfs (no O_DIRECT) and on disk: the tensors' own bytes", {
  ignore: Deno.build.os !== "linux",
}, async () => {
  const dir = await tinyModel({ seed: 3 });
  const shm = Deno.makeTempDirSync({ dir: "/dev/shm", prefix: "k3-test-" });
  try {
    for await (const e of Deno.readDir(dir)) {
      await Deno.copyFile(path.join(dir, e.name), path.join(shm, e.name));
    }
    const ckpt = await openCheckpoint(dir);
    const reader = new FileReader(false);
    const disk = await blockPayloads(dir), tmpfs = await blockPayloads(shm);
    try {
      for (const block of trunkBlocks(ckpt.refs)) {
        for (const { ref } of block.entries) {
          const want = NativeBuffer.alloc(ref.nbytes);
          reader.read(ref.file, ref.offset, ref.nbytes, want.pointer, ref.name);
          const bytes = want.view(0, ref.nbytes).slice();
          want.free();
          assertEquals(disk.get(ref.name), bytes, `${ref.name} from disk`);
          assertEquals(tmpfs.get(ref.name), bytes, `${ref.name} from tmpfs`);
        }
      }
    } finally {
      reader.close();
    }
  } finally {
    Deno.removeSync(shm, { recursive: true });
  }
});
