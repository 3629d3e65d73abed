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

/** The 1, 5 and 15 minute load averages, as printed beside every timing. */
export function loadAverage(): string {
  return Deno.loadavg().map((x) => x.toFixed(2)).join(" ");
}

/** The median (the mean of the middle two for an even count). */
export function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
}

/**
 * `n` distinct ordinary token ids of the full-size vocabulary, spread over it: on the
 * full-size layout a token's experts depend on its id alone, so a benchmark prompt of
 * repeated ids would measure the text, not the routers. 7,919 is prime and does not divide
 * 163,584, so the first 163,584 are distinct.
 */
export function distinctIds(n: number): number[] {
  return Array.from({ length: n }, (_, i) => (11 + 7919 * i) % 163_584);
}
