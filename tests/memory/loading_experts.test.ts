/**
 * Resident experts that load while the model runs (lib/memory/loading_experts.ts): every
 * expert ends up with exactly the bytes the synchronous loader reads, an expert asked for
 * before its turn is read at once, nothing is freed under a read in flight, and a failed
 * background read stops the run (exit 4) instead of handing out a half-read expert.
 */
import assert, { deepStrictEqual as assertEquals } from "node:assert/strict";
import { openCheckpoint } from "../../lib/checkpoint/checkpoint.ts";
import { FileReader } from "../../lib/io/reader.ts";
import { IoPool } from "../../lib/io/stream.ts";
import { expertTensors, layoutOf } from "../../lib/layout/block.ts";
import { LoadingExperts } from "../../lib/memory/loading_experts.ts";
import { type ReadyExpert, ResidentExperts } from "../../lib/memory/sources.ts";
import type { ModelRefs } from "../../lib/checkpoint/types.ts";
import { runK3, tinyModel } from "../support/helpers.ts";

/** The six tensors of a ready expert, as bytes. */
function expertBytes(refs: ModelRefs, layer: number, e: ReadyExpert): Uint8Array[] {
  const tensors = expertTensors(refs.layers[layer].moe!.experts.get(e.id));
  return tensors.map((r, j) =>
    new Uint8Array(
      Deno.UnsafePointerView.getArrayBuffer(
        Deno.UnsafePointer.offset(e.base, e.offsets[j])!,
        r.nbytes,
      ),
    ).slice()
  );
}

async function collect(
  source: { fetch(layer: number, ids: number[]): AsyncIterable<ReadyExpert> },
  refs: ModelRefs,
  layer: number,
  ids: number[],
): Promise<Map<number, Uint8Array[]>> {
  const out = new Map<number, Uint8Array[]>();
  for await (const e of source.fetch(layer, ids)) out.set(e.id, expertBytes(refs, layer, e));
  return out;
}

Deno.test("loading experts: the bytes of the synchronous loader, the last layer first", async () => {
  const dir = await tinyModel({ seed: 3 });
  const ckpt = await openCheckpoint(dir);
  const refs = ckpt.refs;
  const reader = new FileReader(false);
  const resident = new ResidentExperts(refs, reader);
  const pool = new IoPool(4);
  const loading = new LoadingExperts(refs, pool);
  try {
    const moe = refs.layers.filter((l) => l.moe).map((l) => l.index);
    assert(moe.length >= 2, "the tiny model has several MoE layers");
    assertEquals(loading.total, moe.length * refs.layers[moe[0]].moe!.experts.count);
    // Asked for at once, the last layer before the first: demand reads, not the queue order.
    for (const layer of [...moe].reverse()) {
      const ids = Array.from({ length: refs.layers[layer].moe!.experts.count }, (_, e) => e)
        .reverse();
      const got = await collect(loading, refs, layer, ids);
      const want = await collect(resident, refs, layer, ids);
      assertEquals(got, want, `layer ${layer}`);
    }
    // The background pump finishes the rest on its own; then it is a resident table.
    const deadline = Date.now() + 20_000;
    while (loading.loaded < loading.total && Date.now() < deadline) {
      await new Promise((r) => setTimeout(r, 10));
    }
    assertEquals(loading.loaded, loading.total);
    const again = await collect(loading, refs, moe[0], [0, 1]);
    assertEquals(again, await collect(resident, refs, moe[0], [0, 1]));
  } finally {
    loading.close();
    resident.close();
    pool.close();
    reader.close();
  }
});

Deno.test("loading experts: close() with reads in flight waits for them", async () => {
  const dir = await tinyModel({ seed: 3 });
  const ckpt = await openCheckpoint(dir);
  const pool = new IoPool(2);
  const loading = new LoadingExperts(ckpt.refs, pool);
  assert(loading.loaded < loading.total, "reads are still queued right after construction");
  loading.close();
  pool.close();
  const { bytes } = layoutOf(
    expertTensors(ckpt.refs.layers.find((l) => l.moe)!.moe!.experts.get(0)),
  );
  assert(bytes > 0);
});

Deno.test("a resident plan gives the tokens of a cached one; a failed expert read is exit 4", async () => {
  const dir = await tinyModel({ seed: 3 });
  const run = ["run", dir, "--ids", "1,2,3,4,5", "--gen", "6", "--ignore-eos", "--quiet"];
  const resident = await runK3([...run, "--memory-max", "4"]);
  assertEquals(resident.code, 0, resident.stderr);
  const cached = await runK3([...run, "--cache-slots", "2"]);
  assertEquals(cached.code, 0, cached.stderr);
  assertEquals(resident.stdout, cached.stdout, "same tokens, resident or cached");
  // Failures injected late in the run's reads (after the head, embedding and trunk reads),
  // until one hits a resident expert's read: the run stops with RUN INVALID, exit 4, or
  // (a read nobody used before the end) gives the clean output.
  let hit = "";
  for (const n of [400, 350, 300, 250, 200, 150]) {
    const r = await runK3([...run, "--memory-max", "4"], { K3_FAULT_READ: String(n) });
    if (r.code === 0) {
      assertEquals(r.stdout, cached.stdout, `fault ${n}: a clean run gives the clean output`);
      continue;
    }
    assertEquals(r.code, 4, r.stderr);
    assert(r.stderr.includes("RUN INVALID"), r.stderr);
    const m = r.stderr.match(/expert \d+ of layer \d+/);
    if (m) {
      hit = m[0];
      break;
    }
  }
  assert(hit !== "", "an injected failure hit a resident expert's read");
});
