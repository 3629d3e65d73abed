/**
 * The aarch64 NEON kernels, cross-built and run under qemu-user, print the same bytes as the
 * x86-64 scalar and AVX2 builds of the same harness (csrc/tests/harness.c, `make test-arm`).
 * `make test` installs the cross tools first (scripts/arm-tools.sh); without them this fails.
 */
import assert from "node:assert/strict";
import * as path from "node:path";

const repo = path.resolve(import.meta.dirname!, "..", "..");

Deno.test("NEON under qemu equals x86 scalar and AVX2, byte for byte", async () => {
  const out = await new Deno.Command("make", { args: ["-s", "test-arm"], cwd: repo }).output();
  const dec = new TextDecoder();
  assert.equal(out.code, 0, dec.decode(out.stdout) + dec.decode(out.stderr));
  const read = (name: string) => Deno.readTextFile(path.join(repo, "build", name));
  const [scalar, avx2, neon] = await Promise.all(
    ["harness-scalar.sha", "harness-x86.sha", "harness-arm64.sha"].map(read),
  );
  assert.match(scalar, /^[0-9a-f]{64}/);
  assert.equal(avx2, scalar);
  assert.equal(neon, scalar);
});
