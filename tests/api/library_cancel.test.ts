/**
 * Leaving a `for await` loop over `model.chat()` or `model.complete()` (break, return, a
 * throw) cancels the generation at once: the loop is left within a step, the result says
 * `cancelled` with the few ids made, and the batch slot is free for the next call. A model
 * closed (by close() or by `using`) refuses every later call with a K3Error, never an FFI
 * error or a crash.
 */
import assert from "node:assert/strict";
import { type ChatStream, type CompletionStream, K3Error, openModel } from "../../mod.ts";
import { tinyModel } from "../support/helpers.ts";

const hello = [{ role: "user", content: "Hello there!" }];

/**
 * Iterates `stream` and leaves the loop after `n` pieces by `how`; the ms the exit took, and
 * what `probe` said just before leaving.
 */
async function leaveAfter(
  stream: ChatStream | CompletionStream,
  n: number,
  how: "break" | "return" | "throw",
  probe: () => number,
): Promise<{ exitMs: number; before: number }> {
  let seen = 0, at = 0, before = -1;
  const loop = async () => {
    for await (const _ of stream) {
      if (++seen < n) continue;
      before = probe();
      at = performance.now();
      if (how === "break") break;
      if (how === "return") return;
      throw new Error("left by a throw");
    }
  };
  if (how === "throw") await assert.rejects(loop, /left by a throw/);
  else await loop();
  assert.equal(seen, n, "the loop saw its pieces");
  return { exitMs: performance.now() - at, before };
}

Deno.test("leaving a for-await loop over chat() or complete() cancels the generation at once", async () => {
  const dir = await tinyModel({ seed: 11 });
  // One batch slot: a call that kept generating would hold it from the next call.
  const model = await openModel(dir, { context: 2048, maxBatch: 1 });
  try {
    const full = await model.chat(hello, { maxTokens: 200 }).result;
    assert.ok(full.ids.length > 20, `an uncancelled answer runs on (${full.ids.length} ids)`);
    // The model's Session (not part of the interface): its batch slots in use.
    const slots = () => (model as unknown as { session: { batchSize: number } }).session.batchSize;
    for (const how of ["break", "return", "throw"] as const) {
      const reply = model.chat(hello, { maxTokens: 200 });
      const { exitMs, before } = await leaveAfter(reply, 3, how, slots);
      assert.equal(before, 1, `${how}: the answer held a batch slot while it ran`);
      assert.equal(slots(), 0, `${how}: the batch slot is free once the loop is left`);
      const result = await reply.result;
      assert.equal(result.finish, "cancelled", how);
      assert.ok(result.ids.length <= 5, `${how}: ${result.ids.length} ids after 3 pieces`);
      assert.ok(result.message.interrupted, "the message is marked cut short");
      assert.ok(exitMs < 1000, `${how}: the loop was left in ${exitMs.toFixed(0)} ms`);
    }
    const text = model.complete("The capital of France is", { maxTokens: 200, stopAtEos: false });
    assert.equal((await leaveAfter(text, 2, "break", slots)).before, 1);
    assert.equal(slots(), 0);
    const done = await text.result;
    assert.equal(done.finish, "cancelled");
    assert.ok(done.ids.length <= 4, `${done.ids.length} ids after 2 pieces`);
    // The slot is free: the next call runs now, with the tokens it gets alone.
    const next = await model.chat(hello, { maxTokens: 200 }).result;
    assert.deepEqual(next.ids, full.ids);
    assert.equal(next.finish, full.finish);
    // A call read to its end, or ended by its signal, says so as before.
    const stopper = new AbortController();
    stopper.abort();
    const interrupted = await model.chat(hello, { maxTokens: 50, signal: stopper.signal }).result;
    assert.equal(interrupted.finish, "interrupted");
  } finally {
    model.close();
  }
});

/** A K3Error saying the model was closed (or its tokenizer freed). */
function closedError(e: unknown): boolean {
  assert.ok(e instanceof K3Error, `a K3Error, not ${e}`);
  assert.match(e.message, /model was closed/);
  return true;
}

Deno.test("after close() or a `using` scope every call throws a K3Error", async () => {
  const dir = await tinyModel({ seed: 11 });
  let kept: Awaited<ReturnType<typeof openModel>>;
  let tokenizer;
  {
    using model = await openModel(dir, { context: 512 });
    kept = model;
    tokenizer = model.tokenizer;
    assert.ok(model.tokenizer.encode("hi").length > 0);
    assert.ok(model.report().text.length > 0);
  }
  // report() read freed native counters (a segfault) before it checked.
  assert.throws(() => kept.report(), closedError);
  assert.throws(() => kept.cacheStats(), closedError);
  assert.throws(() => kept.tokenizer, closedError);
  assert.throws(() => kept.renderChat(hello), closedError);
  assert.throws(() => tokenizer.encode("hi"), closedError);
  await assert.rejects(async () => await kept.chat(hello).result, closedError);
  await assert.rejects(() => kept.logits([1, 2]), closedError);
  await assert.rejects(() => kept.saveState("/nonexistent/x.state", [1, 2]), closedError);
  await assert.rejects(() => kept.loadState("/nonexistent/x.state"), closedError);
  await assert.rejects(
    () => kept.generateBatch([{ ids: [1, 2], options: { maxTokens: 1 } }]).next(),
    closedError,
  );
  kept.close(); // after dispose: harmless
});
