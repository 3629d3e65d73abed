/**
 * docs/CLI.md against the parsers: every flag each subcommand parses is documented in its
 * section (or a shared section naming it) and shown by its --help; every flag a command's own
 * section names is one it parses; every table row has its header's number of cells (a `|` in
 * a cell must be escaped, or the row breaks).
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import { COMMAND_NAMES, commandOptions } from "../../lib/cli/main.ts";
import { runK3 } from "../support/helpers.ts";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const doc = Deno.readTextFileSync(path.join(repo, "docs/CLI.md"));

/** Flags that are not for people, with the reason; never documented. */
const INTERNAL: Record<string, string[]> = {
  // bench kernels runs each thread count in a child process of itself (--child [--scalar])
  bench: ["child", "scalar"],
};

const sections = doc.split(/^## /m).slice(1).map((s) => {
  const nl = s.indexOf("\n");
  return { heading: s.slice(0, nl), body: s.slice(nl + 1) };
});

function flagsIn(text: string): Set<string> {
  return new Set([...text.matchAll(/--([a-z][a-z0-9-]*)/g)].map((m) => m[1]));
}

function docsOf(command: string) {
  const own = sections.filter((s) => s.heading.startsWith(`\`k3 ${command}`));
  const shared = sections.filter((s) =>
    !own.includes(s) &&
    (s.heading.includes(`\`${command}\``) || s.heading.includes(`\`${command} `))
  );
  return { own, shared };
}

Deno.test("docs/CLI.md documents every flag of every subcommand, and only those", async () => {
  assert.ok(COMMAND_NAMES.length >= 9);
  const problems: string[] = [];
  for (const command of COMMAND_NAMES) {
    const { own, shared } = docsOf(command);
    assert.equal(own.length, 1, `docs/CLI.md has one "## \`k3 ${command} ..." section`);
    const documented = flagsIn([...own, ...shared].map((s) => s.heading + s.body).join("\n"));
    const parsed = Object.keys(await commandOptions(command))
      .filter((f) => f !== "help" && !(INTERNAL[command] ?? []).includes(f));
    const missing = parsed.filter((f) => !documented.has(f));
    if (missing.length) problems.push(`k3 ${command}: undocumented: --${missing.join(", --")}`);
    // Code that quotes another command (`run --dump-cache-trace DIR`) names its flags.
    const others = COMMAND_NAMES.filter((c) => c !== command).join("|");
    const quoting = new RegExp(`\`(?:\\./)?(?:k3 )?(?:${others}) [^\`]*\``, "g");
    const unknown = [...flagsIn((own[0].heading + own[0].body).replace(quoting, ""))]
      .filter((f) => !parsed.includes(f) && f !== "help");
    if (unknown.length) problems.push(`k3 ${command}: not parsed: --${unknown.join(", --")}`);
  }
  assert.deepEqual(problems, []);
});

Deno.test("every subcommand's --help shows each of its flags", async () => {
  for (const command of COMMAND_NAMES) {
    const r = await runK3([command, "--help"]);
    assert.equal(r.code, 0, `${command}: ${r.stderr}`);
    const shown = flagsIn(r.stdout);
    const parsed = Object.keys(await commandOptions(command))
      .filter((f) => f !== "help" && !(INTERNAL[command] ?? []).includes(f));
    assert.deepEqual(parsed.filter((f) => !shown.has(f)), [], `k3 ${command} --help is missing`);
  }
});

Deno.test("docs/CLI.md tables: every row has its header's cells", () => {
  const cells = (line: string) => line.replace(/\\\|/g, "").split("|").length;
  const lines = doc.split("\n");
  let header = 0, tables = 0;
  for (const [i, line] of lines.entries()) {
    if (!line.startsWith("|")) {
      header = 0;
      continue;
    }
    if (header === 0) {
      header = cells(line);
      tables++;
      // A header, then its |---| line: else it is no table (a row wrapped by a formatter).
      assert.match(lines[i + 1] ?? "", /^\|( *:?-+:? *\|)+$/, `docs/CLI.md:${i + 1}: ${line}`);
    } else assert.equal(cells(line), header, `docs/CLI.md:${i + 1}: ${line}`);
    // An unescaped | inside a code span ends the cell there and cuts the text short.
    for (const cell of line.replace(/\\\|/g, "").split("|")) {
      assert.equal((cell.match(/`/g) ?? []).length % 2, 0, `docs/CLI.md:${i + 1}: ${cell}`);
    }
  }
  assert.ok(tables >= 6);
});
