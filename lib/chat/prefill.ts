/**
 * The prefill of a chat turn at a terminal: one line, redrawn in place as the model's layers
 * go by, with the prompt tokens done (estimated from the layers: a pass runs every layer for
 * all of its tokens), and an ETA once it means something. At full size a long message
 * prefills for minutes; without it the chat would look hung.
 */
import { etaSeconds, formatEta } from "../io/progress.ts";

/** Seconds between redraws. */
const REDRAW_EVERY = 0.1;
const WIDTH = 20;

/** One turn's prefill as it runs. */
interface Running {
  head: string;
  /** Prompt tokens to run (not reused). */
  todo: number;
  /** Layer starts expected: every layer of every pass. */
  expected: number;
  seen: number;
  t0: number;
  lastDraw: number;
}

/** Draws a turn's prefill progress; fed by the model's per-layer hook. */
export class PrefillMeter {
  #run?: Running;

  /**
   * `layers`: layers per pass; `passTokens`: prompt tokens per pass (the plan's whole pass);
   * `write`: the terminal (stderr).
   */
  constructor(
    readonly layers: number,
    readonly passTokens: number,
    readonly write: (text: string) => void,
  ) {}

  /** A turn's prefill starts: `head` names it, `todo` prompt tokens are to run. */
  begin(head: string, todo: number): void {
    this.#run = undefined;
    if (todo <= 0) return this.write(`${head}\n`);
    const passes = Math.ceil(todo / Math.max(1, this.passTokens));
    const now = performance.now() / 1000;
    this.#run = { head, todo, expected: passes * this.layers, seen: 0, t0: now, lastDraw: now };
    this.#draw();
  }

  /** A layer of a pass starts (any pass: only those of a running prefill count). */
  layer(): void {
    const run = this.#run;
    if (!run) return;
    run.seen++;
    if (performance.now() / 1000 - run.lastDraw >= REDRAW_EVERY) this.#draw();
  }

  /** The first token came, or the turn ended without one: the line ends, with the time. */
  end(interrupted = false): void {
    const run = this.#run;
    if (!run) return;
    this.#run = undefined;
    const seconds = performance.now() / 1000 - run.t0;
    const how = interrupted ? "prefill interrupted after" : "prefilled in";
    this.write(`\r\x1b[K${run.head}, ${how} ${formatEta(seconds)}\n`);
  }

  #draw(): void {
    const run = this.#run!;
    const now = performance.now() / 1000;
    run.lastDraw = now;
    // A layer's start means the layers before it are done.
    const share = Math.min(1, Math.max(0, run.seen - 1) / run.expected);
    const done = Math.floor(share * run.todo);
    const filled = Math.round(share * WIDTH);
    const eta = etaSeconds(now - run.t0, done, run.todo);
    this.write(
      `\r\x1b[K${run.head}: prefill [${"#".repeat(filled)}${".".repeat(WIDTH - filled)}] ` +
        `${done}/${run.todo}${eta === undefined ? "" : ` ETA ${formatEta(eta)}`}`,
    );
  }
}
