/* The SIMD path choice: the only global state in libk3, made once and read-only after. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "k3.h"

static pthread_once_t k3_isa_once = PTHREAD_ONCE_INIT;
static const char *k3_isa_name = "scalar";

/* K3_ISA=scalar forces the portable path. Otherwise the best path the CPU supports; only
 * the scalar path is built so far, so AVX2 / NEON detection goes below. */
static void k3_choose_isa(void) {
  const char *forced = getenv("K3_ISA");
  if (forced != NULL && strcmp(forced, "scalar") == 0) return;
  k3_isa_name = "scalar";
}

/* "scalar", "avx2" or "neon"; chosen on first use. */
const char *k3_isa(void) {
  pthread_once(&k3_isa_once, k3_choose_isa);
  return k3_isa_name;
}
