/* Loads libk3.dll the way Deno's FFI does (LoadLibrary + GetProcAddress, no import library)
 * and exercises the platform layer: reads at offsets past 4 GiB of a sparse file whose path
 * is argv[1] (64-bit sizes and OVERLAPPED offsets), buffered and unbuffered, a read into a
 * block it did not allocate (refused), the memory numbers, and a free of every block
 * (_aligned_free). Prints one "name value" line per fact; the test compares them. */
#include <windows.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef const char *(*str_fn)(void);
typedef int (*int_fn)(void);
typedef int64_t (*i64_fn)(void);
typedef void *(*alloc_fn)(int64_t);
typedef void (*free_fn)(void *);
typedef int (*open_fn)(const char *, int);
typedef int (*close_fn)(int);
typedef int64_t (*size_fn)(int);
typedef int64_t (*pread_fn)(int, void *, int64_t, int64_t);

typedef void (*any_fn)(void); /* the generic function pointer C lets us cast to and from */

static any_fn need(HMODULE lib, const char *name) {
  FARPROC f = GetProcAddress(lib, name);
  if (!f) {
    printf("missing %s\n", name);
    exit(3);
  }
  return (any_fn)f;
}

/* Reads 4096 bytes at `offset` through a fresh fd (direct or not); prints the count and
 * the first bytes as text. */
static void read_at(HMODULE lib, const char *file, int direct, int64_t offset) {
  open_fn k3_open_read = (open_fn)need(lib, "k3_open_read");
  pread_fn k3_pread_full = (pread_fn)need(lib, "k3_pread_full");
  char *buf = ((alloc_fn)need(lib, "k3_alloc"))(8192);
  int fd = k3_open_read(file, direct);
  printf("open direct=%d ok=%d (%d)\n", direct, fd >= 0, fd);
  int64_t got = k3_pread_full(fd, buf, offset, 4096);
  printf("read direct=%d offset=%lld got=%lld text=%.8s\n", direct, (long long)offset,
         (long long)got, buf);
  printf("size %lld\n", (long long)((size_fn)need(lib, "k3_file_size"))(fd));
  char stack[4096];
  printf("foreign-buffer %lld\n", (long long)k3_pread_full(fd, stack, 0, 16));
  ((close_fn)need(lib, "k3_close"))(fd);
  ((free_fn)need(lib, "k3_free"))(buf);
}

int main(int argc, char **argv) {
  if (argc < 2) return 2;
  HMODULE lib = LoadLibraryA("libk3.dll");
  if (!lib) {
    printf("LoadLibrary failed %lu\n", (unsigned long)GetLastError());
    return 3;
  }
  printf("version %s\n", ((str_fn)need(lib, "k3_version"))());
  printf("isa %s\n", ((str_fn)need(lib, "k3_isa"))());
  printf("threads %d\n", ((int_fn)need(lib, "k3_num_threads"))());
  const int64_t past4g = ((int64_t)5 << 30) - 4096;
  read_at(lib, argv[1], 0, past4g);
  read_at(lib, argv[1], 1, past4g);
  printf("missing-file %d\n", ((open_fn)need(lib, "k3_open_read"))("Z:\\no\\such\\file", 0));
  printf("peak-rss-positive %d\n", ((i64_fn)need(lib, "k3_peak_rss_bytes"))() > 0);
  printf("mem-available-positive %d\n", ((i64_fn)need(lib, "k3_mem_available_bytes"))() > 0);
  printf("cgroup %lld\n", (long long)((i64_fn)need(lib, "k3_cgroup_memory_max_bytes"))());
  return 0;
}
