/** Sizes for people, and the process's peak memory: used by every layer that reports. */
import { k3 } from "../../ffi/library.ts";

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
