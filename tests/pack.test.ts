/** The trunk pack: byte-exact round trip, resume, and refusal of stale or corrupted packs. */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import * as path from "node:path";
import { openCheckpoint } from "../lib/checkpoint/checkpoint.ts";
import { layoutOf, trunkTensors } from "../lib/layout/block.ts";
import { runK3, sameBytes, tempDir, tinyModel } from "./helpers.ts";

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

Deno.test("pack round trip: every run is the shards' tensors, and a packed run equals an unpacked one", async () => {
  const model = await tinyModel({ seed: 5 });
  const trunk = path.join(tempDir(), "trunk");
  const p = await runK3(["pack", model, trunk]);
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
