/**
 * Each command's --help as a reference a person can trust: no flag listed twice, every flag
 * the parser takes listed, every flag the help names taken, each shared flag under its own
 * heading (speculation, memory, sampling, constrained output) and nothing else there; the
 * command list names every API `serve` speaks; a default a preset changes says so.
 */
import assert from "node:assert/strict";
import { COMMAND_NAMES, commandOptions, main } from "../../lib/cli/main.ts";
import { SAMPLING_OPTIONS } from "../../lib/cli/flags.ts";
import { GRAMMAR_OPTIONS } from "../../lib/cli/grammar_flags.ts";
import { MEMORY_OPTIONS } from "../../lib/cli/memory_flags.ts";
import { SPECULATE_OPTIONS } from "../../lib/cli/speculate_flags.ts";

/** What `k3 ARGS` prints on stdout, run in this process (help never loads libk3). */
async function printed(args: string[]): Promise<string> {
  const lines: string[] = [];
  const log = console.log;
  console.log = (...parts: unknown[]) => void lines.push(parts.join(" "));
  try {
    assert.equal(await main(args), 0, `k3 ${args.join(" ")}`);
  } finally {
    console.log = log;
  }
  return lines.join("\n");
}

/** Flags that are not for people (bench runs itself as a child with them). */
const INTERNAL: Record<string, string[]> = { bench: ["child", "scalar"] };

/** Each flag listed (a line that starts with it), with the heading it is under. */
function listed(help: string): { flag: string; heading: string; line: number }[] {
  let heading = "";
  const out: { flag: string; heading: string; line: number }[] = [];
  help.split("\n").forEach((text, line) => {
    if (/^\S.*:\s*$/.test(text)) heading = text.replace(/\s*\(.*$|:\s*$/g, "");
    const m = /^ {2}(?:-[a-zA-Z], )?--([a-z][a-z0-9-]*)/.exec(text);
    if (m) out.push({ flag: m[1], heading, line: line + 1 });
  });
  return out;
}

/** The headings a shared group of flags belongs under. */
const GROUPS: { flags: string[]; specs: Record<string, unknown>; headings: string[] }[] = [
  [SPECULATE_OPTIONS, ["speculation"]] as const,
  [MEMORY_OPTIONS, ["memory"]] as const,
  [GRAMMAR_OPTIONS, ["constrained output"]] as const,
  [SAMPLING_OPTIONS, ["sampling", "penalties and bias", "stops"]] as const,
].map(([specs, headings]) => ({
  // --max-tokens is shared but belongs with each command's generation settings.
  flags: Object.keys(specs).filter((f) => f !== "max-tokens"),
  specs,
  headings: [...headings],
}));

Deno.test("every --help: no flag twice, every parsed flag listed, every named flag parsed, shared flags under their heading", async () => {
  const problems: string[] = [];
  for (const command of COMMAND_NAMES) {
    const help = await printed([command, "--help"]);
    const specs = await commandOptions(command);
    const parsed = Object.keys(specs)
      .filter((f) => f !== "help" && !(INTERNAL[command] ?? []).includes(f));
    const rows = listed(help);
    const seen = new Set<string>();
    for (const { flag, line } of rows) {
      if (seen.has(flag)) problems.push(`k3 ${command} --help:${line}: --${flag} listed again`);
      seen.add(flag);
    }
    for (const flag of parsed) {
      if (!seen.has(flag)) problems.push(`k3 ${command} --help does not list --${flag}`);
    }
    // Every flag named anywhere, except in a quoted other command (`k3 pack ...`).
    const others = COMMAND_NAMES.filter((c) => c !== command).join("|");
    const own = help.replace(new RegExp(`\\bk3 (?:${others}) .*`, "g"), "");
    for (const m of own.matchAll(/--([a-z][a-z0-9-]*)/g)) {
      if (!parsed.includes(m[1]) && m[1] !== "help") {
        problems.push(`k3 ${command} --help names --${m[1]}, which it does not take`);
      }
    }
    for (const { flag, heading, line } of rows) {
      // A shared flag is the group's own spec object; make-tiny's --seed is another flag.
      const group = GROUPS.find((g) => g.flags.includes(flag) && g.specs[flag] === specs[flag]);
      const under = GROUPS.find((g) => g.headings.includes(heading));
      if (group && !group.headings.includes(heading)) {
        problems.push(`k3 ${command} --help:${line}: --${flag} under "${heading}"`);
      } else if (!group && under) {
        problems.push(`k3 ${command} --help:${line}: --${flag} under "${heading}"`);
      }
    }
  }
  assert.deepEqual(problems, []);
});

Deno.test("k3 --help names every API serve speaks; --context says a preset changes its default", async () => {
  const usage = await printed(["--help"]);
  const serve = usage.split("\n").find((l) => /^ {2}serve /.test(l))!;
  for (const api of ["OpenAI", "Responses", "Anthropic", "Ollama"]) {
    assert.ok(serve.includes(api), `${serve} names ${api}`);
  }
  assert.ok(usage.split("\n").every((l) => l.length <= 100), "k3 --help fits 100 columns");
  for (const command of ["chat", "serve"]) {
    const help = await printed([command, "--help"]);
    const at = help.indexOf("  --context N");
    assert.match(help.slice(at, at + 200), /default: a named --preset's context/, command);
  }
});
