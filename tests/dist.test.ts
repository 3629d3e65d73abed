/**
 * `make dist`'s single executable runs from a bare environment (empty HOME, no Deno on PATH)
 * and gives the same tokens as the checkout.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { runK3, tempDir, tinyModel } from "./helpers.ts";

const repo = path.resolve(import.meta.dirname!, "..");

Deno.test("dist/k3: one self-extracting executable, same tokens as the checkout", async () => {
  const built = await new Deno.Command("sh", { args: ["scripts/dist.sh"], cwd: repo }).output();
  assert.equal(built.code, 0, new TextDecoder().decode(built.stderr));
  const dir = await tinyModel({ seed: 11 });
  const args = ["run", dir, "--ids", "4,8,15,16", "--gen", "4", "--quiet"];
  const home = tempDir();
  const packed = await new Deno.Command(path.join(repo, "dist", "k3"), {
    args,
    clearEnv: true,
    env: { HOME: home, PATH: "/usr/bin:/bin" },
  }).output();
  assert.equal(packed.code, 0, new TextDecoder().decode(packed.stderr));
  const local = await runK3(args);
  assert.equal(new TextDecoder().decode(packed.stdout), local.stdout);
  assert.ok(local.stdout.trim().length > 0);
});
