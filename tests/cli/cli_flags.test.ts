/**
 * The small things of the command line: negative numbers as flag values, ranges printed as a
 * person reads them, `k3 --list-presets` at the top level with what auto picks here.
 */
import assert from "node:assert/strict";
import { joinNegativeValues, rangeText } from "../../lib/cli/flags.ts";
import { runK3, tinyModel } from "../support/helpers.ts";

Deno.test("--seed -3 is --seed=-3; a negative value of a non-negative flag names the range", async () => {
  const dir = await tinyModel({ seed: 11 });
  const run = (seed: string[]) =>
    runK3([
      "run",
      dir,
      "--ids",
      "3,14,159",
      "--gen",
      "6",
      "--temperature",
      "1.5",
      ...seed,
      "--quiet",
    ]);
  const spaced = await run(["--seed", "-3"]);
  assert.equal(spaced.code, 0, spaced.stderr);
  const joined = await run(["--seed=-3"]);
  assert.equal(joined.stdout, spaced.stdout);
  const positive = await run(["--seed", "3"]);
  assert.equal(positive.code, 0);
  const r = await runK3(["run", dir, "--ids", "1", "--top-k", "-1"]);
  assert.equal(r.code, 2);
  assert.match(r.stderr, /--top-k wants a whole number from 0 to 2\^53 - 1, got '-1'/);
  assert.doesNotMatch(r.stderr, /ambiguous/);
  const b = await runK3(["run", dir, "--ids", "1", "--quiet", "-3"]);
  assert.equal(b.code, 2);
  assert.match(b.stderr, /^k3: --quiet takes no value \(got --quiet=-3\) \(k3 run --help\)$/m);

  assert.deepEqual(joinNegativeValues(["--a", "-3", "--b", "-.5", "-x", "--", "--c", "-1"]), [
    "--a=-3",
    "--b=-.5",
    "-x",
    "--",
    "--c",
    "-1",
  ]);
});

Deno.test("ranges read as a person writes them", () => {
  const safe = Number.MAX_SAFE_INTEGER;
  assert.equal(rangeText(1, 1024, true), "a whole number from 1 to 1,024");
  assert.equal(rangeText(-safe, safe, true), "a whole number from -(2^53 - 1) to 2^53 - 1");
  assert.equal(rangeText(0, Number.MAX_VALUE, false), "a number >= 0");
  assert.equal(rangeText(0.001, 86400, false), "a number from 0.001 to 86,400");
  assert.equal(rangeText(-2, 2, false), "a number from -2 to 2");
});

Deno.test("k3 --list-presets: every preset, and what auto picks on this machine", async () => {
  const top = await runK3(["--list-presets"]);
  assert.equal(top.code, 0, top.stderr);
  for (const name of ["ultra", "laptop", "desktop", "workstation", "server", "max"]) {
    assert.match(top.stdout, new RegExp(`^  ${name} +\\d+\\.\\d GB  context +\\d+`, "m"));
  }
  const auto = top.stdout.split("\n").find((l) => l.startsWith("  auto"))!;
  assert.match(
    auto,
    /auto +\d+\.\d GB {2}context {2}32768 {2}prefill 512 {2}here: 90% of [\d.]+ GB usable/,
  );
  const inRun = await runK3(["run", "x", "--list-presets"]);
  const fixed = (out: string) => out.split("\n").filter((l) => !l.startsWith("  auto")); // free memory moves
  assert.deepEqual(fixed(inRun.stdout), fixed(top.stdout));
  const help = await runK3(["--help"]);
  assert.match(help.stdout, /k3 --list-presets/);
});
