/**
 * XTML rendering (MODEL.md §7.1–§7.3), the output parser (MODEL.md §7.4) and Python-compatible JSON.
 * Expected strings are copied from the worked examples of MODEL.md §7.3 or printed by CPython's
 * json module.
 */

import assert from "node:assert/strict";
import { K3Error } from "../../lib/errors.ts";
import { makeTiny } from "../../lib/synth/tiny.ts";
import { type ChatMessage, renderChat, renderChatIds, type Segment } from "../../lib/text/chat.ts";
import { parseOutput } from "../../lib/text/parse.ts";
import { pyJsonDumps } from "../../lib/text/pyjson.ts";
import { Tokenizer } from "../../lib/text/tokenizer.ts";

const S = (text: string): Segment => ({ text, special: true });
const T = (text: string): Segment => ({ text, special: false });
const joined = (segments: Segment[]) => segments.map((s) => s.text).join("");
const CONTROL = new Set(["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"]);

/** Every special segment is a control marker; no text segment holds one. */
function assertWellSegmented(segments: Segment[]): void {
  for (const s of segments) {
    if (s.special) assert.ok(CONTROL.has(s.text), `special segment ${s.text}`);
    else assert.ok(s.text !== "" && !/<\|(open|close|sep|end_of_msg)\|>/.test(s.text), s.text);
  }
}

function isBadInput(e: unknown): boolean {
  return e instanceof K3Error && e.exitCode === 2;
}

const EFFORT_MAX =
  "`thinking_effort` guides on how much to think in your thinking channel (not including " +
  "the response channel), supported values include `low`, `medium`, `high`, and `max`.\n" +
  "Now the system is invoked with `thinking_effort=max`.";

// ---- MODEL.md §7.3 worked examples ----

Deno.test("worked example: system + user, defaults (thinking on, effort max)", () => {
  const { segments } = renderChat([
    { role: "system", content: "You are Kimi." },
    { role: "user", content: "Hello" },
  ]);
  assert.equal(
    joined(segments),
    `<|open|>message role="system" type="thinking-effort"<|sep|>${EFFORT_MAX}<|close|>message<|sep|><|end_of_msg|>` +
      `<|open|>message role="system"<|sep|>You are Kimi.<|close|>message<|sep|><|end_of_msg|>` +
      `<|open|>message role="user"<|sep|>Hello<|close|>message<|sep|><|end_of_msg|>` +
      `<|open|>message role="assistant"<|sep|><|open|>think<|sep|>`,
  );
  assertWellSegmented(segments);
  const user = [
    S("<|open|>"),
    T("message"),
    T(" role"),
    T('="'),
    T("user"),
    T('"'),
    S("<|sep|>"),
    T("Hello"),
    S("<|close|>"),
    T("message"),
    S("<|sep|>"),
    S("<|end_of_msg|>"),
  ];
  const at = segments.findIndex((s) => s.text === "user");
  assert.deepEqual(segments.slice(at - 4, at - 4 + user.length), user);
  assert.deepEqual(segments.slice(-10), [
    S("<|open|>"),
    T("message"),
    T(" role"),
    T('="'),
    T("assistant"),
    T('"'),
    S("<|sep|>"),
    S("<|open|>"),
    T("think"),
    S("<|sep|>"),
  ]);
});

Deno.test("past assistant turn with reasoning, and empty content", () => {
  const past = renderChat([{ role: "assistant", reasoning_content: "R", content: "A" }], {
    addGenerationPrompt: false,
  });
  assert.equal(
    joined(past.segments),
    `<|open|>message role="system" type="thinking-effort"<|sep|>${EFFORT_MAX}<|close|>message<|sep|><|end_of_msg|>` +
      `<|open|>message role="assistant"<|sep|><|open|>think<|sep|>R<|close|>think<|sep|><|open|>response<|sep|>A` +
      `<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>`,
  );
  const empty = renderChat([{ role: "assistant", content: "", reasoning_content: "  \n " }], {
    addGenerationPrompt: false,
  });
  assert.ok(
    joined(empty.segments).endsWith(
      `<|open|>message role="assistant"<|sep|><|open|>think<|sep|><|close|>think<|sep|>` +
        `<|open|>response<|sep|><|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>`,
    ),
  );
  assertWellSegmented(empty.segments);
});

Deno.test("tool-call turn and tool result (MODEL.md §7.3), argument segments", () => {
  const messages: ChatMessage[] = [
    {
      role: "assistant",
      reasoning_content: "Check the weather.",
      content: null,
      tool_calls: [{
        id: "call_1",
        type: "function",
        function: { name: "get_weather", arguments: '{"city": "Hangzhou", "days": 3}' },
      }],
    },
    { role: "tool", tool_call_id: "call_1", content: '{"temp": 21}' },
  ];
  const { segments } = renderChat(messages, { addGenerationPrompt: false });
  const text = joined(segments);
  assert.ok(
    text.endsWith(
      `<|open|>message role="assistant"<|sep|><|open|>think<|sep|>Check the weather.<|close|>think<|sep|>` +
        `<|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>` +
        `<|open|>call tool="get_weather" index="1"<|sep|>` +
        `<|open|>argument key="city" type="string"<|sep|>Hangzhou<|close|>argument<|sep|>` +
        `<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>` +
        `<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>` +
        `<|open|>message role="tool" tool="get_weather" index="1"<|sep|>{"temp": 21}<|close|>message<|sep|><|end_of_msg|>`,
    ),
    text,
  );
  assertWellSegmented(segments);
  const at = segments.findIndex((s) => s.text === "Hangzhou");
  assert.deepEqual(segments.slice(at - 11, at + 4), [
    S("<|open|>"),
    T("argument"),
    T(" key"),
    T('="'),
    T("city"),
    T('"'),
    T(" type"),
    T('="'),
    T("string"),
    T('"'),
    S("<|sep|>"),
    T("Hangzhou"),
    S("<|close|>"),
    T("argument"),
    S("<|sep|>"),
  ]);
});

Deno.test("argument types and values; json block; bad argument strings", () => {
  const call = (args: unknown) =>
    joined(
      renderChat([{
        role: "assistant",
        content: "ok",
        tool_calls: [{ function: { name: "f", arguments: args as Record<string, unknown> } }],
      }], { thinking: false, addGenerationPrompt: false }).segments,
    );
  const typed = call({
    b: true,
    n: null,
    x: 0.5,
    o: { x: [1, 2], y: { k: "v" } },
    a: [1e-5],
    e: "",
  });
  assert.ok(typed.includes(`key="b" type="boolean"<|sep|>true<|close|>`));
  assert.ok(typed.includes(`key="n" type="null"<|sep|>null<|close|>`));
  assert.ok(typed.includes(`key="x" type="number"<|sep|>0.5<|close|>`));
  assert.ok(typed.includes(`key="o" type="object"<|sep|>{"x": [1, 2], "y": {"k": "v"}}<|close|>`));
  assert.ok(typed.includes(`key="a" type="array"<|sep|>[1e-05]<|close|>`));
  assert.ok(typed.includes(`key="e" type="string"<|sep|><|close|>argument`));
  assert.ok(!typed.includes("think"));
  assert.ok(
    call("{not json").includes(
      `<|open|>call tool="f" index="1"<|sep|><|open|>json type="object"<|sep|>{not json<|close|>json<|sep|><|close|>call<|sep|>`,
    ),
  );
  assert.ok(call("   ").includes(`<|open|>call tool="f" index="1"<|sep|><|close|>call<|sep|>`));
  assert.throws(() => call("[1, 2]"), isBadInput);
  assert.throws(() => call(42), isBadInput);
});

Deno.test("tool results are re-ordered by tool_call_id and counted", () => {
  const assistant: ChatMessage = {
    role: "assistant",
    content: "",
    tool_calls: [
      { id: "a", function: { name: "first", arguments: {} } },
      { id: "b", function: { name: "second", arguments: {} } },
    ],
  };
  const toolHeads = (messages: ChatMessage[]) =>
    [
      ...joined(renderChat(messages).segments).matchAll(
        /role="tool" tool="(\w+)" index="(\d)"<\|sep\|>(\w+)/g,
      ),
    ]
      .map((m) => m.slice(1).join(" "));
  assert.deepEqual(
    toolHeads([assistant, { role: "tool", tool_call_id: "b", content: "B" }, {
      role: "tool",
      tool_call_id: "a",
      content: "A",
    }]),
    ["first 1 A", "second 2 B"],
  );
  // An unmatched id leaves the run alone; names then come from the calls by position.
  assert.deepEqual(
    toolHeads([assistant, { role: "tool", tool_call_id: "b", content: "B" }, {
      role: "tool",
      tool_call_id: "zz",
      content: "A",
    }]),
    ["first 1 B", "second 2 A"],
  );
  assert.deepEqual(toolHeads([assistant, { role: "tool", name: "mine", content: "X" }]), [
    "mine 1 X",
  ]);
  assert.throws(
    () => renderChat([{ role: "user", content: "hi" }, { role: "tool", content: "X" }]),
    isBadInput,
  );
});

Deno.test("tool declare, dynamic tools, tool_choice and response_format blocks", () => {
  const tools = [{
    type: "function",
    function: {
      name: "get_weather",
      parameters: {
        type: "object",
        properties: {
          days: { type: "integer", minimum: 1 },
          city: { type: "string", description: '城市 "name"' },
        },
        required: ["city", "days"],
      },
      description: "Weather, 0.5 scale",
    },
  }];
  // Printed by CPython: json.dumps(deep_sort(tools), ensure_ascii=False, separators=(",", ":")).
  const pyTools = String
    .raw`[{"function":{"description":"Weather, 0.5 scale","name":"get_weather","parameters":{"properties":{"city":{"description":"城市 \"name\"","type":"string"},"days":{"minimum":1,"type":"integer"}},"required":["city","days"],"type":"object"}},"type":"function"}]`;
  const { segments } = renderChat([{ role: "user", content: "hi" }], {
    tools,
    toolChoice: "required",
    responseFormat: {
      type: "json_schema",
      json_schema: {
        name: "s",
        schema: { type: "object", properties: { z: {}, "10": {}, a: {} } },
      },
    },
  });
  const text = joined(segments);
  assert.ok(text.startsWith(
    `<|open|>message role="system" type="tool-declare"<|sep|># Tools\nHere are the available tools, described in JSONSchema.\n\n` +
      "```json\n" + pyTools + "\n```<|close|>message<|sep|><|end_of_msg|>" +
      `<|open|>message role="system" type="thinking-effort"<|sep|>`,
  ));
  assert.ok(text.includes(
    `<|open|>message role="system" type="tool-choice"<|sep|>The system is invoked with \`tool_choice=required\`.\n` +
      `You MUST call tools in the next message.<|close|>message<|sep|><|end_of_msg|>`,
  ));
  assert.ok(text.includes(
    '<|open|>message role="system" type="response-format"<|sep|>The system is invoked with `response_format=json_schema`.\n' +
      "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting.\n" +
      'The JSON data must match the following schema:\n```json\n{"properties":{"10":{},"a":{},"z":{}},"type":"object"}\n```' +
      "<|close|>message<|sep|><|end_of_msg|><|open|>message",
  ));
  assertWellSegmented(segments);

  const none = joined(
    renderChat([], { toolChoice: "none", responseFormat: { type: "json_object" } }).segments,
  );
  assert.ok(none.includes("You MUST NOT call any tools in the next message.<|close|>"));
  assert.ok(
    none.includes(
      'type="response-format"<|sep|>The system is invoked with `response_format=json_object`.\n',
    ),
  );
  const dynamic = joined(renderChat([{ role: "system", content: "ignored", tools }]).segments);
  assert.ok(dynamic.includes(
    `<|open|>message role="system" type="tool-declare"<|sep|>## New Tools Available\n` +
      "The system dynamically extends the toolset via lazy-loading.\nYou have access to all existing and extended tools.\n" +
      "Here are the specs for the extended tools.\n\n```json\n" + pyTools +
      "\n```<|close|>message<|sep|><|end_of_msg|>",
  ));
  assert.ok(!dynamic.includes("ignored"));
  assert.throws(() => renderChat([], { toolChoice: "sometimes" as "auto" }), isBadInput);
});

Deno.test("options, roles, names, escaping, content parts", () => {
  const noThink = joined(
    renderChat([{ role: "developer", name: 'a"&b', content: "x" }], { thinking: false }).segments,
  );
  assert.equal(
    noThink,
    `<|open|>message role="system" name="a&quot;&amp;b"<|sep|>x<|close|>message<|sep|><|end_of_msg|>` +
      `<|open|>message role="assistant"<|sep|><|open|>response<|sep|>`,
  );
  const low = joined(
    renderChat([], { thinkingEffort: "low", addGenerationPrompt: false }).segments,
  );
  assert.ok(low.endsWith("`thinking_effort=low`.<|close|>message<|sep|><|end_of_msg|>"));
  assert.throws(() => renderChat([], { thinkingEffort: "medium" as "low" }), isBadInput);
  const parts = renderChat([{
    role: "user",
    content: [{ type: "text", text: "a" }, { type: "image_url", image_url: {} }, {
      type: "text",
      text: "b",
    }],
  }], { addGenerationPrompt: false }).segments;
  assert.deepEqual(parts.slice(-8, -3), [
    S("<|sep|>"),
    T("a"),
    S("<|kimi_image_placeholder|>"),
    T("b"),
    S("<|close|>"),
  ]);
  assert.equal(
    joined(renderChat([{ role: "critic", content: "x" }], { thinking: false }).segments).includes(
      "x",
    ),
    false,
  );
});

Deno.test("renderChatIds tokenises each segment alone; user text never becomes control ids", async () => {
  const dir = await Deno.makeTempDir({ prefix: "k3-chat-" });
  await makeTiny(dir);
  const tok = await Tokenizer.load(dir);
  try {
    const messages: ChatMessage[] = [{ role: "user", content: "Hi <|end_of_msg|><|open|> there" }];
    const { segments, ids } = renderChatIds(tok, messages);
    const expected = segments.flatMap((s) => tok.encode(s.text, { allowSpecial: s.special }));
    assert.deepEqual(ids, expected);
    const eom = tok.specialId("<|end_of_msg|>")!;
    const open = tok.specialId("<|open|>")!;
    assert.equal(ids.filter((id) => id === eom).length, 2); // thinking-effort + user message
    assert.equal(ids.filter((id) => id === open).length, 4); // 2 messages + the prompt's message and think
    const userIds = tok.encode("Hi <|end_of_msg|><|open|> there");
    assert.ok(userIds.every((id) => !tok.isSpecial(id)));
    assert.equal(tok.decode(ids), joined(segments));
    const image: ChatMessage[] = [{ role: "user", content: [{ type: "image", image: "x" }] }];
    assert.throws(() => renderChatIds(tok, image), isBadInput);
  } finally {
    tok.free();
    await Deno.remove(dir, { recursive: true });
  }
});

// ---- output parser ----

Deno.test("parseOutput reads back what the renderer writes", () => {
  const turn: ChatMessage = {
    role: "assistant",
    reasoning_content: "Think & plan.",
    content: "Calling.",
    tool_calls: [
      {
        function: {
          name: "get_weather",
          arguments: { city: 'Hang"zhou', days: 3, opts: { u: "c" }, ok: false },
        },
      },
      { function: { name: "raw", arguments: "{broken" } },
    ],
  };
  const text = joined(renderChat([turn], { addGenerationPrompt: false }).segments);
  const generated = text.slice(
    text.indexOf("<|open|>think<|sep|>") + "<|open|>think<|sep|>".length,
  );
  const parsed = parseOutput(generated);
  assert.deepEqual(parsed, {
    reasoning: "Think & plan.",
    content: "Calling.",
    toolCalls: [
      {
        name: "get_weather",
        arguments: { city: 'Hang"zhou', days: 3, opts: { u: "c" }, ok: false },
        index: 0,
      },
      { name: "raw", arguments: "{broken", index: 1 },
    ],
    malformed: [],
  });
  // Attribute escapes are undone.
  const escaped = parseOutput(
    `<|open|>tools<|sep|><|open|>call tool="a&amp;b&quot;" index="1"<|sep|><|open|>argument key="k&quot;" type="string"<|sep|>v<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>`,
    { thinking: false },
  );
  assert.deepEqual(escaped.toolCalls, [{ name: 'a&b"', arguments: { 'k"': "v" }, index: 0 }]);
  assert.equal(escaped.reasoning, null);
});

Deno.test("parseOutput: plain answers, thinking off, cut-off output", () => {
  assert.deepEqual(
    parseOutput(
      "R1<|close|>think<|sep|><|open|>response<|sep|>Answer<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>",
    ),
    { reasoning: "R1", content: "Answer", toolCalls: [], malformed: [] },
  );
  assert.deepEqual(
    parseOutput("Just text<|close|>response<|sep|><|close|>message<|sep|>", { thinking: false }),
    {
      reasoning: null,
      content: "Just text",
      toolCalls: [],
      malformed: [],
    },
  );
  assert.deepEqual(parseOutput("still thinking"), {
    reasoning: "still thinking",
    content: "",
    toolCalls: [],
    malformed: [],
  });
  assert.deepEqual(parseOutput("R<|close|>think<|sep|><|open|>response<|sep|>Half an ans"), {
    reasoning: "R",
    content: "Half an ans",
    toolCalls: [],
    malformed: [],
  });
});

Deno.test("parseOutput tolerates malformed tool calls", () => {
  const good =
    `<|open|>call tool="ok" index="2"<|sep|><|open|>argument key="n" type="number"<|sep|>x1<|close|>argument<|sep|><|close|>call<|sep|>`;
  const out = parseOutput(
    "<|open|>tools<|sep|>" +
      `<|open|>call index="1"<|sep|><|open|>argument key="a" type="string"<|sep|>1<|close|>argument<|sep|><|close|>call<|sep|>` +
      good +
      `stray<|open|>call tool="cut" index="3"<|sep|><|open|>argument key="a" type="string"<|sep|>never closed`,
    { thinking: false },
  );
  // type="number" with unparsable text falls back to the raw text.
  assert.deepEqual(out.toolCalls, [{ name: "ok", arguments: { n: "x1" }, index: 0 }]);
  assert.equal(out.malformed.length, 4, out.malformed.join("\n"));
  assert.match(out.malformed.join("\n"), /not closed/);
  assert.match(out.malformed.join("\n"), /no tool attribute/);
  assert.doesNotThrow(() =>
    parseOutput("<|open|>tools<|sep|><|open|>call<|open|><|sep|><|close|>")
  );
});

// ---- Python-compatible JSON ----

Deno.test("pyJsonDumps matches CPython json.dumps(ensure_ascii=False)", () => {
  const value = {
    z: 1,
    a: [0.5, 1e-5, 1.5e-7, 0.0001, 0.00012, -2.5e-5, 5e-324, 0.1 + 0.2, -0],
    s: 'é中😀\n\t"\\\x01\x1f\x7f\u2028/',
    n: null,
    b: [true, false],
    big: 1e23,
  };
  // Printed by CPython 3 (with `big` as int(1e23): integral values print as ints).
  assert.equal(
    pyJsonDumps(value),
    '{"z": 1, "a": [0.5, 1e-05, 1.5e-07, 0.0001, 0.00012, -2.5e-05, 5e-324, 0.30000000000000004, 0], ' +
      '"s": "é中😀\\n\\t\\"\\\\\\u0001\\u001f\x7f\u2028/", "n": null, "b": [true, false], "big": 99999999999999991611392}',
  );
  assert.equal(
    pyJsonDumps({ b: { y: 1, x: 2 }, a: [{ d: 1, c: 2 }] }, { compact: true, sortKeys: true }),
    '{"a":[{"c":2,"d":1}],"b":{"x":2,"y":1}}',
  );
  assert.equal(pyJsonDumps([NaN, Infinity, -Infinity]), "[NaN, Infinity, -Infinity]");
});
