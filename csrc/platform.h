/* What libk3 asks of the operating system, in one place: Linux and other POSIX systems,
 * macOS, and Windows (mingw-w64) each answer in platform.c. Nothing else in csrc/ names an
 * OS. Sizes and offsets are 64-bit everywhere (Windows' stat is 32-bit by default). */
#ifndef K3_PLATFORM_H
#define K3_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

/* CPUs this process may run on (at least 1). */
int k3_cpu_count(void);

#endif
