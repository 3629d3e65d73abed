/**
 * A NaN or Inf that reaches a decision ends the run with exit 4 naming where, instead of
 * becoming a token or an expert choice: the router kernel never produces an out-of-range id, and the CLI and the
 * library refuse non-finite logits alike.
 */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import * as path from "node:path";
import { k3 } from "../../ffi/library.ts";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import type { TensorRef } from "../../lib/checkpoint/types.ts";
import { K3Error, openModel } from "../../mod.ts";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";

Deno.test("k3_router_topk: non-finite scores give -1 and in-range ids; bad sizes give -2", () => {
  const lib = k3(), E = 8, k = 3, T = 4;
  const bias = new Float32Array(E);
  const route = (logits: Float32Array, b = bias, e = E, kk = k) => {
    const ids = new Int32Array(T * kk).fill(-7), w = new Float32Array(T * kk);
    return { rc: lib.k3_router_topk(ids, w, logits, b, e, kk, 1, 1, T), ids };
  };
  const base = Float32Array.from({ length: T * E }, (_, i) => Math.sin(i));
  assertEquals(route(base).rc, 0);
  for (const bad of [NaN, Infinity, -Infinity]) {
    const l = base.slice();
    l[E + 2] = bad; // token 1
    const { rc, ids } = route(l);
    assertEquals(rc, -1, `logit ${bad}`);
    assert(ids.every((id) => id >= 0 && id < E), `ids in range for ${bad}: ${ids}`);
    // Every logit NaN: a naive top-k would find no best expert and write id -1.
    const all = route(new Float32Array(T * E).fill(NaN));
    assertEquals(all.rc, -1);
    assert(all.ids.every((id) => id >= 0 && id < E));
  }
  const nanBias = bias.slice();
  nanBias[5] = NaN;
  assertEquals(route(base, nanBias).rc, -1, "a NaN selection bias");
  assertEquals(route(base, bias, E, E + 1).rc, -2, "k > E");
  assertEquals(route(base, bias, E, 0).rc, -2, "k = 0");
  assertEquals(route(base, bias, 1 << 20, 2).rc, -2, "E over K3_MAX_EXPERTS");
});

/** A private copy of the tiny model with `patch` applied to the bytes of one tensor. */
async function patched(
  pick: (c: Awaited<ReturnType<typeof openCheckpoint>>) => TensorRef | TensorRef[],
  patch: (b: Uint8Array) => void,
) {
  const src = await tinyModel({ seed: 5 });
  const dst = path.join(tempDir(), "model");
  await Deno.mkdir(dst);
  for await (const e of Deno.readDir(src)) {
    await Deno.copyFile(path.join(src, e.name), path.join(dst, e.name));
  }
  const picked = pick(await openCheckpoint(dst));
  for (const ref of Array.isArray(picked) ? picked : [picked]) {
    const file = path.join(dst, path.basename(ref.file));
    const bytes = await Deno.readFile(file);
    patch(bytes.subarray(ref.offset, ref.offset + ref.nbytes));
    await Deno.writeFile(file, bytes);
  }
  return { dir: dst };
}

const NAN_BF16 = (b: Uint8Array) => {
  b[0] = 0xc0;
  b[1] = 0x7f;
};
const RUN = ["--ids", "5,17,250,3", "--gen", "3", "--ignore-eos"];

Deno.test("a NaN in a router weight or an MXFP4 scale of 254 ends the run with exit 4 naming the layer", async () => {
  const firstMoe = (c: Awaited<ReturnType<typeof openCheckpoint>>) =>
    c.refs.layers.find((l) => l.moe)!;
  const router = await patched((c) => firstMoe(c).moe!.router, NAN_BF16);
  const layer = (await openCheckpoint(router.dir)).refs.layers.find((l) => l.moe)!.index;
  for (const flags of [[], ["--pin-layers", "0", "--ring-slots", "1", "--cache-slots", "1"]]) {
    const r = await runK3(["run", router.dir, ...RUN, ...flags]);
    assertEquals(r.code, 4, r.stderr);
    assert(
      new RegExp(`^k3: RUN INVALID: the router of layer ${layer} produced a non-finite`, "m").test(
        r.stderr,
      ),
      r.stderr,
    );
  }
  // Every scale byte of every expert's down projection in the first MoE layer = 254 (2^126):
  // whichever experts are chosen, their outputs overflow to Inf, and a later decision sees it.
  const scales = await patched((c) => {
    const t = firstMoe(c).moe!.experts;
    return Array.from({ length: t.count }, (_, e) => t.get(e).w2.scale);
  }, (b) => b.fill(254));
  const s = await runK3(["run", scales.dir, ...RUN]);
  assertEquals(s.code, 4, s.stderr);
  assert(
    /^k3: RUN INVALID: (the router of layer \d+|lm_head).*non-finite/m.test(s.stderr),
    s.stderr,
  );
  const all = await patched((c) => firstMoe(c).moe!.router, (b) => {
    for (let i = 0; i + 1 < b.length; i += 2) b[i + 1] = 0x7f, b[i] = 0x80; // +Inf everywhere
  });
  const inf = await runK3(["run", all.dir, ...RUN]);
  assertEquals(inf.code, 4, inf.stderr);
  assert(/RUN INVALID: the router of layer \d+ produced a non-finite/.test(inf.stderr), inf.stderr);
});

Deno.test("NaN logits: exit 4 from the CLI, and openModel().generate() throws the same error", async () => {
  const { dir } = await patched((c) => c.refs.lmHead, NAN_BF16);
  const r = await runK3(["run", dir, ...RUN]);
  assertEquals(r.code, 4, r.stderr);
  assert(
    /^k3: RUN INVALID: lm_head \(logit 0 is NaN\) produced a non-finite/m.test(r.stderr),
    r.stderr,
  );
  const model = await openModel(dir);
  try {
    const tokens: number[] = [];
    await assert.rejects(async () => {
      for await (const step of model.generate([5, 17, 250], { maxTokens: 3 })) {
        tokens.push(step.token);
      }
    }, (e) => e instanceof K3Error && e.exitCode === 4 && /lm_head/.test(e.message));
    assertEquals(tokens, [], "no token came from NaN logits");
  } finally {
    model.close();
  }
});
