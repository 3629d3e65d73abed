/**
 * Drafters guess the tokens that follow a context; the target model checks a guess in one
 * verify pass (lib/generate/decode.ts). A drafter can only change how many tokens a pass emits,
 * never which tokens: every emitted token is the target's own choice.
 *
 * The decode loop sees nothing but this interface, so a draft model (a smaller checkpoint
 * with the same vocabulary) is one more implementation of `Drafter`.
 */

/** A guess at the next tokens. */
export interface Draft {
  tokens: number[];
  /**
   * What kind of guess this is (for example "ngram:3"): the drafting policy learns how often
   * each kind is right, so weak guesses stop costing verify positions.
   */
  kind: string;
}

/** Proposes tokens for one generation (one prompt and its output). */
export interface Drafter {
  /**
   * Up to `max` tokens that may follow `context` (the prompt, then everything generated so
   * far). Between calls the context only grows by the tokens that were emitted.
   */
  propose(context: readonly number[], max: number): Draft | Promise<Draft>;
}

/** No guess. */
export const NO_DRAFT: Draft = { tokens: [], kind: "none" };

/** Options of {@link NgramDrafter}. */
interface NgramOptions {
  /** Longest suffix looked up (default 4). */
  maxNgram?: number;
  /** Shortest suffix looked up (default 1). */
  minNgram?: number;
}

/**
 * Prompt lookup: find the most recent earlier occurrence of the longest suffix of the
 * context (maxNgram tokens down to minNgram) and propose what followed it. Costs no weights.
 * When the continuation runs into the end of the context, the match is periodic and the
 * guess repeats the period ("a b a b" proposes "a b a ...").
 */
export class NgramDrafter implements Drafter {
  readonly #max: number;
  readonly #min: number;
  /** The indexed context. */
  #tokens: number[] = [];
  /** Per length n: n-gram key -> index just past its most recent occurrence. */
  #last: Map<string, number>[] = [];
  /** N-grams ending before this index are indexed (the suffix itself never is). */
  #indexed = 0;

  constructor(options: NgramOptions = {}) {
    this.#max = options.maxNgram ?? 4;
    this.#min = options.minNgram ?? 1;
    if (!(this.#min >= 1 && this.#max >= this.#min && Number.isInteger(this.#max))) {
      throw new Error(`bad n-gram range ${this.#min}..${this.#max}`);
    }
    this.#reset();
  }

  propose(context: readonly number[], max: number): Draft {
    this.#sync(context);
    const n0 = context.length;
    if (max <= 0) return NO_DRAFT;
    for (let n = Math.min(this.#max, n0 - 1); n >= this.#min; n--) {
      const at = this.#last[n].get(key(context, n0 - n, n0));
      if (at === undefined) continue;
      const tokens: number[] = [];
      for (let j = 0; j < max; j++) {
        const src = at + j;
        tokens.push(src < n0 ? context[src] : tokens[src - n0]);
      }
      return { tokens, kind: `ngram:${n}` };
    }
    return NO_DRAFT;
  }

  #reset(): void {
    this.#tokens = [];
    this.#indexed = 0;
    this.#last = Array.from({ length: this.#max + 1 }, () => new Map());
  }

  /** Indexes the n-grams of `context` that end before its last token. */
  #sync(context: readonly number[]): void {
    const known = this.#tokens.length;
    if (context.length < known || (known > 0 && context[known - 1] !== this.#tokens[known - 1])) {
      this.#reset();
    }
    for (let i = this.#tokens.length; i < context.length; i++) this.#tokens.push(context[i]);
    // An n-gram ending at e (exclusive) is indexed once e < length: the suffix ending at the
    // context's end must find an earlier occurrence, not itself.
    for (let e = this.#indexed + 1; e < context.length; e++) {
      for (let n = this.#min; n <= this.#max && n <= e; n++) {
        this.#last[n].set(key(this.#tokens, e - n, e), e);
      }
      this.#indexed = e;
    }
  }
}

function key(tokens: readonly number[], from: number, to: number): string {
  return tokens.slice(from, to).join(",");
}

/** Drafts given in advance, position by position (tests and benchmarks: known-right or -wrong). */
export class ScriptedDrafter implements Drafter {
  /**
   * `script(context, max)` returns the guess for a context; `kind` labels it for the policy.
   */
  constructor(
    readonly script: (context: readonly number[], max: number) => number[],
    readonly kind = "scripted",
  ) {}

  propose(context: readonly number[], max: number): Draft {
    return { tokens: this.script(context, max).slice(0, Math.max(0, max)), kind: this.kind };
  }
}
