/**
 * Kernel calls that leave the event loop free while C computes.
 *
 * A call with much work runs as its nonblocking twin (ffi/symbols.ts): Deno runs it on a
 * worker thread and the JS thread serves HTTP, timers and signals meanwhile, so a server
 * answers while a long pass runs, and a cancelled request or a SIGTERM is seen at the next
 * layer boundary instead of after the pass. A call with little work runs here: a blocking
 * call costs tens of nanoseconds, a twin 15-75 us (DENO-NOTES §2.2), which would slow the
 * small model's decode steps. Either way the same C function computes the same bytes: the
 * team size comes from OMP_NUM_THREADS, read once at load, on every thread.
 */
import { k3, type K3Library } from "../../ffi/library.ts";

type Symbols = K3Library["symbols"];

/** Kernels that have a nonblocking twin. */
export type Twinned = Extract<
  { [K in keyof Symbols]: K extends `${infer Base}_nb` ? Base : never }[keyof Symbols],
  keyof Symbols
>;

/**
 * Work, in multiply-adds, from which a call runs off this thread: about 0.05-0.3 ms of C on
 * one core, so a twin's 6-9 us is a few percent of the smallest call it takes and nothing of a
 * full-width one. Measured on the tiny model's 2,500-token pass under load: 2^20 and 5 ms
 * slices left /health at p99 36-100 ms, 2^18 and 2 ms slices at 24-38 ms; decode steps of the
 * tiny model make no call this large.
 */
export const OFF_THREAD_WORK = 1 << 18;

/**
 * Multiply-adds one unit of an element-wise kernel's `work` is worth (its caller counts
 * elements, or elements x bank rows for AttnRes): its own exp, tanh, square roots and divisions cost far more than a
 * multiply-add. Measured on a 2,000-token pass of the tiny model, a SiTU-GLU of 156,000
 * elements held the loop for 10-56 ms as a blocking call; a matrix of 576,000 multiply-adds
 * 0.6 ms. Kernels not named here are multiply-add counted.
 */
const ELEMENT_COST: Partial<Record<Twinned, number>> = {
  k3_situ_glu: 64,
  k3_kda_gate: 64,
  k3_mul_sigmoid: 64,
  k3_sigmoid: 64,
  k3_router_topk: 64,
  k3_gated_rmsnorm_heads: 64,
  k3_l2norm_heads: 32,
  k3_kda_conv: 32,
  k3_attn_res: 16,
  k3_rmsnorm: 16,
  k3_embed_bf16: 16,
  k3_add: 4,
};

type Call = (...args: unknown[]) => unknown;

/**
 * Most milliseconds of calls kept on this thread in a row before the event loop gets a turn
 * (a turn costs about 30 us). Small calls add up: a 2,000-token pass of the tiny model ran
 * each expert on 32 tokens at a time, 0.3 ms a call, and held the loop for 130 ms.
 */
export const SLICE_MS = 2;

/** Date.now() when the event loop last had a turn (a twin returned, or a yield). */
let turned = Date.now();
const NOTHING = new Uint8Array(0);

/**
 * Lets timers, signals and sockets run, in about 30 us: an async op (a zero-byte SHA-256
 * needs no permission). Measured in Deno 2.9: yielding through setImmediate alone starves
 * sockets, and setTimeout(0) costs about 2 ms.
 */
export async function yieldToEventLoop(): Promise<void> {
  await crypto.subtle.digest("SHA-256", NOTHING);
  turned = Date.now();
}

/**
 * Calls kernel `name` with `args`: here when `work` is small, else on a worker thread
 * (await the result either way). Nothing may touch the call's buffers until it returns.
 */
export function kernel<N extends Twinned>(
  work: number,
  name: N,
  ...args: Parameters<Symbols[N]>
): ReturnType<Symbols[N]> | Promise<ReturnType<Symbols[N]>> {
  type Result = ReturnType<Symbols[N]>;
  const lib = k3() as unknown as Record<string, Call>;
  if (work * (ELEMENT_COST[name] ?? 1) >= OFF_THREAD_WORK) {
    return (lib[`${name}_nb`](...args) as Promise<Result>).then((r) => {
      turned = Date.now();
      return r;
    });
  }
  const r = lib[name](...args) as Result;
  if (Date.now() - turned < SLICE_MS) return r;
  return yieldToEventLoop().then(() => r);
}
