/* k3.exe: the Windows single executable. This launcher carries, appended to itself, a
 * gzip stream of files (deno.exe, the app, libk3.dll) and a trailer; the first start of a
 * version unpacks them under %LOCALAPPDATA%\k3\dist\<version> (%K3_HOME%\dist when set),
 * later starts go straight to running `deno run ... main.ts` with this process's arguments
 * (the command line's tail, passed verbatim so quoting survives exactly), and the launcher
 * exits with deno's exit code. Built by scripts/dist-all.sh; not part of libk3.
 *
 * Payload (after inflating): per file, u32 path length, the UTF-8 path ('/'-separated,
 * relative), u64 size, the bytes; a u32 0 ends it. Trailer (the last 40 bytes): "K3PACK01",
 * u64 payload offset, u64 payload length, 16 hex characters naming the version. */
#define UNICODE
#define _UNICODE
#include <windows.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>
#include <zlib.h>

#define TRAILER_BYTES 40
#define CHUNK (1 << 16)

/* Prints `what` and the last Windows error, and exits with 2 (k3's "bad input or setup"). */
static void die(const char *what) {
  fprintf(stderr, "k3: %s (Windows error %lu)\n", what, (unsigned long)GetLastError());
  exit(2);
}

typedef struct {
  HANDLE file;
  uint64_t left; /* compressed bytes not yet read */
  z_stream z;
  unsigned char in[CHUNK];
} payload_reader;

/* Fills `dst` with exactly n inflated bytes, or dies (a truncated or damaged k3.exe). */
static void payload_read(payload_reader *r, void *dst, size_t n) {
  r->z.next_out = (unsigned char *)dst;
  r->z.avail_out = (uInt)n;
  while (r->z.avail_out > 0) {
    if (r->z.avail_in == 0 && r->left > 0) {
      DWORD want = r->left < CHUNK ? (DWORD)r->left : CHUNK, got = 0;
      if (!ReadFile(r->file, r->in, want, &got, NULL) || got == 0) die("cannot read its payload");
      r->left -= got;
      r->z.next_in = r->in;
      r->z.avail_in = got;
    }
    int rc = inflate(&r->z, Z_NO_FLUSH);
    if (rc != Z_OK && !(rc == Z_STREAM_END && r->z.avail_out == 0)) {
      fprintf(stderr, "k3: this k3.exe is damaged (payload: zlib %d); download it again\n", rc);
      exit(2);
    }
  }
}

/* a + b as a new wide string. */
static wchar_t *join(const wchar_t *a, const wchar_t *b) {
  size_t na = wcslen(a), nb = wcslen(b);
  wchar_t *s = (wchar_t *)malloc(sizeof(wchar_t) * (na + nb + 1));
  if (!s) die("out of memory");
  memcpy(s, a, sizeof(wchar_t) * na);
  memcpy(s + na, b, sizeof(wchar_t) * (nb + 1));
  return s;
}

/* UTF-8 path (with '/') to a wide one with '\'. */
static wchar_t *wide_path(const char *utf8) {
  int n = MultiByteToWideChar(CP_UTF8, 0, utf8, -1, NULL, 0);
  wchar_t *w = (wchar_t *)malloc(sizeof(wchar_t) * (size_t)(n > 0 ? n : 1));
  if (!w || n <= 0) die("bad file name in its payload");
  MultiByteToWideChar(CP_UTF8, 0, utf8, -1, w, n);
  for (wchar_t *p = w; *p; p++) {
    if (*p == L'/') *p = L'\\';
  }
  return w;
}

/* Creates every folder on the way to the file `path` (its last part is the file). */
static void make_parents(wchar_t *path) {
  for (wchar_t *p = path + 4; *p; p++) { /* after the \\?\ prefix */
    if (*p != L'\\' || p[-1] == L':') continue;
    *p = 0;
    if (!CreateDirectoryW(path, NULL) && GetLastError() != ERROR_ALREADY_EXISTS) {
      die("cannot create a folder to unpack into");
    }
    *p = L'\\';
  }
}

/* Writes the next file of the payload under `root`; 0 at the end of the payload. */
static int unpack_one(payload_reader *r, const wchar_t *root, unsigned char *buf) {
  uint32_t name_len;
  payload_read(r, &name_len, 4);
  if (name_len == 0) return 0;
  if (name_len > 4096) die("bad file name in its payload");
  char name[4097];
  payload_read(r, name, name_len);
  name[name_len] = 0;
  uint64_t size;
  payload_read(r, &size, 8);
  wchar_t *rel = wide_path(name), *sep = join(root, L"\\"), *full = join(sep, rel);
  make_parents(full);
  HANDLE out = CreateFileW(full, GENERIC_WRITE, 0, NULL, CREATE_ALWAYS, FILE_ATTRIBUTE_NORMAL,
                           NULL);
  if (out == INVALID_HANDLE_VALUE) die("cannot write a file while unpacking");
  while (size > 0) {
    size_t n = size < CHUNK ? (size_t)size : CHUNK;
    DWORD wrote = 0;
    payload_read(r, buf, n);
    if (!WriteFile(out, buf, (DWORD)n, &wrote, NULL) || wrote != n) die("cannot write (disk full?)");
    size -= n;
  }
  CloseHandle(out);
  free(rel), free(sep), free(full);
  return 1;
}

/* Unpacks the payload at [offset, offset + length) of `self` into the folder `dir`. */
static void unpack(const wchar_t *self, uint64_t offset, uint64_t length, const wchar_t *dir) {
  static payload_reader r;
  static unsigned char buf[CHUNK];
  r.file = CreateFileW(self, GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING, 0, NULL);
  if (r.file == INVALID_HANDLE_VALUE) die("cannot read itself");
  LARGE_INTEGER at;
  at.QuadPart = (LONGLONG)offset;
  if (!SetFilePointerEx(r.file, at, NULL, FILE_BEGIN)) die("cannot read itself");
  r.left = length;
  memset(&r.z, 0, sizeof r.z);
  if (inflateInit2(&r.z, 15 + 32) != Z_OK) die("zlib failed to start"); /* gzip or zlib */
  if (!CreateDirectoryW(dir, NULL) && GetLastError() != ERROR_ALREADY_EXISTS) {
    die("cannot create the unpack folder");
  }
  while (unpack_one(&r, dir, buf)) {
  }
  inflateEnd(&r.z);
  CloseHandle(r.file);
}

/* Removes the folder `dir` and everything in it (a half-unpacked copy). */
static void remove_tree(const wchar_t *dir) {
  wchar_t *pattern = join(dir, L"\\*");
  WIN32_FIND_DATAW e;
  HANDLE h = FindFirstFileW(pattern, &e);
  while (h != INVALID_HANDLE_VALUE) {
    if (wcscmp(e.cFileName, L".") != 0 && wcscmp(e.cFileName, L"..") != 0) {
      wchar_t *sep = join(dir, L"\\"), *child = join(sep, e.cFileName);
      if (e.dwFileAttributes & FILE_ATTRIBUTE_DIRECTORY) remove_tree(child);
      else DeleteFileW(child);
      free(sep), free(child);
    }
    if (!FindNextFileW(h, &e)) break;
  }
  if (h != INVALID_HANDLE_VALUE) FindClose(h);
  RemoveDirectoryW(dir);
  free(pattern);
}

typedef struct {
  uint64_t offset, length;
  wchar_t version[17];
} trailer;

static trailer read_trailer(const wchar_t *self) {
  HANDLE f = CreateFileW(self, GENERIC_READ, FILE_SHARE_READ, NULL, OPEN_EXISTING, 0, NULL);
  if (f == INVALID_HANDLE_VALUE) die("cannot read itself");
  LARGE_INTEGER end;
  end.QuadPart = -TRAILER_BYTES;
  unsigned char t[TRAILER_BYTES];
  DWORD got = 0;
  if (!SetFilePointerEx(f, end, NULL, FILE_END) || !ReadFile(f, t, TRAILER_BYTES, &got, NULL) ||
      got != TRAILER_BYTES || memcmp(t, "K3PACK01", 8) != 0) {
    fprintf(stderr, "k3: this k3.exe carries no payload; build it with make dist-all\n");
    exit(2);
  }
  CloseHandle(f);
  trailer tr;
  memcpy(&tr.offset, t + 8, 8);
  memcpy(&tr.length, t + 16, 8);
  for (int i = 0; i < 16; i++) tr.version[i] = (wchar_t)t[24 + i];
  tr.version[16] = 0;
  return tr;
}

/* %K3_HOME%\dist, else %LOCALAPPDATA%\k3\dist, with the \\?\ prefix for long paths. */
static wchar_t *dist_base(void) {
  wchar_t home[MAX_PATH];
  const wchar_t *tail = L"\\dist";
  DWORD n = GetEnvironmentVariableW(L"K3_HOME", home, MAX_PATH);
  if (n == 0 || n >= MAX_PATH) {
    n = GetEnvironmentVariableW(L"LOCALAPPDATA", home, MAX_PATH);
    tail = L"\\k3\\dist";
  }
  if (n == 0 || n >= MAX_PATH) die("neither K3_HOME nor LOCALAPPDATA is set");
  wchar_t *base = join(L"\\\\?\\", home), *full = join(base, tail);
  free(base);
  make_parents(join(full, L"\\x"));
  return full;
}

/* The folder holding this version, unpacked once: into a folder of this process first,
 * then renamed into place, so a concurrent first start never sees a partial copy. */
static wchar_t *ensure_unpacked(const wchar_t *self) {
  trailer tr = read_trailer(self);
  wchar_t *base = dist_base(), *sep = join(base, L"\\"), *root = join(sep, tr.version);
  wchar_t *marker = join(root, L"\\.complete");
  if (GetFileAttributesW(marker) != INVALID_FILE_ATTRIBUTES) return root;
  wchar_t pid[32];
  swprintf(pid, 32, L".tmp.%lu", (unsigned long)GetCurrentProcessId());
  wchar_t *tmp = join(root, pid);
  remove_tree(tmp);
  unpack(self, tr.offset, tr.length, tmp);
  wchar_t *tmp_marker = join(tmp, L"\\.complete");
  HANDLE m = CreateFileW(tmp_marker, GENERIC_WRITE, 0, NULL, CREATE_ALWAYS, 0, NULL);
  if (m == INVALID_HANDLE_VALUE) die("cannot finish unpacking");
  CloseHandle(m);
  if (!MoveFileExW(tmp, root, 0)) remove_tree(tmp); /* another start got there first */
  return root;
}

/* The command line after the program name, exactly as this process received it. */
static const wchar_t *argument_tail(void) {
  const wchar_t *p = GetCommandLineW();
  if (*p == L'"') {
    p++;
    while (*p && *p != L'"') p++;
    if (*p) p++;
  } else {
    while (*p && *p != L' ' && *p != L'\t') p++;
  }
  while (*p == L' ' || *p == L'\t') p++;
  return p;
}

/* Runs deno on the unpacked app with our arguments and returns its exit code. */
static DWORD run_deno(const wchar_t *root) {
  const wchar_t *plain = root + 4; /* without \\?\: deno and the app see an ordinary path */
  SetEnvironmentVariableW(L"DENO_NO_UPDATE_CHECK", L"1");
  SetEnvironmentVariableW(L"DENO_NO_PROMPT", L"1");
  wchar_t *deno_dir = join(plain, L"\\deno_dir");
  SetEnvironmentVariableW(L"DENO_DIR", deno_dir);
  const wchar_t *fmt = L"\"%ls\\bin\\deno.exe\" run --cached-only --frozen --no-prompt --quiet "
                       L"--config \"%ls\\app\\deno.json\" --allow-ffi --allow-read --allow-write "
                       L"--allow-env --allow-net --allow-run --allow-sys \"%ls\\app\\main.ts\" %ls";
  const wchar_t *tail = argument_tail();
  size_t n = wcslen(fmt) + 3 * wcslen(plain) + wcslen(tail) + 1;
  wchar_t *cmd = (wchar_t *)malloc(sizeof(wchar_t) * n);
  wchar_t *exe = join(plain, L"\\bin\\deno.exe");
  if (!cmd) die("out of memory");
  swprintf(cmd, n, fmt, plain, plain, plain, tail);
  STARTUPINFOW si;
  PROCESS_INFORMATION pi;
  memset(&si, 0, sizeof si);
  si.cb = sizeof si;
  /* Ctrl-C reaches deno too (same console); the launcher only waits for its exit code. */
  SetConsoleCtrlHandler(NULL, TRUE);
  if (!CreateProcessW(exe, cmd, NULL, NULL, TRUE, 0, NULL, NULL, &si, &pi)) die("cannot start deno");
  WaitForSingleObject(pi.hProcess, INFINITE);
  DWORD code = 1;
  GetExitCodeProcess(pi.hProcess, &code);
  CloseHandle(pi.hProcess);
  CloseHandle(pi.hThread);
  return code;
}

int main(void) {
  wchar_t self[32768];
  DWORD n = GetModuleFileNameW(NULL, self, 32768);
  if (n == 0 || n >= 32768) die("cannot find its own file");
  return (int)run_deno(ensure_unpacked(self));
}
