/**
 * Where ffi/library.ts looks for libk3: the file name of each OS, and a file-system path (not
 * a URL's percent-encoded pathname, which breaks on spaces and gives "/C:/..." on Windows).
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { libraryFileName } from "../../ffi/library.ts";
import { tempDir } from "../support/helpers.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");

Deno.test("libk3's file name per OS", () => {
  assert.equal(libraryFileName("linux"), "libk3.so");
  assert.equal(libraryFileName("darwin"), "libk3.dylib");
  assert.equal(libraryFileName("windows"), "libk3.dll");
  assert.equal(libraryFileName("android"), "libk3.so");
});

Deno.test("a checkout under a folder with a space and a percent sign finds its own build/", async () => {
  const root = path.join(tempDir(), "my k3 100%");
  await Deno.mkdir(path.join(root, "ffi"), { recursive: true });
  for (const name of ["library.ts", "symbols.ts"]) {
    await Deno.copyFile(path.join(repo, "ffi", name), path.join(root, "ffi", name));
  }
  const script = 'import { libraryPath } from "./ffi/library.ts"; console.log(libraryPath());';
  await Deno.writeTextFile(path.join(root, "probe.ts"), script);
  const env = { ...Deno.env.toObject() };
  delete env.K3_LIB;
  const out = await new Deno.Command(Deno.execPath(), {
    args: ["run", "--quiet", "--no-config", "--allow-env", path.join(root, "probe.ts")],
    clearEnv: true,
    env,
  }).output();
  const dec = new TextDecoder();
  assert.equal(out.code, 0, dec.decode(out.stderr));
  assert.equal(dec.decode(out.stdout).trim(), path.join(root, "build", "libk3.so"));
});
