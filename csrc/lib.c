/* Library identity and the thread count. */
#include "k3.h"
#include "parallel.h"

/* The version names the thread backend too: the pool and OpenMP builds give the same bytes,
 * but a report should say which one ran. */
#ifdef _OPENMP
const char *k3_version(void) { return "libk3 0.1.0 (openmp)"; }
#else
const char *k3_version(void) { return "libk3 0.1.0 (pool)"; }
#endif

int k3_num_threads(void) { return k3_team_size(); }
