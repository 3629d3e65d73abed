/**
 * One status line for a whole download or verify (done / total, bytes/s over the last ten
 * seconds, ETA, files): redrawn in place on a terminal; elsewhere (a pipe, a log file) a
 * line every `every` seconds when asked for, else nothing. Detail lines print above it.
 */

const encoder = new TextEncoder();

/** Bytes as "1.56 TB" / "812.30 MB" (powers of 1000, as the Hub shows sizes). */
export function formatSize(n: number): string {
  const units = ["B", "kB", "MB", "GB", "TB"];
  let u = 0;
  while (Math.abs(n) >= 1000 && u < units.length - 1) n /= 1000, u++;
  return `${n.toFixed(u === 0 ? 0 : 2)} ${units[u]}`;
}

/** Seconds as "42s", "10m12s", "5h12m", "2d03h" (downloads of 1.56 TB take days). */
export function formatDuration(s: number): string {
  if (!Number.isFinite(s) || s < 0) return "?";
  const two = (n: number) => String(Math.floor(n)).padStart(2, "0");
  if (s < 60) return `${Math.round(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${two(s % 60)}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${two((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d${two((s % 86400) / 3600)}h`;
}

interface LineSource {
  /** Bytes done so far (including what was on disk before) and the total. */
  done(): number;
  total(): number;
  /** Bytes moved by this run (the rate is computed from these). */
  moved(): number;
  /** Extra text, e.g. "files 3/9". */
  extra(): string;
}

export class StatusLine {
  readonly #tty: boolean;
  readonly #samples: { t: number; moved: number }[] = [];
  readonly #t0 = performance.now() / 1000;
  #timer?: ReturnType<typeof setInterval>;
  #shown = false;

  /** `every`: seconds between lines when not a terminal (0: none). */
  constructor(
    readonly label: string,
    readonly src: LineSource,
    tty = Deno.stderr.isTerminal(),
    readonly every = 0,
  ) {
    this.#tty = tty;
  }

  start(): void {
    if (this.#tty) this.#timer = setInterval(() => this.#draw(), 250);
    else if (this.every > 0) {
      this.#timer = setInterval(
        () => Deno.stderr.writeSync(encoder.encode(`${this.text()}\n`)),
        this.every * 1000,
      );
    }
  }

  /** Bytes per second over the last ten seconds (since the start, before that). */
  rate(): number {
    const now = performance.now() / 1000, moved = this.src.moved();
    this.#samples.push({ t: now, moved });
    while (this.#samples.length > 2 && now - this.#samples[1].t > 10) this.#samples.shift();
    const first = this.#samples[0];
    const dt = now - first.t;
    return dt > 0.2 ? (moved - first.moved) / dt : moved / Math.max(1e-3, now - this.#t0);
  }

  text(): string {
    const done = this.src.done(), total = this.src.total();
    const rate = this.rate();
    const pct = total > 0 ? (100 * done) / total : 100;
    const eta = rate > 0 && this.seconds >= 1 ? formatDuration((total - done) / rate) : "?";
    return `${this.label}: ${formatSize(done)} / ${formatSize(total)} (${pct.toFixed(1)}%)  ` +
      `${formatSize(rate)}/s  ETA ${eta}  ${this.src.extra()}`;
  }

  #draw(): void {
    Deno.stderr.writeSync(encoder.encode(`\r\x1b[K${this.text()}`));
    this.#shown = true;
  }

  /** A detail line, printed above the status line. */
  print(line: string): void {
    const clear = this.#shown ? "\r\x1b[K" : "";
    Deno.stderr.writeSync(encoder.encode(`${clear}${line}\n`));
    if (this.#shown) this.#draw();
  }

  /** Stops redrawing and leaves the last state on its own line (terminal only). */
  stop(): void {
    if (this.#timer === undefined) return;
    clearInterval(this.#timer);
    this.#timer = undefined;
    if (this.#tty) Deno.stderr.writeSync(encoder.encode(`\r\x1b[K${this.text()}\n`));
    this.#shown = false;
  }

  /** Seconds since start. */
  get seconds(): number {
    return performance.now() / 1000 - this.#t0;
  }
}
