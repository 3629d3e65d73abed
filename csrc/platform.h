/* What libk3 asks of the operating system, in one place: Linux (and other POSIX systems),
 * macOS and Windows (mingw-w64) each answer in their own section of platform.c; nothing else
 * in csrc/ names an OS. Sizes and offsets are 64-bit everywhere (Windows' plain stat is
 * 32-bit). Errors come back as -errno on every system (Windows codes are mapped). */
#ifndef K3_PLATFORM_H
#define K3_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

/* Alignment of k3_alloc's blocks: a page, and what unbuffered reads need of their buffers,
 * offsets and sizes (O_DIRECT on Linux, FILE_FLAG_NO_BUFFERING's sector multiple on Windows;
 * macOS's F_NOCACHE needs none). */
#define K3_PAGE 4096

/* CPUs this process may run on (at least 1). */
int k3_cpu_count(void);

/* `bytes` (a multiple of K3_PAGE) aligned to K3_PAGE, or NULL. Free with k3_os_free_pages
 * (Windows' aligned blocks need _aligned_free, never free). */
void *k3_os_alloc_pages(size_t bytes);
void k3_os_free_pages(void *p);

/* Opens a UTF-8 path read-only; direct != 0 asks to bypass the page cache (O_DIRECT,
 * F_NOCACHE, FILE_FLAG_NO_BUFFERING), buffered when the file system refuses. fd or -errno. */
int k3_os_open_read(const char *path, int direct);
int k3_os_close(int fd);
/* The open file's size in bytes, or -errno. */
int64_t k3_os_file_size(int fd);
/* One positional read of at most `nbytes` at `offset`: the count read (0 at end of file) or
 * -errno. Interrupted reads are retried here. Does not move any shared file position. */
int64_t k3_os_pread(int fd, void *dst, int64_t nbytes, int64_t offset);
/* True when reads of fd must keep K3_PAGE alignment (opened direct on Linux or Windows). */
int k3_os_read_aligned(int fd);

/* Peak resident set (Windows: peak working set) of this process in bytes, or -errno. */
int64_t k3_os_peak_rss(void);
/* Memory the system could give this process now without swapping, in bytes, or -1. */
int64_t k3_os_mem_available(void);
/* A memory limit put on this process's group (Linux cgroup), in bytes, or -1 when none. */
int64_t k3_os_memory_limit(void);

#endif
