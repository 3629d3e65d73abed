/**
 * The streaming part of the run report: cache statistics, trunk and expert I/O, the I/O
 * share of wall clock, how much compute ran while reads were in flight, and the peak RSS
 * against --memory-max. The same numbers go to stderr and into --out JSON.
 */
import type { IoPool, IoTotals } from "../io/stream.ts";
import { formatBytes } from "../io/sizes.ts";
import type { CacheStats } from "./experts.ts";
import type { MemoryPlan } from "./plan.ts";
import type { TrunkStats } from "./trunk.ts";

/** The streaming parts of a loaded model that the report reads. */
interface Streaming {
  pool: IoPool;
  trunk: { stats: TrunkStats };
  cache?: { stats: CacheStats };
}

/** What the report needs of a model: its streaming parts (absent when resident). */
interface Reported {
  stream?: Streaming;
  /** Decoder layers the model runs. */
  layers: number;
}

/** Counters at one moment, so a step or a run can report differences. */
export interface IoSnapshot {
  requests: number;
  hits: number;
  misses: number;
  evictions: number;
  /** Bytes read by the reader threads (trunk + experts). */
  bytes: number;
  io?: IoTotals;
  trunkWait: number;
  expertWait: number;
  /** When the snapshot was taken (seconds, monotonic). */
  at: number;
}

/** The model's counters now. */
export function takeSnapshot(model: Reported): IoSnapshot {
  const s = model.stream;
  const io = s?.pool.totals();
  const cache = s?.cache?.stats;
  return {
    requests: cache?.requests ?? 0,
    hits: cache?.hits ?? 0,
    misses: cache?.misses ?? 0,
    evictions: cache?.evictions ?? 0,
    bytes: io ? io.trunkBytes + io.expertBytes : 0,
    io,
    trunkWait: s?.trunk.stats.waitSeconds ?? 0,
    expertWait: cache?.waitSeconds ?? 0,
    at: performance.now() / 1000,
  };
}

function rate(bytes: number, seconds: number): string {
  return seconds > 0 ? `${(bytes / seconds / 1e9).toFixed(2)} GB/s` : "-";
}

/** The report over [a, b] of a run of `wall` seconds. */
export function streamReport(
  model: Reported,
  plan: MemoryPlan,
  a: IoSnapshot,
  b: IoSnapshot,
  wall: number,
  peakRss: number,
  memoryMax?: number,
): { text: string; warning?: string; json: Record<string, unknown> } {
  const w = windowOf(a, b);
  const exceeded = memoryMax !== undefined && peakRss > memoryMax;
  const warning = exceeded
    ? `k3: WARNING: the peak RSS ${formatBytes(peakRss)} exceeded the memory maximum ${
      formatBytes(memoryMax!)
    } ` +
      `by ${formatBytes(peakRss - memoryMax!)} (the plan was ${formatBytes(plan.total)})`
    : undefined;
  return {
    text: reportLines(model, plan, w, peakRss, memoryMax).join("\n"),
    warning,
    json: {
      plan: {
        source: plan.source,
        items: plan.items,
        total_bytes: plan.total,
        budget_bytes: plan.budget,
        budget_source: plan.budgetSource,
        trunk: plan.trunk,
        experts: plan.experts,
        pass_tokens: plan.batch,
        chunk_tokens: plan.chunk,
      },
      ...reportJson(w, wall),
      peak_rss_bytes: peakRss,
      memory_max_bytes: memoryMax ?? null,
      memory_max_exceeded: exceeded,
    },
  };
}

/** The counters' differences between two snapshots, and the shares that follow from them. */
interface Window {
  d: (k: keyof IoSnapshot) => number;
  io: (k: keyof IoTotals) => number;
  requests: number;
  hits: number;
  /** Seconds with a read in flight. */
  busy: number;
  /** Seconds between the snapshots. */
  window: number;
  /** Seconds the engine was not blocked on a read. */
  compute: number;
  /** The share of `compute` with a read in flight. */
  hidden: number;
}

function windowOf(a: IoSnapshot, b: IoSnapshot): Window {
  const d = (k: keyof IoSnapshot) => (b[k] as number) - (a[k] as number);
  const io = (k: keyof IoTotals) => (b.io?.[k] ?? 0) - (a.io?.[k] ?? 0);
  const stall = d("trunkWait") + d("expertWait");
  const busy = io("anySeconds");
  // Compute hidden under I/O: of the time between the snapshots when the engine was not
  // blocked on a read, the share with a read in flight. Busy and window share one window,
  // and every stall is busy time (the engine only blocks on a read that is in flight).
  const window = d("at");
  const compute = Math.max(0, window - stall);
  const hidden = compute > 0 ? Math.min(1, Math.max(0, busy - stall) / compute) : 0;
  return { d, io, requests: d("requests"), hits: d("hits"), busy, window, compute, hidden };
}

/** The report as lines for stderr. */
function reportLines(
  model: Reported,
  plan: MemoryPlan,
  w: Window,
  peakRss: number,
  memoryMax: number | undefined,
): string[] {
  const { d, io, requests, hits, busy, window, compute, hidden } = w;
  const exceeded = memoryMax !== undefined && peakRss > memoryMax;
  const lines: string[] = [];
  if (model.stream?.cache) {
    lines.push(
      `cache: requests ${requests}, hits ${hits}, misses ${d("misses")}, evictions ${
        d("evictions")
      }; ` +
        `true resident hit rate ${requests ? ((100 * hits) / requests).toFixed(2) : "0.00"}% ` +
        `(a hit was resident when asked; nothing prefetched counts)`,
    );
  }
  const t = plan.trunk;
  lines.push(
    `trunk I/O: ${formatBytes(io("trunkBytes"))} in ${io("trunkSeconds").toFixed(3)} s ` +
      `(${rate(io("trunkBytes"), io("trunkSeconds"))}), forward waited ${
        d("trunkWait").toFixed(3)
      } s; ` +
      `pinned ${t.pinned}/${model.layers}, lm_head ${t.headResident ? "resident" : "streamed"}, ` +
      `ring ${t.ringSlots} x ${formatBytes(t.slotBytes)}`,
    `expert I/O: ${formatBytes(io("expertBytes"))} in ${io("expertSeconds").toFixed(3)} s ` +
      `(${rate(io("expertBytes"), io("expertSeconds"))}), forward waited ${
        d("expertWait").toFixed(3)
      } s`,
    `I/O share of wall clock: ${window > 0 ? ((100 * busy) / window).toFixed(1) : "0.0"}% ` +
      `(reads in flight ${busy.toFixed(3)} s of ${window.toFixed(3)} s); ` +
      `compute hidden under I/O: ${(100 * hidden).toFixed(1)}% ` +
      `(of ${compute.toFixed(3)} s not blocked on a read, the share with a read in flight)`,
    `peak RSS ${formatBytes(peakRss)} (VmHWM)` +
      (memoryMax === undefined
        ? ""
        : `; memory maximum ${formatBytes(memoryMax)}: ${exceeded ? "EXCEEDED" : "ok"}`),
  );
  return lines;
}

/** The cache and I/O parts of the report's JSON. */
function reportJson(w: Window, wall: number): Record<string, unknown> {
  const { d, io, requests, hits } = w;
  return {
    cache: {
      requests,
      hits,
      misses: d("misses"),
      evictions: d("evictions"),
      true_hit_rate: requests ? hits / requests : null,
    },
    io: {
      trunk_reads: io("trunkReads"),
      expert_reads: io("expertReads"),
      trunk_bytes: io("trunkBytes"),
      trunk_seconds: io("trunkSeconds"),
      trunk_wait_seconds: d("trunkWait"),
      expert_bytes: io("expertBytes"),
      expert_seconds: io("expertSeconds"),
      expert_wait_seconds: d("expertWait"),
      busy_seconds: w.busy,
      wall_seconds: wall,
      window_seconds: w.window,
      compute_seconds: w.compute,
      io_share: w.window > 0 ? w.busy / w.window : 0,
      compute_hidden: w.hidden,
    },
  };
}
