/**
 * Tool calls under a grammar of K3's markup (tool_grammar.ts), on the tiny model (random
 * weights: only the constraint makes its calls parse): every seed's calls are read back by
 * k3's own output parser and validated against their tool's schema by ajv; a markup token is
 * never taken inside a JSON string; speculation gives the same tokens as plain decoding; the
 * rule renaming keeps literals and classes as they are.
 */
import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { generate, type TokenPicker } from "../../lib/generate/decode.ts";
import { Model } from "../../lib/model/model.ts";
import { ScriptedDrafter } from "../../lib/speculate/drafter.ts";
import { FixedPolicy } from "../../lib/speculate/policy.ts";
import { segmentIds, toolCallPrefill } from "../../lib/text/chat.ts";
import {
  ConstrainedPicker,
  GrammarEngine,
  type GrammarTool,
  type ToolCallsSpec,
} from "../../lib/text/grammar.ts";
import { Sampler } from "../../lib/text/sampler.ts";
import { TextStream } from "../../lib/text/stream.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";
import {
  literal,
  prefixRules,
  REGION_JSON,
  REGION_MARKUP,
  regionStep,
} from "../../lib/text/tool_grammar.ts";
import { tinyModel } from "../support/helpers.ts";

const SEEDS = 20;

/** One schema of each kind the issue names, each the arguments of a tool. */
const TOOLS: GrammarTool[] = [
  {
    name: "book",
    schema: {
      type: "object",
      properties: {
        room: { enum: ["a", "b", "c"] },
        nights: { type: "integer", minimum: 1, maximum: 9 },
        guests: { type: "array", items: { type: "integer", minimum: 0, maximum: 3 }, maxItems: 2 },
      },
      required: ["room", "nights", "guests"],
      additionalProperties: false,
    },
  },
  {
    name: "move",
    schema: {
      type: "object",
      properties: {
        to: {
          type: "object",
          properties: { x: { type: "integer", minimum: -3, maximum: 3 }, ok: { type: "boolean" } },
          required: ["x", "ok"],
          additionalProperties: false,
        },
        code: { type: "string", pattern: "^[A-Z]{2}-[0-9]{2}$" },
      },
      required: ["to", "code"],
      additionalProperties: false,
    },
  },
  {
    name: "note",
    schema: {
      type: "object",
      properties: {
        text: { type: "string", maxLength: 5 },
        tag: {
          anyOf: [{ type: "null" }, { const: "x" }, { type: "integer", minimum: 5, maximum: 6 }],
        },
      },
      required: ["text", "tag"],
      additionalProperties: false,
    },
  },
];

interface Fixture {
  model: Model;
  tokenizer: Tokenizer;
  engine: GrammarEngine;
  eom: number;
}

async function fixture(): Promise<Fixture> {
  const dir = await tinyModel({ seed: 11 });
  const model = await Model.open(dir);
  const tokenizer = await Tokenizer.load(dir);
  const eom = tokenizer.specialId("<|end_of_msg|>")!;
  const engine = await GrammarEngine.create(tokenizer, model.config.vocabSize, [eom]);
  return { model, tokenizer, engine, eom };
}

function release(f: Fixture): void {
  f.engine.dispose();
  f.tokenizer.free();
  f.model.close();
}

async function run(
  f: Fixture,
  prompt: number[],
  picker: TokenPicker,
  maxTokens: number,
  drafts?: (context: readonly number[]) => number[],
): Promise<number[]> {
  const speculate = drafts
    ? { drafter: new ScriptedDrafter(drafts), draftMax: 3, policy: new FixedPolicy(3) }
    : undefined;
  const ids: number[] = [];
  for await (
    const step of generate(f.model, prompt, { maxTokens, picker, stopIds: [f.eom], speculate })
  ) ids.push(step.token);
  return ids;
}

/** The calls k3's parser reads from `ids` (after `prefill`), with its notes. */
function parseCalls(f: Fixture, ids: number[], prefill: number[]) {
  const stream = new TextStream(f.tokenizer, {
    chat: { thinking: false, forcedCall: prefill.length > 0 },
  });
  stream.prime(prefill);
  for (const id of ids) if (id !== f.eom) stream.push(id);
  stream.flush();
  return stream.result();
}

Deno.test("tool grammar: every seed's calls parse and validate, required, forced and auto", async () => {
  const f = await fixture();
  const ajv = new Ajv({ strict: false });
  const validate = Object.fromEntries(TOOLS.map((t) => [t.name, ajv.compile(t.schema as object)]));
  const check = (name: string, args: unknown, what: string) => {
    assert.equal(typeof args, "string", `${what}: arguments are the json block's text`);
    const value = JSON.parse(args as string);
    assert.ok(validate[name](value), `${what}: ${args} ${ajv.errorsText(validate[name].errors)}`);
  };
  const prompt = f.tokenizer.encode("Call a tool:");
  let calls = 0;
  try {
    const required = await f.engine.compile({
      type: "tool_calls",
      tools: TOOLS,
      mode: "required",
      maxCalls: 2,
    });
    for (let seed = 0; seed < SEEDS; seed++) {
      const picker = new ConstrainedPicker(
        new Sampler({ temperature: 1, seed }),
        await f.engine.matcher(required),
      );
      const ids = await run(f, prompt, picker, 400);
      picker.dispose();
      assert.equal(ids.at(-1), f.eom, `required seed ${seed}: ended without a stop`);
      const out = parseCalls(f, ids, []);
      assert.deepEqual(out.malformed, [], `required seed ${seed}`);
      assert.equal(out.content, "");
      assert.ok(out.toolCalls.length >= 1 && out.toolCalls.length <= 2, `seed ${seed}`);
      for (const c of out.toolCalls) check(c.name, c.arguments, `required seed ${seed}`);
      calls += out.toolCalls.length;
    }
    for (const [i, tool] of TOOLS.entries()) {
      const prefill = segmentIds(f.tokenizer, toolCallPrefill(tool.name, false));
      const forced = await f.engine.compile({ type: "tool_calls", tools: [tool], mode: "forced" });
      for (let seed = 0; seed < SEEDS; seed += 5) {
        const picker = new ConstrainedPicker(
          new Sampler({ temperature: 1, seed: seed + i }),
          await f.engine.matcher(forced),
        );
        const ids = await run(f, [...prompt, ...prefill], picker, 200);
        picker.dispose();
        const out = parseCalls(f, ids, prefill);
        assert.deepEqual(out.malformed, [], `forced ${tool.name} seed ${seed}`);
        assert.equal(out.toolCalls.length, 1);
        assert.equal(out.toolCalls[0].name, tool.name);
        check(tool.name, out.toolCalls[0].arguments, `forced ${tool.name} seed ${seed}`);
        calls++;
      }
    }
    // auto, the plain answer held to a JSON format: either that JSON, or JSON then calls.
    const auto: ToolCallsSpec = {
      type: "tool_calls",
      tools: TOOLS,
      mode: "auto",
      content: { type: "json_schema", schema: { enum: [1, 2] } },
    };
    const compiled = await f.engine.compile(auto);
    for (let seed = 0; seed < SEEDS; seed += 4) {
      const picker = new ConstrainedPicker(
        new Sampler({ temperature: 1, seed }),
        await f.engine.matcher(compiled),
      );
      const ids = await run(f, prompt, picker, 400);
      picker.dispose();
      const out = parseCalls(f, ids, []);
      assert.deepEqual(out.malformed, [], `auto seed ${seed}`);
      assert.ok(["1", "2"].includes(out.content), `auto seed ${seed}: ${out.content}`);
      for (const c of out.toolCalls) check(c.name, c.arguments, `auto seed ${seed}`);
    }
  } finally {
    release(f);
  }
  assert.ok(calls >= SEEDS + TOOLS.length * 4, `${calls} calls validated`);
});

Deno.test("tool grammar: speculation gives the same constrained tokens as plain decoding", async () => {
  const f = await fixture();
  try {
    const compiled = await f.engine.compile({
      type: "tool_calls",
      tools: TOOLS,
      mode: "required",
      maxCalls: 1,
    });
    const prompt = f.tokenizer.encode("Call a tool:");
    const picker = async () =>
      new ConstrainedPicker(
        new Sampler({ temperature: 1, seed: 4 }),
        await f.engine.matcher(compiled),
      );
    const plain = await run(f, prompt, await picker(), 120);
    // Drafts: the right next token, then a markup token the grammar rarely allows there, then
    // the right one again.
    const open = f.tokenizer.specialId("<|open|>")!;
    const drafts = (context: readonly number[]) => {
      const at = context.length - prompt.length;
      return [plain[at], open, plain[at + 2]].filter((t) => t !== undefined);
    };
    assert.deepEqual(await run(f, prompt, await picker(), 120, drafts), plain);
  } finally {
    release(f);
  }
});

Deno.test("tool grammar: a markup token is refused inside a JSON string, control bytes outside free text", () => {
  const none = new Uint8Array(0);
  const bytes = (s: string) => new TextEncoder().encode(s);
  const close = 2, sep = 3;
  // Into the arguments: `<|sep|>` then `{"a":"`: inside a string.
  let s = regionStep(REGION_MARKUP, sep, none);
  s = regionStep(s, 0, bytes('{"a":"x'));
  assert.equal(s & 3, REGION_JSON);
  assert.equal(regionStep(s, close, none), -1, "no <|close|> inside a string");
  assert.equal(regionStep(s, 0, bytes("\n")), -1, "no control byte in JSON");
  // An escaped quote does not end the string; a plain one does.
  const escaped = regionStep(s, 0, bytes('\\"'));
  assert.equal(regionStep(escaped, close, none), -1);
  const ended = regionStep(escaped, 0, bytes('"}'));
  assert.equal(regionStep(ended, close, none) & 3, REGION_MARKUP);
  // In markup, a `{` not right after `<|sep|>` is not JSON; control bytes are refused there too.
  assert.equal(regionStep(REGION_MARKUP, 0, bytes("{")) & 3, REGION_MARKUP);
  assert.equal(regionStep(REGION_MARKUP, 0, bytes("\t")), -1);
  // Free text takes anything (the grammar keeps the markup bytes out of it).
  assert.equal(regionStep(0, 0, bytes("a\nb")), 0);
});

Deno.test("tool grammar: rule names are prefixed, literals and classes kept; control bytes split", () => {
  const ebnf = 'root ::= "root" item [root] (=("x"))\nitem ::= "\\"item\\"" [\\]a-z]*\n';
  assert.equal(
    prefixRules(ebnf, "t0_"),
    't0_root ::= "root" t0_item [root] (=("x"))\nt0_item ::= "\\"item\\"" [\\]a-z]*\n',
  );
  // xgrammar reads every hex digit after \x, so a control byte is a literal of its own.
  assert.equal(literal("\x01call"), '( "\\x01" "call" )');
  assert.equal(literal('say "hi"'), '"say \\"hi\\""');
});
