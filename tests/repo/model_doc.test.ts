/**
 * docs/MODEL.md is the model as the code implements it, and comments cite its numbered
 * sections ("MODEL.md §4.4", "MODEL.md §7.1–§7.3"). A renumbered or deleted section would leave
 * those citations pointing nowhere, so every one in the repository's .ts, .c, .h and .md files
 * must name a numbered heading of docs/MODEL.md; so must MODEL.md's own "§N" cross-references.
 * The model description outside the repository is not cited at all.
 */
import assert from "node:assert/strict";
import * as path from "node:path";

const repo = path.resolve(import.meta.dirname!, "..", "..");
const MODEL_DOC = "docs/MODEL.md";

/** Folders that hold no source of this repository (dependencies, build output, VCS data). */
const SKIPPED_DIRS = new Set([".git", ".cache", "node_modules", "build", "dist", "cov", "tools"]);
const SOURCE_FILE = /\.(ts|c|h|md)$/;

/** Section numbers of the numbered headings: "## 4. Forward pass" -> "4", "### 4.4 KDA" -> "4.4". */
function sectionNumbers(markdown: string): Set<string> {
  const numbers = new Set<string>();
  for (const m of markdown.matchAll(/^#{2,6} (\d+(?:\.\d+)*)\.? /gm)) numbers.add(m[1]);
  return numbers;
}

/** One section number as cited: "§4", "§4.4". */
const SECTION = String.raw`§\d+(?:\.\d+)*`;
/** A list or range after one "MODEL.md": "§4.1", "§4.1, §4.4", "§7.1–§7.3", "§2 and §3". */
const CITATION = new RegExp(
  String.raw`MODEL\.md (${SECTION}(?:\s*(?:,|–|-|and|or)\s*${SECTION})*)`,
  "g",
);

/** Every section number a text cites as "MODEL.md §…" (each number of a list or range). */
function citedSections(text: string): string[] {
  const cited: string[] = [];
  for (const m of text.matchAll(CITATION)) {
    for (const s of m[1].matchAll(new RegExp(SECTION, "g"))) cited.push(s[0].slice(1));
  }
  return cited;
}

/** "file:line: MODEL.md §N" for each citation in `text` that names no heading in `numbers`. */
function danglingCitations(
  file: string,
  text: string,
  numbers: Set<string>,
  cite: (text: string) => string[] = citedSections,
): string[] {
  const dangling: string[] = [];
  text.split("\n").forEach((line, i) => {
    for (const n of cite(line)) {
      if (!numbers.has(n)) dangling.push(`${file}:${i + 1}: MODEL.md §${n}`);
    }
  });
  return dangling;
}

/** MODEL.md's own cross-references: every "§N" in it. */
function selfCitations(text: string): string[] {
  return [...text.matchAll(new RegExp(SECTION, "g"))].map((m) => m[0].slice(1));
}

/** Repository-relative paths of every .ts, .c, .h and .md file. */
function sourceFiles(dir = repo): string[] {
  const files: string[] = [];
  for (const entry of Deno.readDirSync(dir)) {
    const full = path.join(dir, entry.name);
    if (entry.isDirectory && !SKIPPED_DIRS.has(entry.name)) files.push(...sourceFiles(full));
    else if (entry.isFile && SOURCE_FILE.test(entry.name)) files.push(path.relative(repo, full));
  }
  return files.sort();
}

const doc = Deno.readTextFileSync(path.join(repo, MODEL_DOC));
const numbers = sectionNumbers(doc);

Deno.test("docs/MODEL.md has numbered sections for the parts the code cites, each once", () => {
  const headings = [...doc.matchAll(/^#{2,6} (\d+(?:\.\d+)*)\.? /gm)].map((m) => m[1]);
  assert.equal(headings.length, numbers.size, `a section number is used twice: ${headings}`);
  for (const n of ["1.2", "2.1", "2.2", "3.2", "3.3", "3.4", "4.1", "4.4", "4.6", "4.8", "5.2"]) {
    assert.ok(numbers.has(n), `${MODEL_DOC} has no section ${n}`);
  }
  for (const n of ["6.1", "6.3", "7.1", "7.2", "7.3", "7.4"]) {
    assert.ok(numbers.has(n), `${MODEL_DOC} has no section ${n}`);
  }
});

Deno.test("every MODEL.md § reference in the repository names a section of docs/MODEL.md", () => {
  const files = sourceFiles();
  assert.ok(files.includes("lib/model/forward.ts") && files.includes("csrc/kda.c"), "walked");
  const dangling: string[] = [];
  let citations = 0;
  for (const file of files) {
    const text = Deno.readTextFileSync(path.join(repo, file));
    citations += citedSections(text).length;
    dangling.push(...danglingCitations(file, text, numbers));
  }
  dangling.push(...danglingCitations(MODEL_DOC, doc, numbers, selfCitations));
  assert.ok(citations >= 30, `only ${citations} MODEL.md citations found: is the pattern right?`);
  assert.deepEqual(dangling, []);
});

Deno.test("a dangling reference is reported, with every number of a list or range", () => {
  const made = new Set(["4", "4.4", "7.1", "7.3"]);
  // Built at run time so that this file holds no dangling citation itself.
  const cite = (n: string) => `MODEL.md ${"§"}${n}`;
  const text = [
    `/* KDA (${cite("4.4")}). */`,
    `// the tokenizer (${cite("6.9")}) and the chat format (${cite("7.1")}–${"§"}7.3)`,
    `// see ${cite("4")}, ${"§"}4.12 and ${cite("12")}`,
  ].join("\n");
  assert.deepEqual(citedSections(text), ["4.4", "6.9", "7.1", "7.3", "4", "4.12", "12"]);
  assert.deepEqual(danglingCitations("made-up.ts", text, made), [
    `made-up.ts:2: MODEL.md ${"§"}6.9`,
    `made-up.ts:3: MODEL.md ${"§"}4.12`,
    `made-up.ts:3: MODEL.md ${"§"}12`,
  ]);
  // A prefix of a real number is not that number.
  assert.deepEqual(danglingCitations("x.ts", cite("4.41"), made), [`x.ts:1: MODEL.md ${"§"}4.41`]);
  assert.deepEqual(
    sectionNumbers("## 4. Forward\n### 4.4 KDA\n#### not numbered\n4.5 not a heading\n"),
    new Set(["4", "4.4"]),
  );
});

Deno.test("no comment cites the model description that lives outside the repository", () => {
  // Its file name, and its name followed by a section sign or a number, spelled from parts so
  // that this file does not match itself.
  const name = "SPEC";
  const external = new RegExp(String.raw`\b${name} §|K3-${name}|${name}\.md|\b${name} \d`);
  const found = sourceFiles()
    .flatMap((file) =>
      Deno.readTextFileSync(path.join(repo, file)).split("\n").flatMap((line, i) =>
        external.test(line) ? [`${file}:${i + 1}: ${line.trim()}`] : []
      )
    );
  assert.deepEqual(found, []);
});
