/**
 * `make dist`'s single executable runs from a bare environment (empty HOME, no HOME at all, no
 * Deno on PATH), gives the same tokens as the checkout, and a new release's first start
 * removes older unpacked copies that no running k3 holds. Its bundled @huggingface/hub
 * downloads from a stand-in Hub, and it runs the download by repo id.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";
import { StandInHub } from "../support/hub_standin.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const exe = path.join(repo, "dist", "k3");

function runDist(args: string[], env: Record<string, string>) {
  return new Deno.Command(exe, { args, clearEnv: true, env: { PATH: "/usr/bin:/bin", ...env } })
    .output();
}

Deno.test("dist/k3: one self-extracting executable, same tokens as the checkout", async (t) => {
  const built = await new Deno.Command("sh", { args: ["scripts/dist.sh"], cwd: repo }).output();
  assert.equal(built.code, 0, new TextDecoder().decode(built.stderr));
  const dir = await tinyModel({ seed: 11 });
  const args = ["run", dir, "--ids", "4,8,15,16", "--gen", "4", "--quiet"];
  const local = await runK3(args);
  assert.ok(local.stdout.trim().length > 0);
  const dec = new TextDecoder();

  await t.step("an empty HOME", async () => {
    const home = tempDir();
    const packed = await runDist(args, { HOME: home });
    assert.equal(packed.code, 0, dec.decode(packed.stderr));
    assert.equal(dec.decode(packed.stdout), local.stdout);
    assert.ok((await Deno.stat(path.join(home, ".cache/k3/dist"))).isDirectory);
  });

  await t.step("no HOME at all: unpacks under $TMPDIR/k3-UID", async () => {
    const tmp = tempDir();
    const packed = await runDist(args, { TMPDIR: tmp });
    assert.equal(packed.code, 0, dec.decode(packed.stderr));
    assert.equal(dec.decode(packed.stdout), local.stdout);
    const [only] = [...Deno.readDirSync(tmp)].map((e) => e.name);
    assert.match(only, /^k3-\d+$/);
  });

  await t.step("older copies are removed unless a running k3 holds them", async () => {
    const home = tempDir();
    const base = path.join(home, "dist");
    const copy = (name: string, complete: boolean) => {
      Deno.mkdirSync(path.join(base, name, "app"), { recursive: true });
      if (complete) Deno.writeTextFileSync(path.join(base, name, ".complete"), "");
      return path.join(base, name);
    };
    const old = copy("0000000000000000", true);
    const held = copy("1111111111111111", true);
    const deadUnpack = copy("2222222222222222.tmp.9999999", false); // no pid is above 2^22
    // A running k3 of that release holds its copy's lock (shared), as the launcher does.
    const lock = await Deno.open(path.join(held, ".complete"), { read: true });
    try {
      await lock.lock(false);
      const packed = await runDist(args, { K3_HOME: home });
      assert.equal(packed.code, 0, dec.decode(packed.stderr));
      assert.equal(dec.decode(packed.stdout), local.stdout);
      const left = [...Deno.readDirSync(base)].map((e) => e.name).sort();
      assert.equal(left.length, 2, left.join(" "));
      assert.ok(left.includes("1111111111111111"), "the held copy is kept");
      for (const gone of [old, deadUnpack]) {
        assert.ok(!left.includes(path.basename(gone)), `${gone} removed`);
      }
    } finally {
      lock.close();
    }
    // A second start of the same release leaves everything as it is (nothing to unpack).
    const again = await runDist(args, { K3_HOME: home });
    assert.equal(again.code, 0);
    assert.equal([...Deno.readDirSync(base)].length, 2);
  });

  await t.step(
    "the bundled @huggingface/hub downloads into the Hub cache; run by repo id",
    async () => {
      const home = tempDir();
      const repoId = "moonshotai/Kimi-K3";
      const hub = StandInHub.start({ repo: repoId, source: dir, tokens: ["hf_dist"] });
      try {
        const env = {
          HOME: home,
          HF_ENDPOINT: hub.endpoint,
          HF_TOKEN: "hf_dist",
          HF_HOME: path.join(home, "hf"),
        };
        const dl = await runDist(["download", repoId, "--hub-cache"], env);
        assert.equal(dl.code, 0, dec.decode(dl.stderr));
        const byId = await runDist(["run", repoId, ...args.slice(2)], env);
        assert.equal(byId.code, 0, dec.decode(byId.stderr));
        assert.equal(dec.decode(byId.stdout), local.stdout);
      } finally {
        await hub.close();
      }
    },
  );
});
