/**
 * Offline replay of an expert trace under three policies at a given capacity (in slots):
 * LRU (what the engine does), Belady (evict the key needed furthest in the future: the
 * optimum, a ceiling no online policy beats) and a pinned prefix + LRU (the experts of the
 * first layers, up to half the slots, are never evicted; the rest is LRU).
 */
import type { Trace } from "./trace.ts";

/** Hits and misses of one replay. */
interface SimResult {
  hits: number;
  misses: number;
}

/** The trace as a flat list of keys (layer * experts + id), in request order. */
export function traceKeys(trace: Trace): number[] {
  const E = trace.header.experts;
  return trace.records.flatMap((r) => r.ids.map((id) => r.layer * E + id));
}

/** LRU over `cap` slots; keys in `pinned` (never evicted) take slots of their own. */
export function simulateLru(
  keys: number[],
  cap: number,
  pinned: (k: number) => boolean = () => false,
): SimResult {
  const lru = new Map<number, true>();
  const pins = new Set<number>();
  let hits = 0;
  for (const k of keys) {
    if (pins.has(k) || lru.has(k)) {
      hits++;
      if (lru.delete(k)) lru.set(k, true);
      continue;
    }
    if (pinned(k) && pins.size + lru.size < cap) {
      pins.add(k);
      continue;
    }
    if (lru.size + pins.size >= cap) {
      const oldest = lru.keys().next();
      if (oldest.done) continue; // every slot pinned: stream it without caching
      lru.delete(oldest.value);
    }
    lru.set(k, true);
  }
  return { hits, misses: keys.length - hits };
}

/** Belady's optimum over `cap` slots. */
export function simulateBelady(keys: number[], cap: number): SimResult {
  // nextUse[i]: the position of the next request of keys[i] after i (Infinity if none).
  const nextUse = new Array<number>(keys.length);
  const seen = new Map<number, number>();
  for (let i = keys.length - 1; i >= 0; i--) {
    nextUse[i] = seen.get(keys[i]) ?? Infinity;
    seen.set(keys[i], i);
  }
  const resident = new Map<number, number>(); // key -> its next use
  const heap = new MaxHeap();
  let hits = 0;
  keys.forEach((k, i) => {
    if (resident.has(k)) hits++;
    else if (resident.size >= cap) {
      // Pop until an entry that is still current (lazy deletion).
      for (;;) {
        const [use, key] = heap.pop()!;
        if (resident.get(key) === use) {
          resident.delete(key);
          break;
        }
      }
    }
    resident.set(k, nextUse[i]);
    heap.push([nextUse[i], k]);
  });
  return { hits, misses: keys.length - hits };
}

/** Pinned prefix + LRU: the experts of layers below P are pinned, P = half the slots' worth. */
export function simulatePinnedLru(keys: number[], cap: number, experts: number): SimResult {
  const pinnedLayers = Math.floor(cap / 2 / Math.max(1, experts));
  return simulateLru(keys, cap, (k) => Math.floor(k / experts) < pinnedLayers);
}

/** A binary max-heap of [priority, value] pairs. */
class MaxHeap {
  #a: [number, number][] = [];
  push(x: [number, number]): void {
    const a = this.#a;
    a.push(x);
    for (let i = a.length - 1; i > 0;) {
      const p = (i - 1) >> 1;
      if (a[p][0] >= a[i][0]) break;
      [a[p], a[i]] = [a[i], a[p]];
      i = p;
    }
  }
  pop(): [number, number] | undefined {
    const a = this.#a;
    if (a.length === 0) return undefined;
    const top = a[0], last = a.pop()!;
    if (a.length > 0) {
      a[0] = last;
      for (let i = 0;;) {
        const l = 2 * i + 1, r = l + 1;
        let m = i;
        if (l < a.length && a[l][0] > a[m][0]) m = l;
        if (r < a.length && a[r][0] > a[m][0]) m = r;
        if (m === i) break;
        [a[m], a[i]] = [a[i], a[m]];
        i = m;
      }
    }
    return top;
  }
}
