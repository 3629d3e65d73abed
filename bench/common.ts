/** Helpers the benchmarks share (bench/*.ts; not part of the product). */

export async function exists(p: string): Promise<boolean> {
  return (await Deno.stat(p).catch(() => null)) !== null;
}

/** Drops the page cache (root only, through sh: Deno refuses /proc writes); true when it worked. */
export function dropCaches(): boolean {
  const out = new Deno.Command("sh", { args: ["-c", "sync && echo 3 > /proc/sys/vm/drop_caches"] })
    .outputSync();
  return out.code === 0;
}

/** The median (the mean of the middle two for an even count). */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}
