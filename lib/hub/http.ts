/**
 * HTTP with the Hub's failure modes handled: 5xx, 429 (honouring Retry-After), dropped
 * connections and stalled bodies are retried with exponential backoff until a request has
 * kept failing for `retryFor` seconds; then it gives up with the last failure in the message.
 * 4xx answers are not retried here: the caller decides what they mean.
 */
import { runInvalid } from "../errors.ts";

/** Retry policy shared by every request of one download. */
export interface RetryPolicy {
  /** Seconds a request may keep failing (counted from its first failure) before giving up. */
  retryFor: number;
  /** Seconds without a byte before a body counts as stalled (and is retried). */
  stallTimeout: number;
  /** First backoff in seconds; doubles each failure, capped at 30 s, with +-20% jitter. */
  backoff: number;
  /** Aborts every request (Ctrl-C, or another request gave up). */
  signal?: AbortSignal;
  /**
   * Called before each wait, for the log: what failed, how long we wait, and how long the
   * request may still keep failing before it is given up.
   */
  onRetry?: (what: string, failure: string, seconds: number, left: number) => void;
}

/** A request that kept failing past the policy's time bound. */
export class GaveUp extends Error {
  constructor(readonly what: string, readonly seconds: number, readonly last: string) {
    super(`gave up on ${what} after ${seconds.toFixed(1)} s of failures (last: ${last})`);
    this.name = "GaveUp";
  }
}

/** A failure worth retrying: a 5xx or 429 status, a dropped connection, a stall. */
export class Transient extends Error {
  constructor(message: string, readonly retryAfter?: number) {
    super(message);
    this.name = "Transient";
  }
}

/** Seconds from a Retry-After header (delta-seconds or an HTTP date), or undefined. */
export function retryAfterSeconds(value: string | null, now = Date.now()): number | undefined {
  if (value === null || value.trim() === "") return undefined;
  if (/^\d+$/.test(value.trim())) return Number(value.trim());
  const at = Date.parse(value);
  return Number.isNaN(at) ? undefined : Math.max(0, (at - now) / 1000);
}

/** Throws {@link Transient} for statuses worth retrying; returns the response otherwise. */
export function transientStatus(res: Response, host: string): Response {
  if (res.status === 429 || res.status >= 500) {
    const after = retryAfterSeconds(res.headers.get("retry-after"));
    // The body may hold a message, but a retry does not need it.
    res.body?.cancel().catch(() => {});
    throw new Transient(`HTTP ${res.status} from ${host}`, after);
  }
  return res;
}

/**
 * fetch, with a failure to connect or to get an answer turned into {@link Transient}. An
 * abort of `init.signal` is rethrown as its reason. With `answerWithin`, an answer (the
 * status and headers) that takes longer than that many seconds is a failure too: a host
 * that drops packets would otherwise hold the connect for minutes (the OS's timeout).
 */
export async function netFetch(
  url: string,
  init: RequestInit,
  host: string,
  answerWithin?: number,
): Promise<Response> {
  const late = new AbortController();
  const timer = answerWithin === undefined
    ? undefined
    : setTimeout(() => late.abort(), answerWithin * 1000);
  const signal = init.signal ? AbortSignal.any([init.signal, late.signal]) : late.signal;
  try {
    return await fetch(url, { ...init, signal });
  } catch (e) {
    if (init.signal?.aborted) throw init.signal.reason;
    if (late.signal.aborted) throw new Transient(`no answer from ${host} in ${answerWithin} s`);
    // Not the network: a server that sends k3 to file: or data: will do so again.
    if (/redirect to a non HTTP\(s\) url/i.test(firstLine(e))) {
      throw runInvalid(
        `${host} redirected to a URL that is not http(s); k3 follows http(s) redirects only`,
      );
    }
    throw new Transient(`connection to ${host} failed (${fetchFailure(e)})`);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * Why a fetch failed, in the OS's words: "tcp connect error: Connection refused (os error
 * 111)", "dns error: ...". Deno's message is only "fetch failed"; the reason is its cause.
 */
function fetchFailure(e: unknown): string {
  const cause = e instanceof Error && e.cause instanceof Error ? firstLine(e.cause) : "";
  const reason = cause.replace(/^error sending request for url \([^)]*\): /, "")
    .replace(/^client error \(\w+\): /, "");
  return reason || firstLine(e);
}

/** The first line of an error's message (fetch errors carry their cause on later lines). */
export function firstLine(e: unknown): string {
  return String(e instanceof Error ? e.message : e).split("\n")[0];
}

/**
 * Runs `attempt` until it succeeds, throws a non-transient error, or has failed for longer
 * than `policy.retryFor` seconds since its first failure (then {@link GaveUp}). `attempt`
 * reports progress by calling `madeProgress`, which restarts the clock: a request that keeps
 * delivering bytes between drops is never given up on.
 */
export async function withRetries<T>(
  what: string,
  policy: RetryPolicy,
  attempt: (madeProgress: () => void) => Promise<T>,
): Promise<T> {
  let firstFailure: number | undefined;
  let failures = 0;
  const progress = () => {
    firstFailure = undefined;
    failures = 0;
  };
  for (;;) {
    policy.signal?.throwIfAborted();
    try {
      return await attempt(progress);
    } catch (e) {
      if (policy.signal?.aborted) throw policy.signal.reason;
      if (!(e instanceof Transient)) throw e;
      const transient = e;
      const now = performance.now() / 1000;
      firstFailure ??= now;
      const elapsed = now - firstFailure;
      const backoff = Math.min(30, policy.backoff * 2 ** failures) * (0.8 + 0.4 * Math.random());
      failures++;
      const left = policy.retryFor - elapsed;
      // A Retry-After past the bound cannot be honoured: give up now rather than early.
      if (left <= 0 || (transient.retryAfter ?? 0) > left) {
        throw new GaveUp(what, elapsed, transient.message);
      }
      // The last wait is cut short so that the last attempt comes at the bound, not before.
      const wait = Math.min(left, Math.max(transient.retryAfter ?? 0, backoff));
      policy.onRetry?.(what, transient.message, wait, left);
      await sleep(wait, policy.signal);
    }
  }
}

/** Waits `seconds`, or rejects when `signal` aborts. */
function sleep(seconds: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, seconds * 1000);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * An AbortSignal that fires when `parent` does or when `kick()` has not been called for
 * `seconds` (a stalled body). `done()` releases the timer.
 */
export function stallGuard(seconds: number, parent?: AbortSignal) {
  const controller = new AbortController();
  let stalled = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const arm = () => {
    clearTimeout(timer);
    timer = setTimeout(() => {
      stalled = true;
      controller.abort(new Transient(`no data for ${seconds} s (stalled)`));
    }, seconds * 1000);
  };
  const onParent = () => controller.abort(parent!.reason);
  parent?.addEventListener("abort", onParent, { once: true });
  arm();
  return {
    signal: controller.signal,
    kick: arm,
    get stalled() {
      return stalled;
    },
    done() {
      clearTimeout(timer);
      parent?.removeEventListener("abort", onParent);
    },
  };
}
