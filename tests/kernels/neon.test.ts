/**
 * The aarch64 NEON kernels, cross-built and run under qemu-user, print the same bytes as the
 * x86-64 scalar and AVX2 builds of the same harness (csrc/tests/harness.c, `make test-arm`),
 * with OpenMP and with libk3's thread pool, and built by zig (the macOS compiler) for arm64
 * and x86-64. The arm64 executable (dist/k3-linux-arm64) runs `k3 demo` under qemu with the
 * same text, token ids and logits as x86 (scripts/test-arm-dist.sh). Skipped, with a line
 * saying so, when the cross tools are not installed (`make deps-platforms`).
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { havePrograms, skipUnless } from "../support/tools.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const ignore = skipUnless(
  havePrograms("aarch64-linux-gnu-gcc", "qemu-aarch64"),
  "NEON harness and the arm64 executable under qemu",
  "make deps-platforms",
);

Deno.test({
  name: "NEON under qemu equals x86 scalar and AVX2, and the arm64 k3 demo equals x86's",
  ignore,
  fn: async () => {
    const out = await new Deno.Command("make", { args: ["-s", "test-arm"], cwd: repo }).output();
    const dec = new TextDecoder();
    const log = dec.decode(out.stdout) + dec.decode(out.stderr);
    assert.equal(out.code, 0, log);
    const read = (name: string) =>
      Deno.readTextFile(path.join(repo, "build", `harness-${name}.sha`));
    const scalar = await read("scalar");
    assert.match(scalar, /^[0-9a-f]{64}/);
    for (const name of ["x86", "arm64", "arm64-pool", "zig-arm64", "zig-x64"]) {
      assert.equal(await read(name), scalar, name);
    }
    assert.match(log, /token ids, x86-64 and arm64 \(qemu\): "generated_ids":\[\d+(,\d+){7}\]/);
    assert.match(log, /logits: \d+ bytes, identical/);
  },
});
