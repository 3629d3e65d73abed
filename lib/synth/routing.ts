/**
 * Router selection biases for synthetic checkpoints. With random routers every token picks
 * its experts almost uniformly, so a prompt touches far more experts than the real model's
 * would. `skewed` gives each MoE layer a Zipf-like popularity: the layer's experts are put in
 * a random order (its own per layer), and the expert at rank r gets the selection bias
 * -strength * ln(1 + r) / ln(E). Bias only moves the choice, never the combine weights
 * (MODEL.md §4.8: the weights are the unbiased sigmoids), so the numbers a token computes keep
 * their scale; what changes is how often the same experts come back.
 *
 * The strength is calibrated against a trace of the real model (bench/routing.ts prints
 * the calibration): 12 distinct token positions, 16 picks each, touched ~109 distinct experts
 * per layer where uniform routing touches ~174.
 */
import type { XorShift128 } from "./numerics.ts";

/** How the synthetic routers pick experts. */
export type Routing = "uniform" | "skewed";
export const ROUTINGS: readonly Routing[] = ["uniform", "skewed"];

/**
 * Bias spread of `skewed`: the least popular expert trails the most popular by this much
 * (sigmoid scores lie in (0, 1); a token's best logits sit near sigmoid(2..3), ~0.1 apart).
 * bench/routing.ts fits 0.544 for 12 tokens -> 109 experts (N(0, 1) logits, 200 layers);
 * measured on the full-size layout's own routers, 12 tokens touch 114 (layers 1-2).
 */
export const SKEWED_STRENGTH = 0.54;

/**
 * Fills `out` (one layer's E biases) with the skewed profile: a random permutation of the
 * experts drawn from `rng` (Fisher-Yates), expert perm[r] biased by -strength*ln(1+r)/ln(E).
 */
export function fillSkewedBias(
  rng: XorShift128,
  out: Float32Array,
  strength = SKEWED_STRENGTH,
): void {
  const E = out.length;
  const perm = Array.from({ length: E }, (_, i) => i);
  for (let i = E - 1; i > 0; i--) {
    const j = Math.floor(rng.nextUnit() * (i + 1));
    [perm[i], perm[j]] = [perm[j], perm[i]];
  }
  const scale = E > 1 ? strength / Math.log(E) : 0;
  // 0 - x, not -x: the most popular expert gets +0, never -0.
  for (let r = 0; r < E; r++) out[perm[r]] = 0 - scale * Math.log(1 + r);
}
