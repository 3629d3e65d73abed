/* MoE routing (SPEC 4.8 steps 1-3, project decisions 9 and 10) and the weighted combine. */
#include "k3.h"
#include "reduce.h"
#include "simd.h"

/* True when expert a (choice ca) is picked before expert b (choice cb): larger choice
 * first, ties to the lower id. */
static int k3_ranks_before(float ca, int a, float cb, int b) {
  return ca > cb || (ca == cb && a < b);
}

/* One token. choice[e] = sigmoid(logit[e]) + bias[e]; the k best are found in rank order
 * (each pass takes the best expert ranked after the previous pick), their weights are the
 * unbiased sigmoids, summed sequentially in that order for the renorm w / (sum + 1e-20),
 * times scale; finally the (id, weight) pairs are sorted by ascending id. Requires
 * 1 <= k <= E; `score` and `choice` are caller scratch of E floats. */
static void k3_route_token(int32_t *ids, float *weights, float *score, float *choice,
                           const float *logits, const float *bias, int E, int k, int renorm,
                           float scale) {
  for (int e = 0; e < E; e++) {
    score[e] = k3_sigmoidf(logits[e]);
    choice[e] = score[e] + bias[e];
  }
  int prev = -1;
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      if (prev >= 0 && !k3_ranks_before(choice[prev], prev, choice[e], e)) continue;
      if (best < 0 || k3_ranks_before(choice[e], e, choice[best], best)) best = e;
    }
    ids[j] = best;
    prev = best;
  }
  float sum = 0.0f;
  for (int j = 0; j < k; j++) {
    weights[j] = score[ids[j]];
    sum += weights[j];
  }
  for (int j = 0; j < k; j++) {
    if (renorm) weights[j] /= sum + 1e-20f;
    weights[j] *= scale;
  }
  for (int j = 1; j < k; j++) { /* insertion sort by id: k is small */
    const int32_t id = ids[j];
    const float w = weights[j];
    int i = j;
    for (; i > 0 && ids[i - 1] > id; i--) {
      ids[i] = ids[i - 1];
      weights[i] = weights[i - 1];
    }
    ids[i] = id;
    weights[i] = w;
  }
}

/* Router over logits [T][E] with selection bias [E]; ids, weights [T][k]. Threads split
 * tokens. */
void k3_router_topk(int32_t *ids, float *weights, const float *logits, const float *bias,
                    int E, int k, int renorm, float scale, int T) {
#pragma omp parallel for schedule(static) if ((int64_t)T * E >= 65536)
  for (int t = 0; t < T; t++) {
    float score[E], choice[E];
    k3_route_token(ids + (int64_t)t * k, weights + (int64_t)t * k, score, choice,
                   logits + (int64_t)t * E, bias, E, k, renorm, scale);
  }
}

/* acc[i] = sequential fma over j < k of w[j] * y[j][i], from 0; y is [k][n]. */
void k3_moe_combine(float *acc, const float *y, const float *w, int k, int n) {
  k3_simd()->wsum(acc, w, y, n, k, n, 1);
}
