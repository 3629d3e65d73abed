/**
 * Data flows one way: checkpoint -> layout -> memory -> model -> generate -> chat/serve ->
 * cli. No folder of lib/ imports one above it (docs/ARCHITECTURE.md). lib/layout sits on
 * the checkpoint's type declarations only, below everything that moves bytes.
 */
import assert from "node:assert/strict";
import * as path from "node:path";

const lib = path.resolve(import.meta.dirname!, "..", "lib");

/** Everything above the checkpoint reader. */
const ABOVE_CHECKPOINT = [
  "memory",
  "model",
  "generate.ts",
  "batch.ts",
  "session.ts",
  "textgen.ts",
  "chat",
  "serve",
  "cli",
];

/** What each folder may not import (folders of lib/, or files for the layout rule). */
const FORBIDDEN: Record<string, string[]> = {
  checkpoint: ABOVE_CHECKPOINT,
  layout: [
    "memory",
    "model",
    "io",
    "generate.ts",
    "batch.ts",
    "session.ts",
    "chat",
    "serve",
    "cli",
  ],
  memory: ["model", "generate.ts", "batch.ts", "session.ts", "textgen.ts", "chat", "serve", "cli"],
  model: ["generate.ts", "batch.ts", "session.ts", "textgen.ts", "chat", "serve", "cli"],
  // The Hub client (download, verify, repo ids) stands beside the engine: it uses none of it.
  hub: ["checkpoint", "layout", "speculate", "text", "synth", "bench", ...ABOVE_CHECKPOINT],
};

function importsOf(file: string): string[] {
  const text = Deno.readTextFileSync(file);
  const out: string[] = [];
  for (const m of text.matchAll(/(?:import|export)[^"']*?from\s+["']([^"']+)["']/g)) {
    if (m[1].startsWith(".")) out.push(path.resolve(path.dirname(file), m[1]));
  }
  return out;
}

Deno.test("no folder of lib/ imports one above it", () => {
  const problems: string[] = [];
  for (const [folder, forbidden] of Object.entries(FORBIDDEN)) {
    for (const entry of Deno.readDirSync(path.join(lib, folder))) {
      if (!entry.name.endsWith(".ts")) continue;
      const file = path.join(lib, folder, entry.name);
      for (const target of importsOf(file)) {
        const rel = path.relative(lib, target);
        const top = rel.split(path.sep)[0];
        if (forbidden.includes(top)) {
          problems.push(`lib/${folder}/${entry.name} imports lib/${rel}`);
        }
        // The layout reads the checkpoint's type declarations, nothing else of it.
        if (folder === "layout" && top === "checkpoint" && rel !== "checkpoint/types.ts") {
          problems.push(`lib/layout/${entry.name} imports lib/${rel}`);
        }
      }
    }
  }
  assert.deepEqual(problems, []);
});
