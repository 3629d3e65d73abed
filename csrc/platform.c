/* The OS-specific half of libk3 (platform.h): a Windows section (mingw-w64), then the POSIX
 * one shared by Linux and macOS, with each one's differences marked where they fall. */
#define _GNU_SOURCE
#include "platform.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)

#define PSAPI_VERSION 2 /* GetProcessMemoryInfo from kernel32: no psapi.dll dependency */
#include <windows.h>
#include <fcntl.h>
#include <io.h>
#include <malloc.h>
#include <psapi.h>

/* Which fds were opened unbuffered (Windows cannot be asked afterwards). CRT fds are small:
 * the CRT allows at most 8192 open at once. */
#define K3_MAX_FDS 8192
static volatile unsigned char fd_unbuffered[K3_MAX_FDS];

int k3_cpu_count(void) {
  DWORD n = GetActiveProcessorCount(ALL_PROCESSOR_GROUPS);
  return n > 0 ? (int)n : 1;
}

void *k3_os_alloc_pages(size_t bytes) { return _aligned_malloc(bytes, K3_PAGE); }

void k3_os_free_pages(void *p) { _aligned_free(p); }

/* errno for the calling thread's last Windows error. */
static int errno_from_windows(void) {
  switch (GetLastError()) {
  case ERROR_FILE_NOT_FOUND:
  case ERROR_PATH_NOT_FOUND:
  case ERROR_INVALID_NAME:
    return ENOENT;
  case ERROR_ACCESS_DENIED:
  case ERROR_SHARING_VIOLATION:
  case ERROR_LOCK_VIOLATION:
    return EACCES;
  case ERROR_INVALID_PARAMETER:
    return EINVAL; /* e.g. an unaligned unbuffered read */
  case ERROR_NOT_ENOUGH_MEMORY:
  case ERROR_OUTOFMEMORY:
    return ENOMEM;
  case ERROR_TOO_MANY_OPEN_FILES:
    return EMFILE;
  default:
    return EIO;
  }
}

static HANDLE open_handle(const wchar_t *wide, int direct) {
  /* Others may read, write, rename or delete the file meanwhile, as on POSIX. */
  const DWORD share = FILE_SHARE_READ | FILE_SHARE_WRITE | FILE_SHARE_DELETE;
  const DWORD flags = FILE_ATTRIBUTE_NORMAL | (direct ? FILE_FLAG_NO_BUFFERING : 0);
  return CreateFileW(wide, GENERIC_READ, share, NULL, OPEN_EXISTING, flags, NULL);
}

int k3_os_open_read(const char *path, int direct) {
  const int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, NULL, 0);
  if (n <= 0) return -EINVAL;
  wchar_t *wide = (wchar_t *)malloc(sizeof(wchar_t) * (size_t)n);
  if (!wide) return -ENOMEM;
  MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, path, -1, wide, n);
  HANDLE h = direct ? open_handle(wide, 1) : INVALID_HANDLE_VALUE;
  const int unbuffered = h != INVALID_HANDLE_VALUE;
  if (!unbuffered) h = open_handle(wide, 0);
  const int err = h == INVALID_HANDLE_VALUE ? errno_from_windows() : 0;
  free(wide);
  if (err) return -err;
  const int fd = _open_osfhandle((intptr_t)h, _O_RDONLY | _O_BINARY);
  if (fd < 0 || fd >= K3_MAX_FDS) {
    if (fd >= 0) _close(fd);
    else CloseHandle(h);
    return -EMFILE;
  }
  fd_unbuffered[fd] = (unsigned char)unbuffered;
  return fd;
}

int k3_os_close(int fd) {
  if (fd >= 0 && fd < K3_MAX_FDS) fd_unbuffered[fd] = 0;
  return _close(fd) == 0 ? 0 : -errno;
}

static HANDLE handle_of(int fd) { return (HANDLE)_get_osfhandle(fd); }

int64_t k3_os_file_size(int fd) {
  LARGE_INTEGER size;
  HANDLE h = handle_of(fd);
  if (h == INVALID_HANDLE_VALUE) return -EBADF;
  if (!GetFileSizeEx(h, &size)) return -errno_from_windows();
  return (int64_t)size.QuadPart;
}

/* ReadFile at an explicit offset (the OVERLAPPED fields), so that threads reading one handle
 * never race on a shared position. One call reads at most 1 GiB (its count is 32-bit). */
int64_t k3_os_pread(int fd, void *dst, int64_t nbytes, int64_t offset) {
  HANDLE h = handle_of(fd);
  if (h == INVALID_HANDLE_VALUE) return -EBADF;
  OVERLAPPED at;
  memset(&at, 0, sizeof at);
  at.Offset = (DWORD)((uint64_t)offset & 0xffffffffu);
  at.OffsetHigh = (DWORD)((uint64_t)offset >> 32);
  const DWORD want = (DWORD)(nbytes < ((int64_t)1 << 30) ? nbytes : ((int64_t)1 << 30));
  DWORD got = 0;
  if (!ReadFile(h, dst, want, &got, &at)) {
    if (GetLastError() == ERROR_HANDLE_EOF) return 0;
    return -errno_from_windows();
  }
  return (int64_t)got;
}

int k3_os_read_aligned(int fd) { return fd >= 0 && fd < K3_MAX_FDS && fd_unbuffered[fd]; }

int64_t k3_os_peak_rss(void) {
  PROCESS_MEMORY_COUNTERS pmc;
  if (!GetProcessMemoryInfo(GetCurrentProcess(), &pmc, sizeof pmc)) return -errno_from_windows();
  return (int64_t)pmc.PeakWorkingSetSize;
}

int64_t k3_os_mem_available(void) {
  MEMORYSTATUSEX ms;
  ms.dwLength = sizeof ms;
  if (!GlobalMemoryStatusEx(&ms)) return -1;
  return (int64_t)ms.ullAvailPhys;
}

/* Job-object limits are not read: k3's budget flags cover that case. */
int64_t k3_os_memory_limit(void) { return -1; }

#else /* POSIX: Linux, macOS */

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#if defined(__APPLE__)
#include <mach/mach.h>
#endif

int k3_cpu_count(void) {
#if defined(__linux__)
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
#endif
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

void *k3_os_alloc_pages(size_t bytes) {
  void *p = NULL;
  if (posix_memalign(&p, K3_PAGE, bytes) != 0) return NULL;
#ifdef MADV_HUGEPAGE
  if (bytes >= (size_t)2 << 20) madvise(p, bytes, MADV_HUGEPAGE);
#endif
  return p;
}

void k3_os_free_pages(void *p) { free(p); }

int k3_os_open_read(const char *path, int direct) {
  const int flags = O_RDONLY | O_CLOEXEC;
#if defined(O_DIRECT)
  if (direct) {
    int fd = open(path, flags | O_DIRECT);
    if (fd >= 0) return fd;
    if (errno != EINVAL) return -errno;
  }
#endif
  int fd = open(path, flags);
  if (fd < 0) return -errno;
#if defined(F_NOCACHE)
  /* macOS: no O_DIRECT; this keeps the reads out of the cache, with no alignment rules. */
  if (direct) fcntl(fd, F_NOCACHE, 1);
#else
  (void)direct;
#endif
  return fd;
}

int k3_os_close(int fd) { return close(fd) == 0 ? 0 : -errno; }

int64_t k3_os_file_size(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0) return -errno;
  return (int64_t)st.st_size;
}

int64_t k3_os_pread(int fd, void *dst, int64_t nbytes, int64_t offset) {
  for (;;) {
    ssize_t r = pread(fd, dst, (size_t)nbytes, (off_t)offset);
    if (r >= 0) return (int64_t)r;
    if (errno != EINTR) return -errno;
  }
}

int k3_os_read_aligned(int fd) {
#if defined(O_DIRECT)
  int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_DIRECT) != 0;
#else
  (void)fd;
  return 0;
#endif
}

int64_t k3_os_peak_rss(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return -errno;
#if defined(__APPLE__)
  return (int64_t)ru.ru_maxrss; /* bytes on macOS */
#else
  return (int64_t)ru.ru_maxrss * 1024; /* KiB on Linux */
#endif
}

#if defined(__APPLE__)

/* Free, inactive, purgeable and speculative pages: what macOS hands out without swapping. */
int64_t k3_os_mem_available(void) {
  vm_statistics64_data_t vm;
  mach_msg_type_number_t count = HOST_VM_INFO64_COUNT;
  if (host_statistics64(mach_host_self(), HOST_VM_INFO64, (host_info64_t)&vm, &count) !=
      KERN_SUCCESS) {
    return -1;
  }
  const uint64_t pages = (uint64_t)vm.free_count + vm.inactive_count + vm.purgeable_count +
                         vm.speculative_count;
  return (int64_t)(pages * (uint64_t)vm_page_size);
}

int64_t k3_os_memory_limit(void) { return -1; }

#else

/* The first number after `key` in the text file `path`, times `scale`; -1 when absent. */
static int64_t read_number(const char *path, const char *key, int64_t scale) {
  FILE *f = fopen(path, "r");
  if (!f) return -1;
  char line[256];
  int64_t out = -1;
  while (fgets(line, sizeof line, f)) {
    size_t k = strlen(key);
    if (strncmp(line, key, k) != 0) continue;
    char *end = NULL;
    long long v = strtoll(line + k, &end, 10);
    if (end != line + k) out = (int64_t)v * scale;
    break;
  }
  fclose(f);
  return out;
}

int64_t k3_os_mem_available(void) { return read_number("/proc/meminfo", "MemAvailable:", 1024); }

int64_t k3_os_memory_limit(void) {
  int64_t v2 = read_number("/sys/fs/cgroup/memory.max", "", 1);
  if (v2 > 0) return v2;
  int64_t v1 = read_number("/sys/fs/cgroup/memory/memory.limit_in_bytes", "", 1);
  /* cgroup v1 reports "no limit" as a huge page-rounded number. */
  if (v1 > 0 && v1 < ((int64_t)1 << 60)) return v1;
  return -1;
}

#endif
#endif
