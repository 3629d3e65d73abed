/**
 * Stop strings on streamed text. Text arrives in pieces (one per token); a stop string may span
 * pieces. The matcher emits text as soon as it cannot be the start of a stop string, holds back
 * only a tail that could still grow into one, and never emits the stop string itself.
 */

import { badInput } from "../errors.ts";

/** The result of one push: text safe to show, and whether a stop string was hit (which). */
export interface StopResult {
  /** Text that can be shown now (never part of a stop string). */
  emit: string;
  /** True when a stop string was completed. */
  stopped: boolean;
  /** The stop string that fired (only on the push that stopped). */
  stop?: string;
}

/** Matches a set of stop strings across pushes. After a stop, every push emits nothing. */
export class StopMatcher {
  readonly #stops: string[];
  #held = "";
  #stopped = false;

  /** `stops` may be empty (then text passes straight through); an empty string is bad input. */
  constructor(stops: string[]) {
    if (stops.some((s) => typeof s !== "string" || s === "")) {
      throw badInput("stop: every stop string must be a non-empty string");
    }
    this.#stops = [...stops];
  }

  /** Add decoded text. If a stop string completes, emit what precedes it and stop. */
  push(text: string): StopResult {
    if (this.#stopped) return { emit: "", stopped: true };
    const buffer = this.#held + text;
    const hit = this.#earliestStop(buffer);
    if (hit) {
      this.#stopped = true;
      this.#held = "";
      return { emit: buffer.slice(0, hit.at), stopped: true, stop: hit.stop };
    }
    const keep = this.#partialTailLength(buffer);
    this.#held = buffer.slice(buffer.length - keep);
    return { emit: buffer.slice(0, buffer.length - keep), stopped: false };
  }

  /**
   * Release the held-back tail: at the end of generation, or where the matched text is
   * interrupted (markup in between: a stop string never spans it).
   */
  flush(): string {
    const rest = this.#stopped ? "" : this.#held;
    this.#held = "";
    return rest;
  }

  /**
   * The stop string that completes first in `buffer` (ties: the longer one) and its start.
   * "Completes first" makes the result independent of how the text was split into pushes.
   */
  #earliestStop(buffer: string): { at: number; stop: string } | null {
    let best: { at: number; stop: string } | null = null;
    let bestEnd = Infinity;
    for (const stop of this.#stops) {
      const at = buffer.indexOf(stop);
      const end = at + stop.length;
      if (at >= 0 && (end < bestEnd || (end === bestEnd && at < best!.at))) {
        best = { at, stop };
        bestEnd = end;
      }
    }
    return best;
  }

  /** Length of the longest suffix of `buffer` that is a proper prefix of some stop string. */
  #partialTailLength(buffer: string): number {
    let longest = 0;
    for (const stop of this.#stops) {
      for (let n = Math.min(stop.length - 1, buffer.length); n > longest; n--) {
        if (buffer.endsWith(stop.slice(0, n))) {
          longest = n;
          break;
        }
      }
    }
    return longest;
  }
}
