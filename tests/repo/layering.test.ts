/**
 * Data flows one way: checkpoint -> layout -> memory -> model -> generate -> engine ->
 * chat/serve -> api -> cli (docs/ARCHITECTURE.md). LEVELS is that order, bottom first: a
 * module may import its own folder and any level below its own, never one above, and never a
 * sibling on its own level. Every folder and file of lib/ must appear in it, so a new folder
 * has to be placed before the test passes.
 */
import assert from "node:assert/strict";
import * as path from "node:path";

const repo = path.resolve(import.meta.dirname!, "..", "..");

/** Bottom first. A name is a folder of lib/ or a file at lib/'s top; "ffi" is ../ffi. */
const LEVELS: string[][] = [
  ["ffi"],
  ["errors.ts", "version.ts"],
  // Files, sizes, exact reads, atomic writes: used by everything above.
  ["io"],
  // Three leaves on io: the checkpoint reader, the tokenizer and chat format, the Hub client.
  ["checkpoint", "text", "hub"],
  // The block layout (and the pack that stores it); synthetic checkpoints for make-tiny.
  ["layout", "synth"],
  ["memory"],
  ["model"],
  ["speculate"],
  ["generate"],
  // One way to open a model: checkpoint, tokenizer, plan, load.
  ["engine"],
  ["chat", "serve"],
  // The library's implementation and types, which mod.ts exports.
  ["api"],
  ["mod.ts"],
  ["cli"],
  ["main.ts"],
];

/** Imports against the order that are allowed, as "from -> to" (none today). */
const ALLOWED_SIDEWAYS = new Set<string>([]);

function levelOf(name: string): number {
  return LEVELS.findIndex((level) => level.includes(name));
}

/** The LEVELS name of a file of the repository, or undefined outside lib/, ffi/ and the roots. */
function unitOf(file: string): string | undefined {
  const rel = path.relative(repo, file).split(path.sep);
  if (rel[0] === "ffi") return "ffi";
  if (rel.length === 1 && (rel[0] === "mod.ts" || rel[0] === "main.ts")) return rel[0];
  if (rel[0] === "lib") return rel[1];
  return undefined;
}

function importsOf(file: string): string[] {
  const text = Deno.readTextFileSync(file);
  const out: string[] = [];
  const pattern = /(?:import|export)[^"';]*?from\s+["']([^"']+)["']|import\(\s*["']([^"']+)["']/g;
  for (const m of text.matchAll(pattern)) {
    const spec = m[1] ?? m[2];
    if (spec.startsWith(".")) out.push(path.resolve(path.dirname(file), spec));
  }
  return out;
}

function* tsFiles(dir: string): Generator<string> {
  for (const entry of Deno.readDirSync(dir)) {
    const p = path.join(dir, entry.name);
    if (entry.isDirectory) yield* tsFiles(p);
    else if (entry.name.endsWith(".ts")) yield p;
  }
}

Deno.test("every folder and top-level file of lib/ has a place in the order", () => {
  const unplaced = [...Deno.readDirSync(path.join(repo, "lib"))]
    .filter((e) => e.isDirectory || e.name.endsWith(".ts"))
    .map((e) => e.name)
    .filter((name) => levelOf(name) < 0);
  assert.deepEqual(unplaced, []);
  const missing = LEVELS.flat().filter((name) => {
    const where = name === "ffi" || name.endsWith(".ts") && !LEVELS[1].includes(name)
      ? path.join(repo, name)
      : path.join(repo, "lib", name);
    try {
      Deno.statSync(where);
      return false;
    } catch {
      return true;
    }
  });
  assert.deepEqual(missing, [], "LEVELS names something that does not exist");
});

Deno.test("no module imports upward or sideways", () => {
  const problems: string[] = [];
  const roots = [path.join(repo, "mod.ts"), path.join(repo, "main.ts")];
  const files = [...tsFiles(path.join(repo, "lib")), ...tsFiles(path.join(repo, "ffi")), ...roots];
  for (const file of files) {
    const from = unitOf(file)!;
    for (const target of importsOf(file)) {
      const to = unitOf(target);
      if (to === undefined) {
        problems.push(`${path.relative(repo, file)} imports ${path.relative(repo, target)}`);
        continue;
      }
      if (to === from || ALLOWED_SIDEWAYS.has(`${from} -> ${to}`)) continue;
      if (levelOf(to) >= levelOf(from)) {
        problems.push(`${path.relative(repo, file)} imports ${path.relative(repo, target)}`);
      }
    }
  }
  assert.deepEqual(problems, []);
});

Deno.test("the order check catches an upward import", () => {
  // The rule itself, on a made-up edge: model importing generate must be a problem.
  assert.ok(levelOf("generate") > levelOf("model"));
  assert.ok(levelOf("chat") === levelOf("serve"), "chat and serve are siblings");
});
