/** Human-readable reports: sizes, the per-step table, peak memory. */
import { k3 } from "../ffi/library.ts";

/** "1.23 GB", "456.7 MB", "12.0 KB" (decimal units, as disks and budgets are quoted). */
export function formatBytes(n: number): string {
  const units = ["B", "KB", "MB", "GB", "TB"];
  let u = 0;
  while (Math.abs(n) >= 1000 && u < units.length - 1) {
    n /= 1000;
    u++;
  }
  return `${n.toFixed(u === 0 ? 0 : 2)} ${units[u]}`;
}

/** Peak resident set size of this process (VmHWM), in bytes. */
export function peakRssBytes(): number {
  return Number(k3().k3_peak_rss_bytes());
}

/** One row of the per-step table. */
export interface StepRow {
  step: number;
  token: number;
  seconds: number;
  fed: number;
  cacheHitPct?: number;
  gbRead?: number;
  text?: string;
}

export const STEP_HEADER = "STEP   TOKEN     SECONDS    FED   HIT%    READ GB   TOK/S   TEXT";

/** Formats a row under STEP_HEADER. */
export function formatStep(r: StepRow): string {
  const hit = r.cacheHitPct === undefined ? "-" : r.cacheHitPct.toFixed(1);
  const gb = r.gbRead === undefined ? "-" : r.gbRead.toFixed(3);
  const text = r.text === undefined ? "" : JSON.stringify(r.text);
  return `${String(r.step).padEnd(6)} ${String(r.token).padEnd(9)} ${
    r.seconds.toFixed(4).padStart(8)
  }` +
    `  ${String(r.fed).padStart(5)}  ${hit.padStart(5)}  ${gb.padStart(9)}  ${
      (1 / r.seconds).toFixed(2).padStart(6)
    }   ${text}`;
}
