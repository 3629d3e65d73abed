/**
 * How many prompt tokens a batched forward pass takes: the one rule the Batcher sizes every
 * pass by, from what passes have been measured to cost.
 *
 * A pass costs about max(read, fixed + perToken x T): the streamed trunk (and the experts) it
 * reads, which does not depend on its T tokens, overlapped with the compute of those tokens.
 * Decode steps and verify passes always run whole (every stream gets its token each pass);
 * the question is how many prompt tokens ride along.
 *
 * - No step waits on the pass (a lone prompt, or only prompts): every prompt token, up to
 *   one pass of the forward (`cap`, what the plan's scratch holds). Nobody's stream is held
 *   up, and each pass reads the trunk again, so a prompt that fits is one pass.
 * - A fixed budget (`k3 serve --pass-tokens N`): the steps, then prompt tokens up to N, a
 *   quarter of N at least so the prompt always moves.
 * - By cost, before anything has been measured: the same, with the default budget.
 * - By cost, measured: the prompt may add at most as much compute as the pass already costs
 *   without it. That cost, F = max(read, fixed + perToken x steps), is what the streams pay
 *   anyway; prompt tokens whose compute fits in F make the pass at most about twice as long
 *   as the streams' own (and on a streamed trunk, where compute hides under the reads, little
 *   longer at all), while the prompt spends at least half of every pass computing instead of
 *   waiting for a trunk read only the streams needed. So floor(F / perToken) prompt tokens,
 *   at least one, and never more than `cap` less the steps: past it the forward cuts the call
 *   into several passes, each reading the trunk again, and the streams would wait for all.
 */
import { takeSnapshot } from "../memory/stats.ts";

/** One pass, measured: tokens, wall seconds, and the seconds spent reading and stalled. */
export interface PassSample {
  tokens: number;
  seconds: number;
  /** Seconds with a read in flight during the pass (trunk pieces, experts). */
  readSeconds: number;
  /** Seconds the compute was blocked waiting for a read. */
  stallSeconds: number;
}

/** What a pass costs, fitted from samples. */
export interface PassCosts {
  /** Reading seconds per pass (independent of its tokens). */
  readSeconds: number;
  /** Compute seconds per pass whatever its tokens (per-pass overheads). */
  fixedSeconds: number;
  /** Compute seconds per token. */
  tokenSeconds: number;
}

/**
 * Tokens per pass next to other requests' steps until a pass has been measured (and the
 * fixed budget unless the caller gives one). On the tiny test model a 64-token pass costs
 * about 16 decode steps.
 */
export const DEFAULT_PASS_TOKENS = 64;

/** Passes kept for the fit: enough to see both decode-only and prompt-carrying passes. */
export const COST_WINDOW = 32;

/**
 * Fits compute = fixed + perToken x tokens (least squares over the samples; compute = wall
 * minus stalls) and the mean read seconds. With one token count only (no spread to separate
 * the two), the whole compute is charged per token: that overstates the per-token cost, so
 * the rule errs toward smaller prompt shares until a prompt-carrying pass is measured.
 */
export function fitCosts(samples: readonly PassSample[]): PassCosts | undefined {
  const usable = samples.filter((s) => s.tokens > 0 && s.seconds >= 0);
  if (usable.length === 0) return undefined;
  const n = usable.length;
  const compute = usable.map((s) => Math.max(0, s.seconds - s.stallSeconds));
  const readSeconds = usable.reduce((a, s) => a + Math.max(0, s.readSeconds), 0) / n;
  const mt = usable.reduce((a, s) => a + s.tokens, 0) / n;
  const mc = compute.reduce((a, c) => a + c, 0) / n;
  let stt = 0, stc = 0;
  usable.forEach((s, i) => {
    stt += (s.tokens - mt) ** 2;
    stc += (s.tokens - mt) * (compute[i] - mc);
  });
  const slope = stt > 0 ? stc / stt : 0;
  if (stt === 0 || slope <= 0) {
    return { readSeconds, fixedSeconds: 0, tokenSeconds: mc / mt };
  }
  return { readSeconds, fixedSeconds: Math.max(0, mc - slope * mt), tokenSeconds: slope };
}

/** What the rule needs to size one pass. */
export interface BudgetInput {
  /** Decode-step and verify tokens already in the pass (run whole). */
  stepTokens: number;
  /** The configured budget (tokens per pass): fixed, or until costs are measured. */
  configured: number;
  /** Size by measured costs (false: the configured budget is fixed). */
  byCost: boolean;
  /** Most tokens one pass of the forward holds (its scratch). */
  cap: number;
  costs?: PassCosts;
}

/** Prompt tokens this pass may take (see the module comment). */
export function promptRoom(input: BudgetInput): number {
  const { stepTokens, configured, cap, costs } = input;
  if (stepTokens === 0) return cap;
  // The fixed budget: what is left of it after the steps, a quarter of it at least.
  const fixed = Math.max(configured - stepTokens, Math.ceil(configured / 4));
  if (!input.byCost || !costs || !(costs.tokenSeconds > 0)) return fixed;
  const without = Math.max(
    costs.readSeconds,
    costs.fixedSeconds + costs.tokenSeconds * stepTokens,
  );
  // Never below the fixed budget: a prompt beside streams goes at least as fast as with
  // --pass-tokens; where reads dominate (a streamed trunk) the cost rule gives it far more.
  const room = Math.max(fixed, Math.floor(without / costs.tokenSeconds));
  return Math.min(room, Math.max(1, cap - stepTokens));
}

/** The samples of the last passes and the costs fitted from them. */
export class PassBudget {
  #samples: PassSample[] = [];
  #costs?: PassCosts;

  constructor(readonly configured: number, readonly byCost: boolean) {}

  /** Records a pass that ran. */
  observe(sample: PassSample): void {
    this.#samples.push(sample);
    if (this.#samples.length > COST_WINDOW) this.#samples.shift();
    this.#costs = fitCosts(this.#samples);
  }

  /** The fitted costs (undefined before any pass). */
  get costs(): PassCosts | undefined {
    return this.#costs;
  }

  /** Prompt tokens the next pass may take next to `stepTokens` step tokens. */
  room(stepTokens: number, cap: number): number {
    return promptRoom({
      stepTokens,
      configured: this.configured,
      byCost: this.byCost,
      cap,
      costs: this.#costs,
    });
  }
}

/** Cumulative counters a pass is measured with (seconds since the model opened). */
export interface PassCounters {
  readSeconds: number;
  stallSeconds: number;
}

/** The model's read and stall counters now (zeros for a resident model: it never reads). */
export function passCounters(model: Parameters<typeof takeSnapshot>[0]): PassCounters {
  const s = takeSnapshot(model);
  return { readSeconds: s.io?.anySeconds ?? 0, stallSeconds: s.trunkWait + s.expertWait };
}

/** A pass's sample from its tokens, wall seconds and the counters around it. */
export function passSample(
  tokens: number,
  seconds: number,
  before?: PassCounters,
  after?: PassCounters,
): PassSample {
  const d = (k: keyof PassCounters) => before && after ? Math.max(0, after[k] - before[k]) : 0;
  return { tokens, seconds, readSeconds: d("readSeconds"), stallSeconds: d("stallSeconds") };
}
