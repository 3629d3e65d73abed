/**
 * The aarch64 NEON kernels, cross-built and run under qemu-user, print the same bytes as the
 * x86-64 scalar and AVX2 builds of the same harness (csrc/tests/harness.c, `make test-arm`),
 * with OpenMP and with libk3's thread pool, and built by zig (the macOS compiler) for arm64
 * and x86-64. The arm64 executable (dist/k3-linux-arm64) runs `k3 demo` under qemu with the
 * same text, token ids and logits as x86 (scripts/test-arm-dist.sh). Needs the aarch64 cross
 * tools and qemu-user (`make deps-test` installs them); without them it says it skipped,
 * except on CI (K3_REQUIRE_TEST_TOOLS=1), where it fails.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { ARM_TOOLS, requireTools, skipWithout } from "../support/tools.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");

const NEON = "NEON under qemu equals x86 scalar and AVX2, and the arm64 k3 demo equals x86's";

Deno.test({ name: NEON, ignore: skipWithout(NEON, ARM_TOOLS) }, async () => {
  requireTools(ARM_TOOLS);
  const out = await new Deno.Command("make", { args: ["-s", "test-arm"], cwd: repo }).output();
  const dec = new TextDecoder();
  const log = dec.decode(out.stdout) + dec.decode(out.stderr);
  assert.equal(out.code, 0, log);
  const read = (name: string) => Deno.readTextFile(path.join(repo, "build", `harness-${name}.sha`));
  const scalar = await read("scalar");
  assert.match(scalar, /^[0-9a-f]{64}/);
  for (const name of ["x86", "arm64", "arm64-pool", "zig-arm64", "zig-x64"]) {
    assert.equal(await read(name), scalar, name);
  }
  assert.match(log, /token ids, x86-64 and arm64 \(qemu\): "generated_ids":\[\d+(,\d+){7}\]/);
  assert.match(log, /logits: \d+ bytes, identical/);
});
