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
 * Work (multiply-adds, or elements for element-wise kernels) from which a call runs off this
 * thread. 2^20 is about 0.1-1 ms of C on one core (measured: docs/ARCHITECTURE.md, "The
 * engine off the event loop"), so a twin's cost is a few percent of the smallest call it
 * takes and nothing of a full-width one, while no call kept here holds the loop for long.
 */
export const OFF_THREAD_WORK = 1 << 20;

type Call = (...args: unknown[]) => unknown;

/**
 * Calls kernel `name` with `args`: here when `work` is small, else on a worker thread
 * (await the result either way). Nothing may touch the call's buffers until it returns.
 */
export function kernel<N extends Twinned>(
  work: number,
  name: N,
  ...args: Parameters<Symbols[N]>
): ReturnType<Symbols[N]> | Promise<ReturnType<Symbols[N]>> {
  const lib = k3() as unknown as Record<string, Call>;
  const fn = work >= OFF_THREAD_WORK ? lib[`${name}_nb`] : lib[name];
  return fn(...args) as ReturnType<Symbols[N]>;
}
