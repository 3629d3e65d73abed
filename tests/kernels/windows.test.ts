/**
 * Windows, as far as it runs here (`make test-windows`, under wine): the kernel harness gives
 * Linux's bytes on the portable and AVX2 paths at 1 and 3 threads, libk3's fmaf gives Linux's
 * digest, libk3.dll's file and memory layer reads past 4 GiB (buffered and unbuffered), and
 * the launcher unpacks once, passes quoted arguments and the exit code through (with a
 * stand-in deno.exe: wine 8 cannot run Deno 2). Skipped, with a line saying so, without
 * mingw-w64 or wine (`make deps-platforms`).
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { havePrograms, skipUnless } from "../support/tools.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
let zlib = false;
try {
  zlib = Deno.statSync("/usr/x86_64-w64-mingw32/include/zlib.h").isFile;
} catch {
  // not installed
}
const ignore = skipUnless(
  havePrograms("x86_64-w64-mingw32-gcc", "wine", "winepath") && zlib,
  "Windows harness, DLL probe and launcher under wine",
  "make deps-platforms",
);

Deno.test({
  name: "Windows under wine: harness bytes, fmaf, the DLL's I/O and the launcher",
  ignore,
  fn: async () => {
    const args = ["-s", "test-windows"];
    const out = await new Deno.Command("make", { args, cwd: repo }).output();
    const dec = new TextDecoder();
    const log = dec.decode(out.stdout) + dec.decode(out.stderr);
    assert.equal(out.code, 0, log);
    const linux = log.match(/^harness linux ([0-9a-f]{64})$/m);
    assert.ok(linux, log);
    const windows = [...log.matchAll(/^harness windows isa=\w+ threads=\d ([0-9a-f]{64})$/gm)];
    assert.equal(windows.length, 4, log);
    for (const m of windows) assert.equal(m[1], linux[1]);
    assert.match(log, /^test-windows: all checks passed/m);
  },
});
