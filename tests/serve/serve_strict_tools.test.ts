/**
 * Strict tools through `k3 serve` on the tiny model (random weights: only the grammar can make
 * its calls valid): Chat Completions, Responses and Anthropic Messages, sampled at temperature
 * 1 over several seeds, each call's arguments parsed and validated against its tool's schema by
 * an independent validator (ajv); `required` / `any` / a named tool yield a call; thinking is
 * free before the grammar; a tool schema the engine cannot enforce is a 400 naming it.
 */
import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { xgrammarRequested } from "../../lib/text/grammar.ts";
import { postJson, withServer } from "../support/serve_helpers.ts";

const SEEDS = [0, 1, 2, 3, 4];

const WEATHER = {
  type: "object",
  properties: {
    city: { type: "string", maxLength: 6 },
    days: { type: "integer", minimum: 1, maximum: 7 },
    unit: { enum: ["c", "f"] },
  },
  required: ["city", "days", "unit"],
  additionalProperties: false,
};
const MOVE = {
  type: "object",
  properties: {
    to: {
      type: "object",
      properties: {
        x: { type: "integer", minimum: -5, maximum: 5 },
        y: { type: "integer", minimum: 0, maximum: 99 },
      },
      required: ["x", "y"],
      additionalProperties: false,
    },
    path: { type: "array", items: { type: "boolean" }, maxItems: 2 },
    note: { anyOf: [{ type: "null" }, { type: "string", pattern: "^[a-z]{1,3}$" }] },
  },
  required: ["to", "path", "note"],
  additionalProperties: false,
};
const SCHEMAS: Record<string, object> = { weather: WEATHER, move: MOVE };

const ajv = new Ajv({ strict: false });
const validators = Object.fromEntries(
  Object.entries(SCHEMAS).map(([name, schema]) => [name, ajv.compile(schema)]),
);

/** Asserts that `args` (a JSON string or a parsed object) is valid for tool `name`. */
function assertValid(name: string, args: unknown, context: string): void {
  assert.ok(name in validators, `${context}: unknown tool ${name}`);
  const value = typeof args === "string" ? JSON.parse(args) : args;
  assert.ok(
    validators[name](value),
    `${context}: ${JSON.stringify(value)} ${ajv.errorsText(validators[name].errors)}`,
  );
}

const CHAT_TOOLS = Object.entries(SCHEMAS).map(([name, parameters]) => ({
  type: "function",
  function: { name, description: `the ${name} tool`, parameters, strict: true },
}));
const USER = [{ role: "user", content: "Use a tool." }];

Deno.test("strict tools: chat completions with tool_choice required, named, and auto calls validate", async () => {
  await withServer({}, async (s) => {
    const url = `${s.url}/v1/chat/completions`;
    // Tools that are not strict, under auto, decode as before: no grammar is loaded for them.
    const before = xgrammarRequested();
    const loose = CHAT_TOOLS.map((t) => ({ ...t, function: { ...t.function, strict: false } }));
    const plain = await postJson(url, {
      model: "tiny",
      messages: USER,
      tools: loose,
      max_tokens: 2,
    });
    assert.equal(plain.status, 200, JSON.stringify(plain.body));
    assert.equal(xgrammarRequested(), before);

    const base = { model: "tiny", messages: USER, tools: CHAT_TOOLS, reasoning_effort: "none" };
    let validated = 0;
    for (const seed of SEEDS) {
      const r = await postJson(url, {
        ...base,
        tool_choice: "required",
        parallel_tool_calls: false,
        temperature: 1,
        seed,
        max_tokens: 120,
      });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const choice = r.body.choices[0];
      assert.equal(choice.finish_reason, "tool_calls", JSON.stringify(choice));
      assert.equal(choice.message.tool_calls.length, 1);
      assert.equal(r.body.k3.malformed_tool_calls, undefined, JSON.stringify(r.body.k3));
      const call = choice.message.tool_calls[0].function;
      assertValid(call.name, call.arguments, `required seed ${seed}`);
      validated++;

      const named = await postJson(url, {
        ...base,
        tool_choice: { type: "function", function: { name: "move" } },
        temperature: 1,
        seed,
        max_tokens: 120,
      });
      assert.equal(named.status, 200, JSON.stringify(named.body));
      const forced = named.body.choices[0].message.tool_calls;
      assert.equal(forced.length, 1, JSON.stringify(named.body.choices[0]));
      assert.equal(forced[0].function.name, "move");
      assertValid("move", forced[0].function.arguments, `named seed ${seed}`);
      validated++;
    }
    // Thinking on: a named strict tool is pre-filled past the think channel, then held.
    const thinking = await postJson(url, {
      model: "tiny",
      messages: USER,
      tools: CHAT_TOOLS,
      tool_choice: { type: "function", function: { name: "weather" } },
      temperature: 1,
      seed: 9,
      max_tokens: 120,
    });
    assert.equal(thinking.status, 200, JSON.stringify(thinking.body));
    const thought = thinking.body.choices[0].message.tool_calls[0].function;
    assertValid(thought.name, thought.arguments, "named with thinking on");
    // A call the budget cuts off is reported as cut (finish_reason length), not as a call.
    const cut = await postJson(url, {
      ...base,
      tool_choice: "required",
      parallel_tool_calls: false,
      max_tokens: 40,
    });
    assert.equal(cut.status, 200, JSON.stringify(cut.body));
    assert.equal(cut.body.choices[0].finish_reason, "length", JSON.stringify(cut.body.choices[0]));
    // auto: a bias on <|close|> ends the free answer at once; the model then calls or not.
    const close = s.tokenizer.specialId("<|close|>")!;
    let calls = 0;
    for (const seed of SEEDS) {
      const r = await postJson(url, {
        ...base,
        temperature: 1,
        seed,
        max_tokens: 200,
        logit_bias: { [close]: 100 },
      });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const choice = r.body.choices[0];
      for (const c of choice.message.tool_calls ?? []) {
        assertValid(c.function.name, c.function.arguments, `auto seed ${seed}`);
        calls++;
      }
      assert.deepEqual(r.body.k3.malformed_tool_calls ?? [], [], JSON.stringify(r.body.k3));
    }
    assert.ok(calls > 0, "some auto answer called a tool");
    assert.equal(validated, 2 * SEEDS.length);
  });
});

Deno.test("strict tools: tool_choice required forces a call of a tool that is not strict", async () => {
  await withServer({}, async (s) => {
    const tools = [{ type: "function", function: { name: "weather", parameters: WEATHER } }];
    for (const seed of SEEDS.slice(0, 3)) {
      const r = await postJson(`${s.url}/v1/chat/completions`, {
        model: "tiny",
        messages: USER,
        tools,
        tool_choice: "required",
        parallel_tool_calls: false,
        reasoning_effort: "none",
        temperature: 1,
        seed,
        max_tokens: 120,
      });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const call = r.body.choices[0].message.tool_calls?.[0]?.function;
      assert.equal(call?.name, "weather", JSON.stringify(r.body.choices[0]));
      const args = JSON.parse(call.arguments);
      assert.ok(args !== null && typeof args === "object" && !Array.isArray(args));
    }
  });
});

Deno.test("strict tools: Responses function tools with tool_choice required validate", async () => {
  await withServer({}, async (s) => {
    const tools = Object.entries(SCHEMAS).map(([name, parameters]) => ({
      type: "function",
      name,
      parameters,
      strict: true,
    }));
    for (const seed of SEEDS) {
      const r = await postJson(`${s.url}/v1/responses`, {
        model: "tiny",
        input: "Use a tool.",
        tools,
        tool_choice: "required",
        parallel_tool_calls: false,
        reasoning: { effort: "none" },
        temperature: 1,
        seed,
        max_output_tokens: 120,
      });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      const calls = r.body.output.filter((o: { type: string }) => o.type === "function_call");
      assert.equal(calls.length, 1, JSON.stringify(r.body.output));
      assertValid(calls[0].name, calls[0].arguments, `responses seed ${seed}`);
    }
  });
});

Deno.test("strict tools: Anthropic input_schema with strict, tool_choice any and tool, thinking free", async () => {
  await withServer({}, async (s) => {
    const tools = Object.entries(SCHEMAS).map(([name, input_schema]) => ({
      name,
      input_schema,
      strict: true,
    }));
    const base = {
      model: "tiny",
      messages: USER,
      tools,
      max_tokens: 160,
      temperature: 1,
      thinking: { type: "disabled" },
    };
    for (const seed of SEEDS) {
      for (
        const tool_choice of [
          { type: "any", disable_parallel_tool_use: true },
          { type: "tool", name: "weather" },
        ]
      ) {
        const r = await postJson(`${s.url}/v1/messages`, { ...base, tool_choice, seed });
        assert.equal(r.status, 200, JSON.stringify(r.body));
        const uses = r.body.content.filter((b: { type: string }) => b.type === "tool_use");
        assert.equal(uses.length, 1, JSON.stringify(r.body.content));
        assert.equal(r.body.stop_reason, "tool_use");
        if (tool_choice.type === "tool") assert.equal(uses[0].name, "weather");
        assertValid(uses[0].name, uses[0].input, `anthropic ${tool_choice.type} seed ${seed}`);
      }
    }
    // With thinking on, the think channel is written freely (a budget ends it), then the call.
    const r = await postJson(`${s.url}/v1/messages`, {
      ...base,
      max_tokens: 200,
      seed: 7,
      tool_choice: { type: "any", disable_parallel_tool_use: true },
      thinking: { type: "enabled", budget_tokens: 12 },
    });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    const thinking = r.body.content.find((b: { type: string }) => b.type === "thinking");
    assert.ok(thinking && thinking.thinking.length > 0, JSON.stringify(r.body.content));
    const use = r.body.content.find((b: { type: string }) => b.type === "tool_use");
    assertValid(use.name, use.input, "anthropic thinking");
  });
});

Deno.test("strict tools: a tool schema the engine cannot enforce is a 400 naming it, in each API's shape", async () => {
  await withServer({}, async (s) => {
    const bad = { type: "object", properties: { a: { type: "string", not: { const: "" } } } };
    const chat = await postJson(`${s.url}/v1/chat/completions`, {
      model: "tiny",
      messages: USER,
      tools: [{ type: "function", function: { name: "f", parameters: bad, strict: true } }],
    });
    assert.equal(chat.status, 400);
    assert.equal(chat.body.error.param, "tools[0].function.parameters");
    assert.match(chat.body.error.message, /"not" is not supported/);
    const responses = await postJson(`${s.url}/v1/responses`, {
      model: "tiny",
      input: "hi",
      tools: [{ type: "function", name: "f", parameters: bad, strict: true }],
    });
    assert.equal(responses.status, 400);
    assert.equal(responses.body.error.param, "tools[0].parameters");
    const messages = await postJson(`${s.url}/v1/messages`, {
      model: "tiny",
      max_tokens: 4,
      messages: USER,
      tools: [{ name: "f", input_schema: bad, strict: true }],
    });
    assert.equal(messages.status, 400);
    assert.equal(messages.body.type, "error");
    assert.equal(messages.body.error.type, "invalid_request_error");
    assert.match(messages.body.error.message, /tools\[0\]\.input_schema/);
    // A tool name the markup cannot carry.
    const named = await postJson(`${s.url}/v1/chat/completions`, {
      model: "tiny",
      messages: USER,
      tools: [{
        type: "function",
        function: { name: "a\u0001b", parameters: WEATHER, strict: true },
      }],
    });
    assert.equal(named.status, 400, JSON.stringify(named.body));
    assert.equal(named.body.error.param, "tools");
    const ok = await postJson(`${s.url}/v1/chat/completions`, {
      model: "tiny",
      messages: USER,
      max_tokens: 2,
    });
    assert.equal(ok.status, 200);
  });
});
