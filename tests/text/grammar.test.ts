/**
 * Constrained decoding: the vocabulary handed to xgrammar (checked on every token), schema
 * checks, and generation on the tiny model (random weights: only the constraint can make its
 * output valid), validated by an independent JSON Schema validator (ajv).
 */

import assert from "node:assert/strict";
import * as path from "node:path";
import { Ajv } from "ajv";
import addFormats from "ajv-formats";
import { K3Error } from "../../lib/errors.ts";
import { generate, type TokenPicker } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import { Session } from "../../lib/generate/session.ts";
import { formatTiktokenRanks, padVocabulary } from "../../lib/synth/bpe.ts";
import { synthVocabulary, tokenizerConfig } from "../../lib/synth/tiny.ts";
import {
  BYTE_TO_CHAR,
  byteLevelVocabulary,
  checkSchema,
  ConstrainedPicker,
  GrammarEngine,
  type GrammarSpec,
  Utf8Guard,
} from "../../lib/text/grammar.ts";
import { Sampler, type SamplingOptions } from "../../lib/text/sampler.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import { MARKUP_BYTES } from "../../lib/text/tool_grammar.ts";
import { ScriptedDrafter } from "../../lib/speculate/drafter.ts";
import { FixedPolicy } from "../../lib/speculate/policy.ts";
import { tempDir, tinyModel } from "../support/helpers.ts";

const EOM = "<|end_of_msg|>";

/** The inverse of the byte-level alphabet, built from its definition, not from BYTE_TO_CHAR. */
function charToByte(): Map<string, number> {
  const printable = (b: number) =>
    (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
  const out = new Map<string, number>();
  let next = 256;
  for (let b = 0; b < 256; b++) out.set(String.fromCodePoint(printable(b) ? b : next++), b);
  return out;
}

/**
 * True when `bytes` follow UTF-8's byte pattern as xgrammar reads it (lead bytes 0xxxxxxx,
 * 110xxxxx, 1110xxxx, 11110xxx, each followed by its 10xxxxxx bytes; cut at the end allowed).
 */
function isUtf8PatternPrefix(bytes: Uint8Array): boolean {
  let need = 0;
  for (const b of bytes) {
    if (need > 0) {
      if ((b & 0xc0) !== 0x80) return false;
      need--;
    } else if (b < 0x80) need = 0;
    else if ((b & 0xe0) === 0xc0) need = 1;
    else if ((b & 0xf0) === 0xe0) need = 2;
    else if ((b & 0xf8) === 0xf0) need = 3;
    else return false;
  }
  return true;
}

/**
 * Every id of `tokenizer` reaches xgrammar as its exact bytes: the byte-level text maps back
 * to them; xgrammar's own decoding equals the tokenizer's text for every valid UTF-8 token;
 * and a grammar of any characters accepts a token as its first exactly when its bytes start
 * valid UTF-8 (which tells each lone byte of a split character apart).
 */
async function checkVocabulary(tokenizer: Tokenizer): Promise<void> {
  const inverse = charToByte();
  const vocab = byteLevelVocabulary(tokenizer, tokenizer.vocabSize);
  const eom = tokenizer.specialId(EOM)!;
  const engine = await GrammarEngine.create(tokenizer, tokenizer.vocabSize, [eom]);
  try {
    const decoded = engine.decodedVocabulary();
    assert.equal(decoded.length, tokenizer.vocabSize);
    const compiled = await engine.compile({ type: "ebnf", grammar: String.raw`root ::= [^\x00]*` });
    const xmatcher = await engine.matcher(compiled);
    const utf8 = new TextDecoder("utf-8", { fatal: true });
    let exact = 0, split = 0, markup = 0;
    for (let id = 0; id < tokenizer.vocabSize; id++) {
      if (tokenizer.isSpecial(id)) {
        // The markup specials are their control byte; every other special is empty.
        const byte = MARKUP_BYTES.get(tokenizer.specialName(id)!);
        const expected = byte === undefined ? "" : String.fromCharCode(byte);
        assert.equal(vocab[id], byte === undefined ? "" : BYTE_TO_CHAR[byte], `special ${id}`);
        assert.equal(decoded[id], expected, `special ${id}`);
        if (byte !== undefined) markup++;
        continue;
      }
      const bytes = tokenizer.idToBytes(id);
      assert.deepEqual([...vocab[id]].map((c) => inverse.get(c)), [...bytes], `token ${id}`);
      let text: string | undefined;
      try {
        text = utf8.decode(bytes);
      } catch { /* a piece of a character: checked by the matcher below */ }
      if (text !== undefined && !text.includes("\0")) {
        assert.equal(decoded[id], text, `token ${id}`);
        exact++;
      }
      const accepted = xmatcher.acceptsAlone(id);
      assert.equal(accepted, isUtf8PatternPrefix(bytes) && !bytes.includes(0), `token ${id}`);
      if (text === undefined) split++;
    }
    assert.ok(exact > 0 && split > 0, `${exact} whole, ${split} split`);
    assert.equal(markup, MARKUP_BYTES.size);
    xmatcher.dispose();
  } finally {
    engine.dispose();
  }
}

Deno.test("grammar: the byte-level alphabet is a bijection onto 256 printable characters", () => {
  assert.equal(new Set(BYTE_TO_CHAR).size, 256);
  for (const c of BYTE_TO_CHAR) assert.ok(!/\s/u.test(c), JSON.stringify(c));
  assert.equal(BYTE_TO_CHAR[0x20], "\u0120"); // GPT-2's "Ġ" for a space
  assert.equal(BYTE_TO_CHAR[0x41], "A");
});

Deno.test("grammar: every token of the tiny model's vocabulary reaches xgrammar as its bytes", async () => {
  await checkVocabulary(await Tokenizer.load(await tinyModel()));
});

Deno.test("grammar: every token of a full-size (163,840-id) vocabulary reaches xgrammar as its bytes", async () => {
  const dir = tempDir();
  const ranks = padVocabulary(synthVocabulary(), 163_840 - 256);
  await Deno.writeTextFile(path.join(dir, "tiktoken.model"), formatTiktokenRanks(ranks));
  await Deno.writeTextFile(
    path.join(dir, "tokenizer_config.json"),
    JSON.stringify(tokenizerConfig(163_840)),
  );
  const tokenizer = await Tokenizer.load(dir);
  try {
    assert.equal(tokenizer.vocabSize, 163_840);
    await checkVocabulary(tokenizer);
  } finally {
    tokenizer.free();
  }
});

Deno.test("grammar: the UTF-8 guard takes a token sequence exactly when its bytes are strict UTF-8", async () => {
  const tokenizer = await Tokenizer.load(await tinyModel());
  const guard = new Utf8Guard(tokenizer);
  const strict = (bytes: Uint8Array) => {
    try {
      new TextDecoder("utf-8", { fatal: true }).decode(bytes, { stream: true });
      return true;
    } catch {
      return false;
    }
  };
  const ids = Array.from({ length: tokenizer.vocabSize }, (_, id) => id)
    .filter((id) => !tokenizer.isSpecial(id));
  // Every token alone, and every token after each lead byte (overlong, surrogate and
  // out-of-range forms among them).
  for (const first of [undefined, ...ids.filter((id) => tokenizer.idToBytes(id)[0] >= 0xc0)]) {
    const state = first === undefined ? 0 : guard.after(0, first);
    if (state < 0) continue;
    const head = first === undefined ? [] : [...tokenizer.idToBytes(first)];
    for (const id of ids) {
      const bytes = new Uint8Array([...head, ...tokenizer.idToBytes(id)]);
      assert.equal(guard.after(state, id) >= 0, strict(bytes), `${first} then ${id}`);
    }
  }
  tokenizer.free();
});

Deno.test("grammar: unsupported schema keywords are refused by name", () => {
  const refuse = (schema: unknown, keyword: string) =>
    assert.throws(() => checkSchema(schema, "schema"), (e: unknown) => {
      assert.ok(e instanceof K3Error && e.exitCode === 2);
      assert.match((e as Error).message, new RegExp(`"${keyword.replace("$", "\\$")}"`));
      return true;
    });
  refuse({ type: "string", not: { const: "a" } }, "not");
  refuse(
    { type: "object", properties: { a: { type: "array", uniqueItems: true } } },
    "uniqueItems",
  );
  refuse({ anyOf: [{ type: "integer", multipleOf: 3 }] }, "multipleOf");
  refuse({ $defs: { x: { if: { type: "string" } } } }, "if");
  refuse({ oneOf: [{ type: "string" }] }, "oneOf");
  const refusePattern = (pattern: string, why: RegExp) =>
    assert.throws(() => checkSchema({ type: "string", pattern }, "schema"), why);
  refusePattern("([a-", /schema\.pattern is not a valid regular expression/);
  refusePattern("^(?=a)b$", /"\(\?="/);
  refusePattern("(a)\\1", /"\\\\1"/);
  checkSchema({ type: "string", pattern: "^[a-z]+(-[0-9]{2})?$" }, "schema");
  // Values the engine would abort on, each named.
  const refuseValue = (schema: unknown, why: RegExp) =>
    assert.throws(() => checkSchema(schema, "schema"), why);
  refuseValue({ type: "integer", minimum: 5, maximum: 1 }, /minimum 5 is greater than maximum 1/);
  refuseValue({ type: "array", minItems: 3, maxItems: 2 }, /minItems 3 is greater/);
  refuseValue({ $ref: "#/$defs/nope" }, /schema\.\$ref: "#\/\$defs\/nope" points at nothing/);
  refuseValue({ type: "wat" }, /schema\.type: "wat" is not a JSON type/);
  refuseValue({ enum: [] }, /schema\.enum must be a non-empty list/);
  refuseValue({ type: "string", maxLength: 33 }, /schema\.maxLength is 33: at most 32/);
  refuseValue({ type: "string", format: "phone" }, /schema\.format "phone" is not supported/);
  refuseValue({ type: "string", format: "date" }, /schema\.format "date" is not supported/);
  refuseValue(false, /no value could match it/);
  refuseValue(
    { type: "string", pattern: "^a+$", maxLength: 3 },
    /schema: "pattern" with "maxLength" is not supported/,
  );
  checkSchema({
    $defs: { n: { type: "object", properties: { next: { anyOf: [{ $ref: "#/$defs/n" }] } } } },
    $ref: "#/$defs/n",
    additionalProperties: false,
  }, "schema");
  checkSchema({ type: "object", properties: { a: { enum: [{ not: 1 }] } } }, "schema");
});

Deno.test("grammar: a grammar the engine refuses is bad input with its reason, and the engine goes on", async () => {
  const tokenizer = await Tokenizer.load(await tinyModel());
  const engine = await GrammarEngine.create(tokenizer, tokenizer.vocabSize, [
    tokenizer.specialId(EOM)!,
  ]);
  try {
    await assert.rejects(
      engine.compile({ type: "ebnf", grammar: 'root ::= "a" b' }),
      (e: unknown) => {
        assert.ok(e instanceof K3Error && e.exitCode === 2);
        assert.match(
          (e as Error).message,
          /grammar could not be compiled: .*Rule "b" is not defined/,
        );
        assert.doesNotMatch((e as Error).message, /\.cc:/);
        return true;
      },
    );
    const m = await engine.matcher(await engine.compile({ type: "ebnf", grammar: 'root ::= "a"' }));
    assert.ok(m.syncTo(tokenizer.encode("a")));
    m.dispose();
  } finally {
    engine.dispose();
    tokenizer.free();
  }
});

// ---- generation on the tiny model ----

/** Schemas whose every string, array and number is bounded, so output ends in few tokens. */
const SCHEMAS: Record<string, Record<string, unknown>> = {
  required: {
    type: "object",
    properties: { ok: { type: "boolean" }, note: { type: "string", maxLength: 4 } },
    required: ["ok", "note"],
    additionalProperties: false,
  },
  enum: {
    type: "object",
    properties: { color: { enum: ["red", "green", "blue"] } },
    required: ["color"],
  },
  integerBounds: {
    type: "object",
    properties: { n: { type: "integer", minimum: -5, maximum: 12 } },
    required: ["n"],
  },
  array: {
    type: "array",
    items: { type: "integer", minimum: 0, maximum: 9 },
    minItems: 1,
    maxItems: 3,
  },
  nested: {
    type: "object",
    properties: {
      point: {
        type: "object",
        properties: { x: { type: "integer", minimum: 0, maximum: 99 }, y: { const: 0 } },
        required: ["x", "y"],
      },
    },
    required: ["point"],
  },
  anyOf: {
    anyOf: [
      { type: "object", properties: { kind: { const: "a" } }, required: ["kind"] },
      { type: "integer", minimum: 100, maximum: 200 },
    ],
  },
  pattern: {
    type: "object",
    properties: { code: { type: "string", pattern: "^[A-Z]{2}-[0-9]{2,3}$" } },
    required: ["code"],
  },
  format: {
    type: "object",
    properties: {
      id: { type: "string", format: "uuid" },
      tag: { enum: ["x", "y"] },
    },
    required: ["id", "tag"],
  },
};

interface Fixture {
  model: Model;
  tokenizer: Tokenizer;
  engine: GrammarEngine;
  eom: number;
  prompt: number[];
}

async function fixture(): Promise<Fixture> {
  const dir = await tinyModel({ seed: 11 });
  const model = await Model.open(dir);
  const tokenizer = await Tokenizer.load(dir);
  const eom = tokenizer.specialId(EOM)!;
  const engine = await GrammarEngine.create(tokenizer, model.config.vocabSize, [eom]);
  return { model, tokenizer, engine, eom, prompt: tokenizer.encode("Answer in JSON:") };
}

function release(f: Fixture): void {
  f.engine.dispose();
  f.tokenizer.free();
  f.model.close();
}

async function run(
  f: Fixture,
  picker: TokenPicker,
  maxTokens: number,
  drafts?: (context: readonly number[]) => number[],
): Promise<number[]> {
  const ids: number[] = [];
  const speculate = drafts
    ? { drafter: new ScriptedDrafter(drafts), draftMax: 3, policy: new FixedPolicy(3) }
    : undefined;
  for await (
    const step of generate(f.model, f.prompt, { maxTokens, picker, stopIds: [f.eom], speculate })
  ) ids.push(step.token);
  return ids;
}

async function constrained(f: Fixture, spec: GrammarSpec, sampling: SamplingOptions) {
  return new ConstrainedPicker(
    new Sampler(sampling),
    await f.engine.matcher(await f.engine.compile(spec)),
  );
}

Deno.test("grammar: sampled output of a random model parses and validates for every schema and seed", async () => {
  const f = await fixture();
  const ajv = new Ajv({ strict: false });
  (addFormats as unknown as { default: typeof addFormats.default }).default(ajv, [
    "uuid",
    "ipv4",
    "time",
    "email",
    "hostname",
    "duration",
  ]);
  try {
    for (const [name, schema] of Object.entries(SCHEMAS)) {
      const validate = ajv.compile(schema);
      for (let seed = 0; seed < 20; seed++) {
        const picker = await constrained(f, { type: "json_schema", schema }, {
          temperature: 1,
          seed,
        });
        const ids = await run(f, picker, name === "format" ? 120 : 60);
        picker.dispose();
        assert.equal(ids.at(-1), f.eom, `${name} seed ${seed}: ended without a stop`);
        const text = f.tokenizer.decode(ids.slice(0, -1));
        const value = JSON.parse(text);
        assert.ok(
          validate(value),
          `${name} seed ${seed}: ${text} ${ajv.errorsText(validate.errors)}`,
        );
      }
    }
  } finally {
    release(f);
  }
});

Deno.test("grammar: an unconstrained random model's output is not valid JSON (the constraint is what makes it so)", async () => {
  const f = await fixture();
  try {
    let parsed = 0;
    for (let seed = 0; seed < 5; seed++) {
      const text = f.tokenizer.decode(await run(f, new Sampler({ temperature: 1, seed }), 20));
      try {
        JSON.parse(text);
        parsed++;
      } catch { /* expected */ }
    }
    assert.equal(parsed, 0);
  } finally {
    release(f);
  }
});

/** How many of `ids` from the start are ordinary tokens that make whole UTF-8 text. */
function longestTextPrefix(tokenizer: Tokenizer, ids: number[]): number {
  for (let k = ids.length; k > 0; k--) {
    if (ids.slice(0, k).some((id) => tokenizer.isSpecial(id))) continue;
    try {
      new TextDecoder("utf-8", { fatal: true }).decode(
        new Uint8Array(ids.slice(0, k).flatMap((id) => [...tokenizer.idToBytes(id)])),
      );
      return k;
    } catch { /* a shorter prefix */ }
  }
  return 0;
}

Deno.test("grammar: greedy constrained tokens equal the unconstrained run when that already fits", async () => {
  const f = await fixture();
  try {
    // A free greedy run of ordinary tokens that is whole UTF-8 text (a random model also
    // writes special ids and pieces of characters, which no grammar of characters spells):
    // its longest such prefix, on the first of a few prompts where that is 3 tokens or more.
    let free: number[] = [];
    for (const text of ["Answer in JSON:", "hello world", "The r", "1, 2, 3"]) {
      const g = { ...f, prompt: f.tokenizer.encode(text) };
      const ids = await run(g, new Sampler(), 12);
      const k = longestTextPrefix(f.tokenizer, ids);
      if (k >= 3) {
        free = ids.slice(0, k);
        f.prompt = g.prompt;
        break;
      }
    }
    assert.ok(free.length >= 3, "no prompt gave a free run of 3 text tokens");
    // A grammar that accepts exactly this text (then a stop), every character escaped:
    // the constrained run must not change a token.
    const literal = [...f.tokenizer.decode(free)]
      .map((c) => `\\U${c.codePointAt(0)!.toString(16).padStart(8, "0")}`).join("");
    const picker = await constrained(f, { type: "ebnf", grammar: `root ::= "${literal}"` }, {});
    const ids = await run(f, picker, free.length + 1);
    picker.dispose();
    assert.deepEqual(ids, [...free, f.eom]);
    // And on a grammar the free run does not fit, the constrained run differs.
    const json = await constrained(f, { type: "json_object" }, {});
    const other = await run(f, json, 6);
    json.dispose();
    assert.notDeepEqual(other.slice(0, free.length), free);
    assert.equal(f.tokenizer.decode(other)[0], "{");
  } finally {
    release(f);
  }
});

Deno.test("grammar: speculation gives the same constrained tokens as plain decoding", async () => {
  const f = await fixture();
  try {
    const spec: GrammarSpec = { type: "json_schema", schema: SCHEMAS.nested };
    for (const sampling of [{}, { temperature: 1, seed: 3 }]) {
      const plain = await run(f, await constrained(f, spec, sampling), 40);
      const n = f.prompt.length;
      // Drafts: the right next token, then one the grammar never allows here (a special id,
      // or a second opening brace), then the right one again.
      const drafts = (context: readonly number[]) => {
        const at = context.length - n;
        return [plain[at], at % 2 ? f.eom - 1 : plain[0], plain[at + 2]]
          .filter((t) => t !== undefined);
      };
      const speculated = await run(f, await constrained(f, spec, sampling), 40, drafts);
      assert.deepEqual(speculated, plain);
    }
  } finally {
    release(f);
  }
});

Deno.test("grammar: the answer is constrained only after the think channel ends", async () => {
  const f = await fixture();
  try {
    const close = f.tokenizer.specialId("<|close|>")!;
    const thinkEnd = [close, ...f.tokenizer.encode("think"), f.tokenizer.specialId("<|sep|>")!];
    // A bias makes the random model close its think channel on the third token.
    const sampler = (i: number) => ({
      next: (logits: Float32Array, h: { tokens: readonly number[]; promptLength: number }) =>
        h.tokens.length - h.promptLength === i ? close : new Sampler().next(logits, h),
    });
    const free = await run(f, sampler(99) as unknown as TokenPicker, 2);
    const matcher = await f.engine.matcher(
      await f.engine.compile({ type: "json_schema", schema: SCHEMAS.enum }),
    );
    const picker = new ConstrainedPicker(sampler(2) as unknown as Sampler, matcher, { thinkEnd });
    const ids = await run(f, picker, 40);
    picker.dispose();
    assert.deepEqual(ids.slice(0, 2), free, "thinking is free");
    assert.deepEqual(ids.slice(2, 2 + thinkEnd.length), thinkEnd);
    const answer = ids.slice(2 + thinkEnd.length);
    assert.equal(answer.at(-1), f.eom);
    const value = JSON.parse(f.tokenizer.decode(answer.slice(0, -1)));
    assert.ok(["red", "green", "blue"].includes(value.color));
  } finally {
    release(f);
  }
});

Deno.test("grammar: in a batch each sequence keeps its own grammar and gets its solo tokens", async () => {
  const f = await fixture();
  try {
    const cases: { spec: GrammarSpec; sampling: SamplingOptions }[] = [
      {
        spec: { type: "json_schema", schema: SCHEMAS.nested },
        sampling: { temperature: 1, seed: 5 },
      },
      { spec: { type: "json_schema", schema: SCHEMAS.pattern }, sampling: {} },
      {
        spec: { type: "json_schema", schema: SCHEMAS.nested },
        sampling: { temperature: 1, seed: 6 },
      },
      { spec: { type: "json_object" }, sampling: { temperature: 1, seed: 7 } },
    ];
    const solo: number[][] = [];
    for (const c of cases) solo.push(await run(f, await constrained(f, c.spec, c.sampling), 30));
    const session = new Session(f.model, { maxBatch: cases.length, passTokens: 512 });
    const batched = await Promise.all(cases.map(async (c) => {
      const ids: number[] = [];
      const picker = await constrained(f, c.spec, c.sampling);
      const steps = session.generate(f.prompt, { maxTokens: 30, picker, stopIds: [f.eom] });
      for await (const step of steps) ids.push(step.token);
      return ids;
    }));
    assert.deepEqual(batched, solo);
    assert.equal(session.batcher.stats.maxSequences, cases.length);
  } finally {
    release(f);
  }
});
