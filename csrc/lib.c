/* Library identity and the thread count. */
#include "k3.h"

#ifdef _OPENMP
#include <omp.h>
#endif

const char *k3_version(void) { return "libk3 0.1.0"; }

int k3_num_threads(void) {
#ifdef _OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}
