/**
 * A one-line progress bar on stderr with rate and ETA. On a terminal it redraws one line in
 * place (at most ten times a second) and ends it once; otherwise it prints a line at most
 * every `every` seconds and one at the end, so a log of a short job holds one line.
 */

import { formatBytes } from "./sizes.ts";

const encoder = new TextEncoder();

/** An ETA before this many seconds and this share of the work is mostly noise. */
const ETA_AFTER_SECONDS = 1;
const ETA_AFTER_SHARE = 0.05;
/** Seconds between redraws at a terminal. */
const REDRAW_EVERY = 0.1;

/** Seconds as "1m05s" / "12.3s". */
export function formatEta(seconds: number): string {
  if (!Number.isFinite(seconds) || seconds < 0) return "?";
  if (seconds < 60) return `${seconds.toFixed(1)}s`;
  const m = Math.floor(seconds / 60), s = Math.round(seconds % 60);
  return `${m}m${String(s).padStart(2, "0")}s`;
}

/**
 * The time left if the rate so far holds, or undefined while it would be a guess (under a
 * second in, or under 5% done).
 */
export function etaSeconds(elapsed: number, done: number, total: number): number | undefined {
  if (elapsed < ETA_AFTER_SECONDS || total <= 0 || done / total < ETA_AFTER_SHARE) {
    return undefined;
  }
  return (elapsed * (total - done)) / done;
}

/** How a bar shows its counts, e.g. bytes as "1.20 GB". */
export interface BarOptions {
  /** Seconds between lines when stderr is not a terminal (default 10). */
  every?: number;
  /** The counts as text (default: the numbers as they are). */
  format?: (n: number) => string;
  /** Draw as at a terminal or not (default: whether stderr is one). */
  tty?: boolean;
  /** Where the text goes (default stderr). */
  write?: (text: string) => void;
}

export class ProgressBar {
  #t0 = performance.now();
  #lastPrint = -Infinity;
  #finished = false;
  readonly #tty: boolean;
  readonly #every: number;
  readonly #format: (n: number) => string;
  readonly #write: (text: string) => void;

  constructor(readonly label: string, options: BarOptions | number = {}) {
    const o = typeof options === "number" ? { every: options } : options;
    this.#tty = o.tty ?? Deno.stderr.isTerminal();
    this.#every = o.every ?? 10;
    this.#format = o.format ?? String;
    this.#write = o.write ?? ((text) => Deno.stderr.writeSync(encoder.encode(text)));
  }

  /**
   * Shows `done` of `total` units; `detail` is appended (e.g. "1.2 GB/s"). The line for
   * `done >= total` is the last one: later updates show nothing.
   */
  update(done: number, total: number, detail = ""): void {
    if (this.#finished) return;
    const seconds = this.seconds;
    const finished = done >= total;
    const gap = this.#tty ? REDRAW_EVERY : this.#every;
    // In a pipe the first line waits a full interval: a short job logs only its end.
    const last = this.#tty ? this.#lastPrint : Math.max(this.#lastPrint, 0);
    if (!finished && seconds - last < gap) return;
    this.#lastPrint = seconds;
    this.#finished = finished;
    const line = this.text(done, total, detail, seconds);
    this.#write(this.#tty ? `\r\x1b[K${line}${finished ? "\n" : ""}` : `${line}\n`);
  }

  /** The bar's text at `seconds` in. */
  text(done: number, total: number, detail: string, seconds = this.seconds): string {
    const width = 24;
    const filled = Math.min(width, Math.round((width * done) / Math.max(1, total)));
    const eta = etaSeconds(seconds, done, total);
    const when = done >= total
      ? ` in ${formatEta(seconds)}`
      : eta === undefined
      ? ""
      : ` ETA ${formatEta(eta)}`;
    return `${this.label} [${"#".repeat(filled)}${".".repeat(width - filled)}] ` +
      `${this.#format(Math.min(done, total))}/${this.#format(total)}` +
      `${detail ? ` ${detail}` : ""}${when}`;
  }

  /** Seconds since the bar started. */
  get seconds(): number {
    return (performance.now() - this.#t0) / 1000;
  }
}

/**
 * The loading bar of a model (bytes landed of what the memory plan loads), as `run`, `chat`
 * and `serve` show it; its clock starts with the first bytes.
 */
export function loadingBar(options: BarOptions = {}): (done: number, total: number) => void {
  let bar: ProgressBar | undefined;
  return (done, total) => {
    bar ??= new ProgressBar("loading", { format: formatBytes, ...options });
    bar.update(done, total);
  };
}
