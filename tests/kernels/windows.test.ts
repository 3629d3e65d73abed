/**
 * Windows, as far as it runs here (`make test-windows`, under wine): the kernel harness gives
 * Linux's bytes on the portable and AVX2 paths at 1 and 3 threads, libk3's fmaf gives Linux's
 * digest, libk3.dll's file and memory layer reads past 4 GiB (buffered and unbuffered), and
 * the launcher unpacks once, passes quoted arguments and the exit code through (with a
 * stand-in deno.exe: wine 8 cannot run Deno 2). Skipped, with a line saying so, without
 * mingw-w64 or wine (`make deps-test`), except on CI, where it fails.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { requireTools, skipWithout, WINDOWS_TOOLS } from "../support/tools.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const NAME = "Windows under wine: harness bytes, fmaf, the DLL's I/O and the launcher";
const ignore = skipWithout(NAME, WINDOWS_TOOLS);

Deno.test({
  name: NAME,
  ignore,
  fn: async () => {
    requireTools(WINDOWS_TOOLS);
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
