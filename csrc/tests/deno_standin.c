/* A stand-in deno.exe for testing the Windows launcher under wine (which cannot run Deno):
 * prints each argument it was given on its own line as <arg>, UTF-8, then DENO_DIR, and
 * exits with N when one argument is "exit=N" (else 0). */
#include <windows.h>
#include <fcntl.h>
#include <io.h>
#include <stdio.h>
#include <stdlib.h>
#include <wchar.h>

static void print_utf8(const wchar_t *w) {
  char buf[8192];
  int n = WideCharToMultiByte(CP_UTF8, 0, w, -1, buf, sizeof buf, NULL, NULL);
  if (n > 0) fwrite(buf, 1, (size_t)n - 1, stdout);
}

int wmain(int argc, wchar_t **argv) {
  _setmode(_fileno(stdout), _O_BINARY);
  int code = 0;
  for (int i = 1; i < argc; i++) {
    fputs("<", stdout);
    print_utf8(argv[i]);
    fputs(">\n", stdout);
    if (wcsncmp(argv[i], L"exit=", 5) == 0) code = _wtoi(argv[i] + 5);
  }
  const wchar_t *dir = _wgetenv(L"DENO_DIR");
  fputs("DENO_DIR=", stdout);
  print_utf8(dir ? dir : L"");
  fputs("\n", stdout);
  return code;
}
