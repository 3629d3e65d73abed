/** The trunk pack: byte-exact round trip, resume, and refusal of stale or corrupted packs. */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import * as path from "node:path";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { layoutOf, trunkTensors } from "../../lib/layout/block.ts";
import { writeSparse } from "../../lib/layout/pack.ts";
import { runK3, sameBytes, tempDir, tinyModel } from "../support/helpers.ts";

const RUN = ["--ids", "9,40,301,7", "--gen", "4", "--ignore-eos"];

async function logitsOf(args: string[]): Promise<Float32Array> {
  const file = path.join(tempDir(), "l.bin");
  const r = await runK3([...args, ...RUN, "--dump-logits", file]);
  assertEquals(r.code, 0, r.stderr);
  return new Float32Array((await Deno.readFile(file)).buffer);
}

/** A private copy of a tiny model (tests below touch and corrupt files). */
async function modelCopy(): Promise<string> {
  const src = await tinyModel({ seed: 5 });
  const dst = path.join(tempDir(), "model");
  await Deno.mkdir(dst);
  for await (const e of Deno.readDir(src)) {
    await Deno.copyFile(path.join(src, e.name), path.join(dst, e.name));
  }
  return dst;
}

Deno.test("pack round trip (--codec none): every run is the shards' tensors, and a packed run equals an unpacked one", async () => {
  const model = await tinyModel({ seed: 5 });
  const trunk = path.join(tempDir(), "trunk");
  const p = await runK3(["pack", "--codec", "none", model, trunk]);
  assertEquals(p.code, 0, p.stderr);
  assert(/GB\/s/.test(p.stderr), "the progress line shows GB/s");

  // Independent check: each tensor's bytes in trunk.bin equal its bytes in the shard.
  const index = JSON.parse(await Deno.readTextFile(path.join(trunk, "trunk.json")));
  const bin = await Deno.readFile(path.join(trunk, "trunk.bin"));
  const ckpt = await openCheckpoint(model);
  for (const l of ckpt.refs.layers) {
    const run = index.layers[l.index];
    assertEquals(run.offset % 4096, 0);
    const refs = trunkTensors(l);
    const { offsets } = layoutOf(refs);
    for (const [j, r] of refs.entries()) {
      const f = await Deno.open(r.file);
      const want = new Uint8Array(r.nbytes);
      await f.seek(r.offset, Deno.SeekMode.Start);
      let got = 0;
      while (got < r.nbytes) got += (await f.read(want.subarray(got)))!;
      f.close();
      const at = run.offset + offsets[j];
      assert(bin.subarray(at, at + r.nbytes).every((b, k) => b === want[k]), `${r.name} packed`);
    }
  }

  const unpacked = await logitsOf(["run", model]);
  const packed = await logitsOf([
    "run",
    model,
    "--trunk",
    trunk,
    "--verify-pack",
    "--pin-layers",
    "2",
    "--ring-slots",
    "1",
    "--cache-slots",
    "3",
  ]);
  assert(sameBytes(packed, unpacked), "packed logits differ from unpacked");
  const resident = await logitsOf(["run", model, "--trunk", trunk]);
  assert(sameBytes(resident, unpacked), "a resident run from the pack differs");
});

Deno.test("an interrupted pack resumes from the last completed layer", async () => {
  const model = await tinyModel({ seed: 5 });
  const fresh = path.join(tempDir(), "fresh"), resumed = path.join(tempDir(), "resumed");
  assertEquals((await runK3(["pack", model, fresh])).code, 0);
  const cut = await runK3(["pack", model, resumed], { K3_PACK_STOP_AFTER: "3" });
  assert(cut.code !== 0, "the first pack was interrupted");
  assert(
    !(await Deno.stat(path.join(resumed, "trunk.json")).catch(() => null)),
    "no trunk.json yet",
  );
  const again = await runK3(["pack", model, resumed]);
  assertEquals(again.code, 0, again.stderr);
  assert(again.stderr.includes("resumed at layer 3"), again.stderr);
  const a = await Deno.readFile(path.join(fresh, "trunk.bin"));
  const b = await Deno.readFile(path.join(resumed, "trunk.bin"));
  assert(
    a.length === b.length && a.every((x, i) => x === b[i]),
    "resumed trunk.bin equals a fresh one",
  );
});

Deno.test("a stale, truncated or corrupted pack is refused", async () => {
  const model = await modelCopy();
  const trunk = path.join(tempDir(), "trunk");
  assertEquals((await runK3(["pack", model, trunk])).code, 0);
  const index = JSON.parse(await Deno.readTextFile(path.join(trunk, "trunk.json")));
  const bin = path.join(trunk, "trunk.bin");

  // Corrupted bytes in layer 2: the hash check of --verify-pack stops the run (exit 4).
  const good = await Deno.readFile(bin);
  const bad = good.slice();
  bad[index.layers[2].offset + 100] ^= 0xff;
  await Deno.writeFile(bin, bad);
  const corrupt = await runK3(["run", model, "--trunk", trunk, "--verify-pack", ...RUN]);
  assertEquals(corrupt.code, 4, corrupt.stderr);
  assert(/RUN INVALID.*layer 2.*SHA-256/.test(corrupt.stderr), corrupt.stderr);

  // Truncated: refused at load (exit 2).
  await Deno.writeFile(bin, good.subarray(0, good.length - 4096));
  const short = await runK3(["run", model, "--trunk", trunk, ...RUN]);
  assertEquals(short.code, 2, short.stderr);
  assert(/incomplete/.test(short.stderr), short.stderr);
  await Deno.writeFile(bin, good);

  // A source shard touched after packing: stale (exit 2).
  const shard = index.shards[0].file;
  await Deno.utime(path.join(model, shard), new Date(), new Date(Date.now() + 5000));
  const stale = await runK3(["run", model, "--trunk", trunk, ...RUN]);
  assertEquals(stale.code, 2, stale.stderr);
  assert(stale.stderr.includes("stale") && stale.stderr.includes(shard), stale.stderr);
});

Deno.test("a tampered trunk.json is refused at open, naming the field (never a heap overflow)", async () => {
  const model = await tinyModel({ seed: 5 });
  const trunk = path.join(tempDir(), "trunk");
  assertEquals((await runK3(["pack", model, trunk])).code, 0);
  const json = path.join(trunk, "trunk.json");
  const good = JSON.parse(await Deno.readTextFile(json));
  const total = good.total_bytes as number;
  const ckpt = await openCheckpoint(model);
  const streamed = ["--pin-layers", "0", "--ring-slots", "1"];

  // Layer bytes past the block, end to end: unchecked, each was a heap overflow (SIGSEGV, a
  // glibc abort) or a silent overwrite of the next ring slot with exit 0.
  for (const bytes of [total, 2 * good.layers[0].bytes]) {
    const index = structuredClone(good);
    index.layers[0].bytes = bytes;
    await Deno.writeTextFile(json, JSON.stringify(index));
    for (const extra of [[], ["--verify-pack"]]) {
      const r = await runK3(["run", model, "--trunk", trunk, ...streamed, ...extra, ...RUN]);
      assertEquals(r.code, 2, r.stderr);
      assert(
        /^k3: .*trunk\.json: layers\[0\]\.bytes is \d+, but layer 0's block is/m.test(r.stderr),
        r.stderr,
      );
    }
  }

  // Every other tampering, checked in process (the same code the CLI runs).
  const { checkPackIndex } = await import("../../lib/layout/pack.ts");
  const cases: [string, (ix: any) => void, RegExp][] = [
    [
      "offset at another layer",
      (ix) => ix.layers[1].offset = ix.layers[0].offset,
      /layers\[1\]\.offset/,
    ],
    ["bytes 0", (ix) => ix.layers[2].bytes = 0, /layers\[2\]\.bytes is 0/],
    ["offset +1", (ix) => ix.layers[1].offset += 1, /layers\[1\]\.offset .*multiple of 4096/],
    [
      "offset +4096",
      (ix) => ix.layers[1].offset += 4096,
      /layers\[1\]\.offset .*previous run ends/,
    ],
    ["negative offset", (ix) => ix.layers[0].offset = -4096, /layers\[0\]\.offset/],
    ['bytes "x"', (ix) => ix.layers[0].bytes = "x", /layers\[0\]\.bytes is "x"/],
    ["shards null", (ix) => ix.shards = null, /shards is null, not a list/],
    ["shard size a string", (ix) => ix.shards[0].size = "1", /shards\[0\]\.size/],
    ["layers null", (ix) => ix.layers = null, /layers is null/],
    ["a layer missing", (ix) => ix.layers.pop(), /layers has \d+ entries/],
    ["a layer null", (ix) => ix.layers[1] = null, /layers\[1\] is not an object/],
    ["index out of order", (ix) => ix.layers[1].index = 2, /layers\[1\]\.index/],
    ["sha256 not hex", (ix) => ix.layers[0].sha256 = "zz", /layers\[0\]\.sha256/],
    ["tensors renamed", (ix) => ix.layers[0].tensors[0].name = "x", /layers\[0\]\.tensors/],
    ["total_bytes", (ix) => ix.total_bytes = "big", /total_bytes is "big"/],
    ["align", (ix) => ix.align = 1, /align is 1/],
    ["format", (ix) => ix.format = "zip", /not a k3-trunk version 1 index/],
    ["not an object", (ix) => ix.layers = ix.layers[0] = undefined, /layers/],
  ];
  for (const [what, tamper, says] of cases) {
    const index = structuredClone(good);
    tamper(index);
    assert.throws(
      () =>
        checkPackIndex(index, ckpt.refs.layers, ckpt.refs.lmHead, total, json, "re-run k3 pack"),
      (e: any) => e.exitCode === 2 && says.test(e.message),
      what,
    );
  }
  for (const raw of [null, [], 7, "trunk"]) {
    assert.throws(
      () => checkPackIndex(raw, ckpt.refs.layers, ckpt.refs.lmHead, total, json, ""),
      /not a JSON object|k3-trunk/,
    );
  }
  // A trunk.bin of another size than total_bytes says so.
  assert.throws(
    () => checkPackIndex(good, ckpt.refs.layers, ckpt.refs.lmHead, total + 1, json, ""),
    /incomplete/,
  );
  // The untouched index is accepted.
  checkPackIndex(good, ckpt.refs.layers, ckpt.refs.lmHead, total, json, "");

  // Not JSON, or not a regular file: exit 2, no trace.
  await Deno.writeTextFile(json, "{ not json");
  const broken = await runK3(["run", model, "--trunk", trunk, ...RUN]);
  assertEquals(broken.code, 2, broken.stderr);
  assert(/^k3: .*cannot read .*trunk\.json/m.test(broken.stderr), broken.stderr);
});

Deno.test("a pack killed mid-write leaves no temp files after the next run; two packs do not interleave", async () => {
  const model = await tinyModel({ seed: 5 });
  const trunk = path.join(tempDir(), "trunk");
  await Deno.mkdir(trunk);
  // What writeFileAtomic leaves when SIGKILL lands between create and rename.
  const litter = [".trunk.progress.json.4242.0123abcd.tmp", ".trunk.json.77.deadbeef.tmp"];
  for (const f of litter) await Deno.writeTextFile(path.join(trunk, f), "{");
  // Another pack holds the folder's lock: refused, exit 2.
  await Deno.writeTextFile(path.join(trunk, "trunk.lock"), "");
  const holder = await Deno.open(path.join(trunk, "trunk.lock"), { read: true, write: true });
  await holder.lock(true);
  const second = await runK3(["pack", model, trunk]);
  holder.close();
  assertEquals(second.code, 2, second.stderr);
  assert(/another `k3 pack` is writing/.test(second.stderr), second.stderr);
  const p = await runK3(["pack", model, trunk]);
  assertEquals(p.code, 0, p.stderr);
  const left = [...Deno.readDirSync(trunk)].map((e) => e.name).sort();
  assertEquals(left, ["trunk.bin", "trunk.json"]);
});

Deno.test("pack again: a complete pack is up to date; a stale one is packed again", async () => {
  const model = await modelCopy();
  const trunk = path.join(tempDir(), "trunk");
  assertEquals((await runK3(["pack", model, trunk])).code, 0);
  const bin = path.join(trunk, "trunk.bin");
  const before = (await Deno.stat(bin)).mtime!.getTime();
  const again = await runK3(["pack", model, trunk]);
  assertEquals(again.code, 0, again.stderr);
  assert(/is up to date \(\d+ layers, .*\); nothing to do/.test(again.stdout), again.stdout);
  assertEquals((await Deno.stat(bin)).mtime!.getTime(), before, "trunk.bin was not rewritten");

  // A shard touched since: the pack is stale, so it is made again (and then used).
  const index = JSON.parse(await Deno.readTextFile(path.join(trunk, "trunk.json")));
  const shard = path.join(model, index.shards[0].file);
  await Deno.utime(shard, new Date(), new Date(Date.now() + 5000));
  const redo = await runK3(["pack", model, trunk]);
  assertEquals(redo.code, 0, redo.stderr);
  assert(/not usable, packing again: .*stale/.test(redo.stderr), redo.stderr);
  assert(/pack: wrote/.test(redo.stdout), redo.stdout);
  const run = await runK3(["run", model, "--trunk", trunk, ...RUN]);
  assertEquals(run.code, 0, run.stderr);
});

Deno.test("a pack leaves runs of zeros as holes and reads back every byte", async () => {
  const MiB = 1 << 20;
  const view = new Uint8Array(5 * MiB);
  view.fill(7, 0, 100); // data, then 2 whole MiB of zeros, data, then a zero tail
  view.fill(9, 3 * MiB + 5, 3 * MiB + 6);
  const file = path.join(tempDir(), "sparse.bin");
  const out = await Deno.open(file, { write: true, create: true });
  try {
    await out.write(new Uint8Array(4096).fill(1)); // what an earlier layer left
    await writeSparse(out, view, 4096);
  } finally {
    out.close();
  }
  const back = await Deno.readFile(file);
  assertEquals(back.length, 4096 + view.length);
  assert(back.subarray(4096).every((b, i) => b === view[i]), "the bytes read back");
  assert(back.subarray(0, 4096).every((b) => b === 1), "the earlier layer is kept");
  const used = ((await Deno.stat(file)).blocks ?? 0) * 512;
  assert(used <= 2 * MiB + 8192, `zero runs are holes: ${used} bytes on disk for ${back.length}`);
});
