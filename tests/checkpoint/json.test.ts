/**
 * The strict JSON scanner (lib/checkpoint/json.ts) against JSON.parse: on seeded random
 * mutations of a document holding every kind of value, it accepts exactly what JSON.parse
 * accepts and reads the same values, whole or fed in chunks of 1, 3 and 7 characters.
 */

import assert from "node:assert/strict";
import { JsonScanner } from "../../lib/checkpoint/json.ts";
import { K3Error } from "../../lib/errors.ts";

/** Reads one value with the scanner's pull API (recursion is fine for this small test). */
function read(s: JsonScanner): unknown {
  const kind = s.next();
  if (kind === "string") return s.string();
  if (kind === "number") return s.number();
  if (kind === "literal" || kind === "end") return s.literal();
  if (kind === "array") {
    s.beginArray();
    const out: unknown[] = [];
    for (let i = 0; s.item(i); i++) out.push(read(s));
    return out;
  }
  s.beginObject();
  const out: Record<string, unknown> = {};
  for (let i = 0;; i++) {
    const k = s.key(i);
    if (k === null) return out;
    Object.defineProperty(out, k, { value: read(s), enumerable: true, writable: true });
  }
}

function scanner(text: string, chunk: number): JsonScanner {
  if (chunk === 0) return new JsonScanner("doc", text);
  let at = 0;
  return new JsonScanner("doc", () => {
    if (at >= text.length) return null;
    at += chunk;
    return text.slice(at - chunk, at);
  });
}

/** The value, or undefined when the scanner refuses the text (always as bad input). */
function scan(text: string, chunk: number, skip: boolean): { value?: unknown } {
  const s = scanner(text, chunk);
  try {
    const value = skip ? (s.skipValue(), "skipped") : read(s);
    s.finish();
    return { value };
  } catch (e) {
    assert.ok(e instanceof K3Error && e.exitCode === 2, `not bad input: ${e}`);
    assert.match(e.message, /^doc is not valid JSON \(at character \d+: /);
    return {};
  }
}

Deno.test("JSON scanner accepts what JSON.parse accepts and reads the same values", () => {
  const base = JSON.stringify(
    {
      a: [1, 2.5, -3e5, 0, -0.25e-2, 'x\\y"z\u00e9', "é中😀", true, false, null, { b: {} }],
      "c d": "",
      "e\u0001f": [[[]], {}],
      g: 12345678901234,
    },
    null,
    1,
  );
  let seed = 7;
  const rnd = (n: number) => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % n;
  const alphabet = '{}[]",:0123456789-+.eE \n\\tfnrua\u0001é';
  let accepted = 0;
  for (let i = 0; i < 3000; i++) {
    const chars = [...base];
    for (let j = 1 + rnd(3); j > 0; j--) {
      const at = rnd(chars.length), op = rnd(3), c = alphabet[rnd(alphabet.length)];
      if (op === 0) chars.splice(at, 1);
      else if (op === 1) chars.splice(at, 0, c);
      else chars[at] = c;
    }
    const text = chars.join("");
    let want: { value?: unknown } = {};
    try {
      want = { value: JSON.parse(text) };
      accepted++;
    } catch { /* refused by JSON.parse too */ }
    for (const chunk of [0, 1, 3, 7]) {
      const got = scan(text, chunk, false);
      assert.deepEqual(got, want, `chunk ${chunk}: ${JSON.stringify(text)}`);
      assert.equal("value" in scan(text, chunk, true), "value" in want, JSON.stringify(text));
    }
  }
  assert.ok(accepted > 100 && accepted < 2900, `${accepted} of 3000 mutations were valid`);
});

Deno.test("JSON scanner: duplicate keys are seen, deep nesting is no stack overflow", () => {
  const s = new JsonScanner("doc", '{"a": 1, "a": 2}');
  s.beginObject();
  assert.equal(s.key(0), "a");
  s.skipValue();
  assert.equal(s.key(1), "a");
  const deep = "[".repeat(200_000) + "]".repeat(200_000);
  const d = new JsonScanner("doc", deep);
  d.skipValue();
  d.finish();
});
