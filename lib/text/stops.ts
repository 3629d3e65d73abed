/**
 * Stop strings on streamed text. Text arrives in pieces (one per token); a stop string may span
 * pieces. The matcher emits text as soon as it cannot be the start of a stop string, holds back
 * only a tail that could still grow into one, and never emits the stop string itself.
 */

import { badInput } from "../errors.ts";

/** The result of one push: text safe to show, and whether a stop string was hit. */
export interface StopResult {
  emit: string;
  stopped: boolean;
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
    const stopAt = this.#earliestStop(buffer);
    if (stopAt >= 0) {
      this.#stopped = true;
      this.#held = "";
      return { emit: buffer.slice(0, stopAt), stopped: true };
    }
    const keep = this.#partialTailLength(buffer);
    this.#held = buffer.slice(buffer.length - keep);
    return { emit: buffer.slice(0, buffer.length - keep), stopped: false };
  }

  /** End of generation without a stop: release the held-back tail. */
  flush(): string {
    const rest = this.#stopped ? "" : this.#held;
    this.#held = "";
    return rest;
  }

  /**
   * Start of the stop string that completes first in `buffer` (ties: the longer one), or -1.
   * "Completes first" makes the result independent of how the text was split into pushes.
   */
  #earliestStop(buffer: string): number {
    let bestStart = -1;
    let bestEnd = Infinity;
    for (const stop of this.#stops) {
      const at = buffer.indexOf(stop);
      const end = at + stop.length;
      if (at >= 0 && (end < bestEnd || (end === bestEnd && at < bestStart))) {
        bestStart = at;
        bestEnd = end;
      }
    }
    return bestStart;
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
