/* MoE routing (MODEL.md §4.8 steps 1-3: ties to the lower id, a non-finite score stops the
 * run) and the weighted combine. */
#include "k3.h"
#include "parallel.h"

#include <math.h>
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
 * 1 <= k <= E; `score` and `choice` are caller scratch of E floats. Returns 0, or -1 when a
 * logit or a choice is not finite: then ids are 0..k-1 and weights 0 (in range, but the
 * caller must stop the run). */
static int k3_route_token(int32_t *ids, float *weights, float *score, float *choice,
                          const float *logits, const float *bias, int E, int k, int renorm,
                          float scale) {
  int finite = 1;
  for (int e = 0; e < E; e++) {
    score[e] = k3_sigmoidf(logits[e]);
    choice[e] = score[e] + bias[e];
    finite &= isfinite(logits[e]) && isfinite(choice[e]);
  }
  int prev = -1;
  for (int j = 0; j < k && finite; j++) {
    int best = -1;
    for (int e = 0; e < E; e++) {
      if (prev >= 0 && !k3_ranks_before(choice[prev], prev, choice[e], e)) continue;
      if (best < 0 || k3_ranks_before(choice[e], e, choice[best], best)) best = e;
    }
    if (best < 0) finite = 0; /* cannot happen with finite values and k <= E; never -1 out */
    ids[j] = best;
    prev = best;
  }
  if (!finite) {
    for (int j = 0; j < k; j++) {
      ids[j] = j;
      weights[j] = 0.0f;
    }
    return -1;
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
  return 0;
}

typedef struct {
  int32_t *ids;
  float *weights;
  const float *logits, *bias;
  int E, k, renorm;
  float scale;
  int bad; /* 1 once any token's values were not finite */
} k3_router_job;

static void k3_router_tokens(void *ctx, int64_t t0, int64_t t1) {
  k3_router_job *j = (k3_router_job *)ctx;
  float score[K3_MAX_EXPERTS], choice[K3_MAX_EXPERTS];
  for (int64_t t = t0; t < t1; t++) {
    if (k3_route_token(j->ids + t * j->k, j->weights + t * j->k, score, choice,
                       j->logits + t * j->E, j->bias, j->E, j->k, j->renorm, j->scale) != 0) {
      __atomic_store_n(&j->bad, 1, __ATOMIC_RELAXED);
    }
  }
}

/* Router over logits [T][E] with selection bias [E]; ids, weights [T][k]. Threads split
 * tokens. Returns 0, -1 when any token's values were not finite, or -2 for sizes outside 1 <= k <= E <= K3_MAX_EXPERTS (nothing written). */
int k3_router_topk(int32_t *ids, float *weights, const float *logits, const float *bias, int E,
                   int k, int renorm, float scale, int T) {
  if (E < 1 || E > K3_MAX_EXPERTS || k < 1 || k > E || T < 0) return -2;
  k3_router_job job = {ids, weights, logits, bias, E, k, renorm, scale, 0};
  k3_parallel_for(T, (int64_t)T * E >= 65536, k3_router_tokens, &job);
  return job.bad ? -1 : 0;
}

/* acc[i] = sequential fma over j < k of w[j] * y[j][i], from 0; y is [k][n]. */
void k3_moe_combine(float *acc, const float *y, const float *w, int k, int n) {
  k3_simd()->wsum(acc, w, y, n, k, n, 1);
}
