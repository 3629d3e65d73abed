/**
 * libk3's own fmaf (csrc/fmaf.h), which Windows builds use because mingw-w64's is not
 * correctly rounded, gives the same result as glibc's (correctly rounded) on 7 million cases
 * chosen to catch a double rounding. `make test-windows` checks the same digest under wine.
 */
import assert from "node:assert/strict";
import * as path from "node:path";

const repo = path.resolve(import.meta.dirname!, "..", "..");

Deno.test("k3's fmaf equals glibc's on every hard case", async () => {
  const dec = new TextDecoder();
  const built = await new Deno.Command("make", { args: ["-s", "fma-check"], cwd: repo }).output();
  assert.equal(built.code, 0, dec.decode(built.stderr));
  const out = await new Deno.Command(path.join(repo, "build", "fma_check")).output();
  assert.equal(out.code, 0, dec.decode(out.stderr));
  const line = dec.decode(out.stdout);
  const m = line.match(/^fma cases (\d+), libm differs from k3 in (\d+), k3 digest ([0-9a-f]{16})/);
  assert.ok(m, line);
  assert.equal(Number(m[1]), 7_000_000);
  assert.equal(Number(m[2]), 0, line);
});
