/**
 * Short functions: no function in lib/ (declaration, method, function expression or arrow
 * function, nested ones counted on their own too) is longer than MAX_LINES, so each reads as
 * one step with a name. Measured on Deno's own lint AST (Deno.lint.runPlugin), from the line
 * of its head to the line of its closing brace.
 */
import assert from "node:assert/strict";
import * as path from "node:path";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const MAX_LINES = 100;

/**
 * Functions allowed over MAX_LINES for now, as "file name" with their length. Each is being
 * cut into named steps; the test fails when one is back under the limit, so that its entry is
 * removed and it cannot grow back.
 */
const OVER_FOR_NOW = new Map<string, number>([]);

interface FunctionLength {
  file: string;
  name: string;
  line: number;
  lines: number;
}

function tsFiles(dir: string): string[] {
  const out: string[] = [];
  for (const e of Deno.readDirSync(dir)) {
    const p = path.join(dir, e.name);
    if (e.isDirectory) out.push(...tsFiles(p));
    else if (e.name.endsWith(".ts")) out.push(p);
  }
  return out;
}

type Node = any;

/** A function's name: its own, the variable, property or method it is assigned to, or its caller's. */
function nameOf(node: Node): string {
  if (node.id?.name) return node.id.name;
  const p = node.parent;
  if (p?.type === "VariableDeclarator" && p.id?.name) return p.id.name;
  if (["Property", "MethodDefinition", "PropertyDefinition"].includes(p?.type) && p.key) {
    return p.key.name ?? String(p.key.value);
  }
  let outer = p;
  while (outer && !/Function/.test(outer.type)) outer = outer.parent;
  return outer ? `(callback in ${nameOf(outer)})` : "(callback)";
}

/** Every function of `source`, with its length in lines. */
function functionLengths(file: string, source: string): FunctionLength[] {
  const lineStarts = [0];
  for (let i = 0; i < source.length; i++) if (source[i] === "\n") lineStarts.push(i + 1);
  const lineOf = (offset: number) => {
    let lo = 0, hi = lineStarts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (lineStarts[mid] <= offset) lo = mid;
      else hi = mid - 1;
    }
    return lo + 1;
  };
  const found: FunctionLength[] = [];
  const measure = (node: Node) => {
    const [start, end] = node.range;
    const line = lineOf(start);
    found.push({ file, name: nameOf(node), line, lines: lineOf(end) - line + 1 });
  };
  const plugin = {
    name: "function-length",
    rules: {
      measure: {
        create: () => ({
          FunctionDeclaration: measure,
          FunctionExpression: measure,
          ArrowFunctionExpression: measure,
        }),
      },
    },
  };
  Deno.lint.runPlugin(plugin, file, source);
  return found;
}

function allFunctions(): FunctionLength[] {
  return tsFiles(path.join(repo, "lib")).flatMap((file) =>
    functionLengths(path.relative(repo, file), Deno.readTextFileSync(file))
  );
}

Deno.test("the measure: a function's lines from its head to its closing brace, by name", () => {
  const source = [
    "export function outer(a: number) {", // 1
    "  const inner = (b: number) => {", // 2
    "    return b;", // 3
    "  };", // 4
    "  return [a].map((x) => inner(x));", // 5
    "}", // 6
    "class C {", // 7
    "  method() {", // 8
    "    return 1;", // 9
    "  }", // 10
    "}", // 11
  ].join("\n");
  const got = functionLengths("probe.ts", source).map((f) => `${f.name}@${f.line}:${f.lines}`);
  assert.deepEqual(got.sort(), [
    "(callback in outer)@5:1",
    "inner@2:3",
    "method@8:3",
    "outer@1:6",
  ]);
});

Deno.test(`no function in lib/ is over ${MAX_LINES} lines`, () => {
  const all = allFunctions();
  assert.ok(all.length > 1000, `measured ${all.length} functions: the walk missed lib/`);
  const over = all.filter((f) => f.lines > MAX_LINES && !OVER_FOR_NOW.has(`${f.file} ${f.name}`));
  assert.deepEqual(
    over.map((f) => `${f.file}:${f.line} ${f.name} is ${f.lines} lines`),
    [],
    `split these into named steps (at most ${MAX_LINES} lines each)`,
  );
  for (const [key, was] of OVER_FOR_NOW) {
    const now = all.find((f) => `${f.file} ${f.name}` === key);
    assert.ok(
      now && now.lines > MAX_LINES,
      `${key} is ${now ? `${now.lines} lines` : "gone"}: remove it from OVER_FOR_NOW`,
    );
    assert.ok(now.lines <= was, `${key} grew from ${was} to ${now.lines} lines`);
  }
});
