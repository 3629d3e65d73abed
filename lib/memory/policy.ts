/**
 * Which expert-cache slot to give up when a new expert needs room. The cache asks the
 * policy only about slots that hold a key and are not needed by the current layer; empty
 * slots are always taken first.
 */

/** An eviction policy over slot indices. */
export interface EvictionPolicy {
  readonly name: string;
  /** Slot `slot` was used (a hit, or a miss that just landed). */
  touch(slot: number): void;
  /** The slot to evict among `candidates` (never empty). */
  victim(candidates: number[]): number;
}

/** Least recently used: evict the slot touched longest ago. */
export class LruPolicy implements EvictionPolicy {
  readonly name = "lru";
  #clock = 0;
  #usedAt: number[] = [];

  touch(slot: number): void {
    this.#usedAt[slot] = ++this.#clock;
  }

  victim(candidates: number[]): number {
    let best = candidates[0];
    for (const s of candidates) if ((this.#usedAt[s] ?? 0) < (this.#usedAt[best] ?? 0)) best = s;
    return best;
  }
}

/** Policies by name, for --cache-policy. */
export const POLICIES: Record<string, () => EvictionPolicy> = {
  lru: () => new LruPolicy(),
};
