/**
 * POST /v1/responses through the official `openai` client: plain and streamed answers (the
 * documented event sequence, adding up to the whole response), greedy tokens equal to
 * `k3 run` on the same rendered prompt, a tool round trip with reasoning carried back in
 * encrypted_content, a forced tool choice, and the stateless refusals.
 */
import assert from "node:assert/strict";
import type OpenAI from "openai";
import { type ChatMessage, CLOSE, OPEN, renderChatIds, SEP } from "../../lib/text/chat.ts";
import { parseOutput } from "../../lib/text/parse.ts";
import {
  k3Of,
  postJson,
  runIds,
  untilStop,
  withServer,
  xtmlIds,
} from "../support/serve_helpers.ts";

type Output = OpenAI.Responses.ResponseOutputItem;

function texts(output: Output[]) {
  const reasoning = output.flatMap((o) =>
    o.type === "reasoning" ? (o.content ?? []).map((c) => c.text) : []
  ).join("");
  const content = output.flatMap((o) =>
    o.type === "message" ? o.content.map((c) => c.type === "output_text" ? c.text : "") : []
  ).join("");
  return { reasoning, content };
}

Deno.test("responses: greedy output equals `k3 run` on the same rendered prompt; same prompt as chat", async () => {
  await withServer({}, async (s) => {
    const gen = 12;
    const r = await s.openai.responses.create({
      model: "tiny",
      instructions: "You are terse.",
      input: "What is the capital of France?",
      max_output_tokens: gen,
      reasoning: { effort: "high" },
    });
    const k3 = k3Of(r);
    const messages: ChatMessage[] = [
      { role: "system", content: "You are terse." },
      { role: "user", content: "What is the capital of France?" },
    ];
    const rendered = renderChatIds(s.tokenizer, messages, { thinkingEffort: "high" }).ids;
    assert.deepEqual(k3.prompt_ids, rendered);
    const run = await runIds(s.dir, rendered, gen);
    assert.deepEqual(k3.completion_ids, untilStop(run.ids, s.stopIds), "token for token");
    const expected = parseOutput(
      s.tokenizer.decode(k3.completion_ids.filter((id) => !s.stopIds.includes(id))),
    );
    assert.deepEqual(texts(r.output), { reasoning: expected.reasoning, content: expected.content });
    assert.equal(r.output_text, expected.content);
    assert.equal(r.object, "response");
    assert.equal(r.status, k3.completion_ids.length === gen ? "incomplete" : "completed");
    assert.equal(r.usage!.output_tokens, k3.completion_ids.length);
    assert.equal(r.usage!.input_tokens, rendered.length);
    assert.equal((r as unknown as { store: boolean }).store, false);

    // The same conversation through Chat Completions: the same prompt, the same tokens.
    const chat = await s.openai.chat.completions.create({
      model: "tiny",
      messages: messages as OpenAI.ChatCompletionMessageParam[],
      max_tokens: gen,
      reasoning_effort: "high",
    });
    assert.deepEqual(k3Of(chat).prompt_ids, k3.prompt_ids);
    assert.deepEqual(k3Of(chat).completion_ids, k3.completion_ids);
  });
});

Deno.test("responses: the stream is the documented event sequence and adds up to the response", async () => {
  await withServer({}, async (s) => {
    for (const summary of [undefined, "auto" as const]) {
      const request = {
        model: "tiny",
        input: "Hello there",
        max_output_tokens: 10,
        reasoning: { effort: "low" as const, summary },
        include: ["reasoning.encrypted_content" as const],
      };
      const whole = await s.openai.responses.create(request);
      const events: OpenAI.Responses.ResponseStreamEvent[] = [];
      const stream = await s.openai.responses.create({ ...request, stream: true });
      for await (const e of stream) events.push(e);
      assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i));
      assert.deepEqual(events.slice(0, 2).map((e) => e.type), [
        "response.created",
        "response.in_progress",
      ]);
      const last = events.at(-1)!;
      assert.ok(last.type === "response.completed" || last.type === "response.incomplete");
      const final = (last as OpenAI.Responses.ResponseCompletedEvent).response;
      assert.deepEqual(final.output.map((o) => o.type), whole.output.map((o) => o.type));
      assert.deepEqual(texts(final.output), texts(whole.output));
      assert.deepEqual(k3Of(final).completion_ids, k3Of(whole).completion_ids);
      // Deltas add up to each item's text; every item is added before its deltas and done after.
      let reasoning = "", content = "", summaryText = "";
      const open = new Set<number>();
      for (const e of events) {
        if (e.type === "response.output_item.added") open.add(e.output_index);
        if (e.type === "response.output_item.done") {
          assert.ok(open.delete(e.output_index));
          assert.deepEqual(e.item, final.output[e.output_index]);
        }
        if (e.type === "response.reasoning_text.delta") {
          assert.ok(open.has(e.output_index));
          reasoning += e.delta;
        }
        if (e.type === "response.reasoning_summary_text.delta") summaryText += e.delta;
        if (e.type === "response.output_text.delta") {
          assert.ok(open.has(e.output_index));
          content += e.delta;
        }
      }
      assert.equal(open.size, 0);
      assert.deepEqual({ reasoning, content }, texts(final.output));
      assert.equal(summaryText, summary ? reasoning : "");
      const types = new Set(events.map((e) => e.type));
      for (
        const t of [
          "response.output_item.added",
          "response.content_part.added",
          "response.content_part.done",
        ]
      ) assert.ok(types.has(t as never), t);
      if (reasoning) {
        assert.ok(types.has("response.reasoning_text.done"));
        const item = final.output[0] as OpenAI.Responses.ResponseReasoningItem;
        assert.ok(item.encrypted_content?.startsWith("k3r1."));
      }
    }
  });
});

Deno.test("responses: a tool round trip, reasoning carried back in encrypted_content", async () => {
  const call = await xtmlIds(
    `I need the weather.${CLOSE}think${SEP}${OPEN}response${SEP}${CLOSE}response${SEP}` +
      `${OPEN}tools${SEP}${OPEN}call tool="get_weather" index="1"${SEP}` +
      `${OPEN}argument key="city" type="string"${SEP}Paris${CLOSE}argument${SEP}${CLOSE}call${SEP}` +
      `${CLOSE}tools${SEP}${CLOSE}message${SEP}<|end_of_msg|>`,
  );
  const answer = await xtmlIds(`Got it.${CLOSE}think${SEP}${OPEN}response${SEP}Sunny.`);
  await withServer({ script: [call, answer] }, async (s) => {
    const tools: OpenAI.Responses.FunctionTool[] = [{
      type: "function",
      name: "get_weather",
      description: "Weather for a city",
      parameters: { type: "object", properties: { city: { type: "string" } } },
      strict: false,
    }];
    const first = await s.openai.responses.create({
      model: "tiny",
      input: [{ role: "user", content: "Weather in Paris?" }],
      tools,
      include: ["reasoning.encrypted_content"],
      store: false,
    });
    assert.deepEqual(first.output.map((o) => o.type), ["reasoning", "function_call"]);
    const fc = first.output[1] as OpenAI.Responses.ResponseFunctionToolCall;
    assert.equal(fc.name, "get_weather");
    assert.deepEqual(JSON.parse(fc.arguments), { city: "Paris" });
    assert.match(fc.call_id, /^call_/);
    // Send the output back (reasoning only as encrypted_content), plus the tool's result.
    const reasoning = first.output[0] as OpenAI.Responses.ResponseReasoningItem;
    const input: OpenAI.Responses.ResponseInputItem[] = [
      { role: "user", content: "Weather in Paris?" },
      { ...reasoning, content: undefined },
      fc,
      { type: "function_call_output", call_id: fc.call_id, output: '{"sky":"clear"}' },
    ];
    const second = await s.openai.responses.create({ model: "tiny", input, tools });
    assert.equal(second.output_text, "Sunny.");
    const turn: ChatMessage[] = [
      { role: "user", content: "Weather in Paris?" },
      {
        role: "assistant",
        content: "",
        reasoning_content: "I need the weather.",
        tool_calls: [{
          id: fc.call_id,
          type: "function",
          function: { name: "get_weather", arguments: fc.arguments },
        }],
      },
      { role: "tool", tool_call_id: fc.call_id, content: '{"sky":"clear"}' },
    ];
    const chatTools = [{
      type: "function",
      function: {
        name: "get_weather",
        description: tools[0].description,
        parameters: tools[0].parameters,
      },
    }];
    assert.deepEqual(
      k3Of(second).prompt_ids,
      renderChatIds(s.tokenizer, turn, { tools: chatTools }).ids,
    );
  });
});

Deno.test("responses: a forced tool choice; stateless refusals; effort none turns thinking off", async () => {
  await withServer({}, async (s) => {
    const tools: OpenAI.Responses.FunctionTool[] = [
      {
        type: "function",
        name: "lookup",
        parameters: { type: "object", properties: {} },
        strict: false,
      },
    ];
    const forced = await s.openai.responses.create({
      model: "tiny",
      input: "Look it up.",
      tools,
      tool_choice: { type: "function", name: "lookup" },
      max_output_tokens: 6,
    });
    const calls = forced.output.filter((o) => o.type === "function_call");
    assert.equal(calls.length, 1);
    assert.equal((calls[0] as OpenAI.Responses.ResponseFunctionToolCall).name, "lookup");
    const prefill = s.tokenizer.decode(k3Of(forced).prefill_ids!);
    assert.ok(prefill.endsWith(`${OPEN}call tool="lookup" index="1"${SEP}`));
    const run = await runIds(s.dir, k3Of(forced).prompt_ids, 6);
    const n = k3Of(forced).completion_ids.length;
    assert.deepEqual(k3Of(forced).completion_ids, run.ids.slice(0, n));

    const off = await s.openai.responses.create({
      model: "tiny",
      input: "Hi",
      max_output_tokens: 2,
      reasoning: { effort: "none" },
    });
    assert.ok(s.tokenizer.decode(k3Of(off).prompt_ids).endsWith(`${OPEN}response${SEP}`));
    assert.ok(!off.output.some((o) => o.type === "reasoning"));
    const minimal = await s.openai.responses.create({
      model: "tiny",
      input: "Hi",
      max_output_tokens: 1,
      reasoning: { effort: "minimal" },
    });
    assert.match(s.tokenizer.decode(k3Of(minimal).prompt_ids), /thinking_effort=low`/);

    for (
      const [extra, param] of [
        [{ previous_response_id: "resp_1" }, "previous_response_id"],
        [{ store: true }, "store"],
        [{ background: true }, "background"],
        [{ conversation: "c" }, "conversation"],
        [{ include: ["file_search_call.results"] }, "include"],
        [{ tools: [{ type: "web_search" }] }, "tools[0].type"],
        [{ truncation: "auto" }, "truncation"],
        [{ text: { verbosity: "high" } }, "text.verbosity"],
        [{ input: [{ type: "item_reference", id: "x" }] }, "input[0].type"],
        [
          { tools: [{ type: "function", name: "f", strict: true, parameters: { not: {} } }] },
          "tools[0].parameters",
        ],
        [{ tools: [{ type: "function", name: "f", strict: 1 }] }, "tools[0].strict"],
        [
          {
            text: {
              format: {
                type: "json_schema",
                name: "x",
                schema: { uniqueItems: true },
                strict: true,
              },
            },
          },
          "text.format.schema",
        ],
        [
          { input: [{ role: "user", content: [{ type: "input_image", image_url: "x" }] }] },
          "input[0].content[0]",
        ],
      ] as const
    ) {
      const r = await postJson(`${s.url}/v1/responses`, { model: "tiny", input: "hi", ...extra });
      assert.equal(r.status, 400, JSON.stringify(extra));
      assert.equal(r.body.error.param, param, JSON.stringify(r.body));
    }
    const ok = await s.openai.responses.create({
      model: "tiny",
      input: "still here?",
      max_output_tokens: 1,
    });
    assert.equal(ok.object, "response");
  });
});
