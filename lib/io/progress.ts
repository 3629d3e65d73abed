/**
 * A one-line progress bar on stderr with rate and ETA. On a terminal it redraws in place;
 * otherwise it prints a line at most every `every` seconds (and at the end), so logs stay short.
 */

const encoder = new TextEncoder();

/** Seconds as "1m05s" / "12.3s". */
function formatEta(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "?";
  if (seconds < 60) return `${seconds.toFixed(1)}s`;
  const m = Math.floor(seconds / 60), s = Math.round(seconds % 60);
  return `${m}m${String(s).padStart(2, "0")}s`;
}

export class ProgressBar {
  #t0 = performance.now();
  #lastPrint = -Infinity;
  readonly #tty = Deno.stderr.isTerminal();

  constructor(readonly label: string, readonly every = 2) {}

  /**
   * Shows `done` of `total` units; `detail` is appended (e.g. "1.2 GB/s"). The ETA assumes
   * the rate so far holds.
   */
  update(done: number, total: number, detail = ""): void {
    const seconds = (performance.now() - this.#t0) / 1000;
    const finished = done >= total;
    if (!this.#tty && !finished && seconds - this.#lastPrint < this.every) return;
    this.#lastPrint = seconds;
    const width = 24, filled = Math.round((width * done) / Math.max(1, total));
    const eta = done > 0 ? (seconds * (total - done)) / done : NaN;
    const line = `${this.label} [${"#".repeat(filled)}${".".repeat(width - filled)}] ` +
      `${done}/${total}${detail ? ` ${detail}` : ""} ${
        finished ? `in ${formatEta(seconds)}` : `ETA ${formatEta(eta)}`
      }`;
    const text = this.#tty ? `\r\x1b[K${line}${finished ? "\n" : ""}` : `${line}\n`;
    Deno.stderr.writeSync(encoder.encode(text));
  }

  /** Seconds since the bar started. */
  get seconds(): number {
    return (performance.now() - this.#t0) / 1000;
  }
}
