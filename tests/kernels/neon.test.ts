/**
 * The aarch64 NEON kernels, cross-built and run under qemu-user, print the same bytes as the
 * x86-64 scalar and AVX2 builds of the same harness (csrc/tests/harness.c, `make test-arm`).
 * Needs the aarch64 cross tools and qemu-user (`make deps-test` installs them); without them it
 * says it skipped, except on CI (K3_REQUIRE_TEST_TOOLS=1), where it fails.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { ARM_TOOLS, requireTools, skipWithout } from "../support/tools.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");

const NEON = "NEON under qemu equals x86 scalar and AVX2, byte for byte";

Deno.test({ name: NEON, ignore: skipWithout(NEON, ARM_TOOLS) }, async () => {
  requireTools(ARM_TOOLS);
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
