/**
 * POST /v1/messages through the official `@anthropic-ai/sdk`: plain and streamed answers (the
 * documented SSE events, adding up to the whole message), greedy tokens equal to `k3 run` on
 * the same rendered prompt, a tool round trip with thinking blocks sent back, a forced tool,
 * the thinking switch and budget, stop sequences, and Anthropic-shaped errors.
 */
import assert from "node:assert/strict";
import type Anthropic from "@anthropic-ai/sdk";
import { type ChatMessage, CLOSE, OPEN, renderChatIds, SEP } from "../../lib/text/chat.ts";
import { parseOutput } from "../../lib/text/parse.ts";
import { endThinking, segmentIds } from "../../lib/text/chat.ts";
import {
  k3Of,
  postJson,
  runIds,
  untilStop,
  withServer,
  xtmlIds,
} from "../support/serve_helpers.ts";

function texts(content: Anthropic.ContentBlock[]) {
  return {
    thinking: content.flatMap((b) => b.type === "thinking" ? [b.thinking] : []).join(""),
    text: content.flatMap((b) => b.type === "text" ? [b.text] : []).join(""),
  };
}

Deno.test("messages: greedy output equals `k3 run` on the same rendered prompt", async () => {
  await withServer({}, async (s) => {
    const gen = 12;
    const m = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: gen,
      system: "You are terse.",
      messages: [{ role: "user", content: "What is the capital of France?" }],
    });
    const k3 = k3Of(m);
    const messages: ChatMessage[] = [
      { role: "system", content: "You are terse." },
      { role: "user", content: [{ type: "text", text: "What is the capital of France?" }] },
    ];
    const rendered = renderChatIds(s.tokenizer, messages).ids;
    assert.deepEqual(k3.prompt_ids, rendered);
    const run = await runIds(s.dir, rendered, gen);
    assert.deepEqual(k3.completion_ids, untilStop(run.ids, s.stopIds), "token for token");
    const expected = parseOutput(
      s.tokenizer.decode(k3.completion_ids.filter((id) => !s.stopIds.includes(id))),
    );
    assert.deepEqual(texts(m.content), { thinking: expected.reasoning, text: expected.content });
    assert.equal(m.type, "message");
    assert.equal(m.role, "assistant");
    assert.equal(m.stop_reason, k3.completion_ids.length === gen ? "max_tokens" : "end_turn");
    assert.equal(m.usage.input_tokens, rendered.length);
    assert.equal(m.usage.output_tokens, k3.completion_ids.length);
  });
});

Deno.test("messages: the SSE stream is the documented event sequence and adds up to the message", async () => {
  await withServer({}, async (s) => {
    const request = {
      model: "tiny",
      max_tokens: 10,
      messages: [{ role: "user" as const, content: "Hello there" }],
    };
    const whole = await s.anthropic.messages.create(request);
    // The raw events, as the wire carries them (ping included).
    const raw = await fetch(`${s.url}/v1/messages`, {
      method: "POST",
      body: JSON.stringify({ ...request, stream: true }),
      headers: { "anthropic-version": "2023-06-01" },
    }).then((r) => r.text());
    const events = raw.trim().split("\n\n").map((block) => {
      const [eventLine, dataLine] = block.split("\n");
      const data = JSON.parse(dataLine.slice("data: ".length));
      assert.equal(eventLine, `event: ${data.type}`);
      return data;
    });
    const types = events.map((e) => e.type);
    assert.deepEqual(types.slice(0, 2), ["message_start", "ping"]);
    assert.deepEqual(types.slice(-2), ["message_delta", "message_stop"]);
    // Blocks: start, deltas, stop, in index order, one at a time.
    let open = -1;
    for (const e of events) {
      if (e.type === "content_block_start") {
        assert.equal(open, -1);
        open = e.index;
      } else if (e.type === "content_block_delta") assert.equal(e.index, open);
      else if (e.type === "content_block_stop") {
        assert.equal(e.index, open);
        open = -1;
      }
    }
    const delta = events.at(-2);
    assert.equal(delta.delta.stop_reason, whole.stop_reason);
    assert.equal(delta.usage.output_tokens, whole.usage.output_tokens);

    // The SDK's stream helper rebuilds the same message.
    const stream = s.anthropic.messages.stream(request);
    const deltas: string[] = [];
    stream.on("text", (t) => deltas.push(t));
    const final = await stream.finalMessage();
    assert.deepEqual(texts(final.content), texts(whole.content));
    assert.deepEqual(final.content.map((b) => b.type), whole.content.map((b) => b.type));
    assert.equal(deltas.join(""), texts(whole.content).text);
    assert.equal(final.stop_reason, whole.stop_reason);
    const thinking = final.content.find((b) => b.type === "thinking");
    if (thinking) assert.ok(thinking.signature.startsWith("k3r1."));
  });
});

Deno.test("messages: a tool round trip; a forced tool; thinking blocks go back into the prompt", async () => {
  const use = await xtmlIds(
    `Weather first.${CLOSE}think${SEP}${OPEN}response${SEP}Let me check.${CLOSE}response${SEP}` +
      `${OPEN}tools${SEP}${OPEN}call tool="get_weather" index="1"${SEP}` +
      `${OPEN}argument key="city" type="string"${SEP}Paris${CLOSE}argument${SEP}${CLOSE}call${SEP}` +
      `${CLOSE}tools${SEP}${CLOSE}message${SEP}<|end_of_msg|>`,
  );
  const answer = await xtmlIds(`Done.${CLOSE}think${SEP}${OPEN}response${SEP}Sunny in Paris.`);
  const forcedArgs = await xtmlIds(
    `${OPEN}argument key="city" type="string"${SEP}Rome${CLOSE}argument${SEP}${CLOSE}call${SEP}`,
  );
  await withServer({ script: [use, answer, forcedArgs] }, async (s) => {
    const tools: Anthropic.Tool[] = [{
      name: "get_weather",
      description: "Weather for a city",
      input_schema: { type: "object", properties: { city: { type: "string" } } },
    }];
    const first = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: 100,
      tools,
      messages: [{ role: "user", content: "Weather in Paris?" }],
    });
    assert.deepEqual(first.content.map((b) => b.type), ["thinking", "text", "tool_use"]);
    assert.equal(first.stop_reason, "tool_use");
    const tu = first.content[2] as Anthropic.ToolUseBlock;
    assert.equal(tu.name, "get_weather");
    assert.deepEqual(tu.input, { city: "Paris" });
    assert.match(tu.id, /^toolu_/);
    const messages: Anthropic.MessageParam[] = [
      { role: "user", content: "Weather in Paris?" },
      { role: "assistant", content: first.content as Anthropic.ContentBlockParam[] },
      { role: "user", content: [{ type: "tool_result", tool_use_id: tu.id, content: "clear" }] },
    ];
    const second = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: 100,
      tools,
      messages,
    });
    assert.equal(texts(second.content).text, "Sunny in Paris.");
    const turn: ChatMessage[] = [
      { role: "user", content: [{ type: "text", text: "Weather in Paris?" }] },
      {
        role: "assistant",
        content: "Let me check.",
        reasoning_content: "Weather first.",
        tool_calls: [{
          id: tu.id,
          type: "function",
          function: { name: "get_weather", arguments: { city: "Paris" } },
        }],
      },
      { role: "tool", tool_call_id: tu.id, content: "clear" },
    ];
    const chatTools = [{
      type: "function",
      function: {
        name: "get_weather",
        description: tools[0].description,
        parameters: tools[0].input_schema,
      },
    }];
    assert.deepEqual(
      k3Of(second).prompt_ids,
      renderChatIds(s.tokenizer, turn, { tools: chatTools }).ids,
    );

    const forced = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: 100,
      tools,
      tool_choice: { type: "tool", name: "get_weather" },
      messages: [{ role: "user", content: "Weather in Rome?" }],
    });
    assert.deepEqual(forced.content.map((b) => b.type), ["tool_use"]);
    assert.deepEqual((forced.content[0] as Anthropic.ToolUseBlock).input, { city: "Rome" });
    assert.equal(forced.stop_reason, "tool_use");
    assert.ok(
      s.tokenizer.decode(k3Of(forced).prefill_ids!).endsWith(
        `${OPEN}call tool="get_weather" index="1"${SEP}`,
      ),
    );
  });
});

Deno.test("messages: the thinking switch, a thinking budget, stop sequences, sampling fields", async () => {
  await withServer({}, async (s) => {
    const user = [{ role: "user" as const, content: "Hi" }];
    const off = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: 3,
      thinking: { type: "disabled" },
      messages: user,
    });
    assert.ok(!off.content.some((b) => b.type === "thinking"));
    assert.ok(s.tokenizer.decode(k3Of(off).prompt_ids).endsWith(`${OPEN}response${SEP}`));
    // After budget_tokens thinking tokens, k3 writes the end of the think channel itself.
    const budget = 4;
    const capped = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: 12,
      thinking: { type: "enabled", budget_tokens: budget },
      messages: user,
    });
    const ids = k3Of(capped).completion_ids;
    const close = segmentIds(s.tokenizer, endThinking());
    const at = ids.findIndex((_, i) => close.every((c, k) => ids[i + k] === c));
    assert.ok(at >= 0 && at <= budget, `closed at ${at}: ${s.tokenizer.decode(ids)}`);
    assert.ok(capped.usage.output_tokens_details!.thinking_tokens <= budget + close.length);
    const effort = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: 1,
      output_config: { effort: "low" },
      messages: user,
    });
    assert.match(s.tokenizer.decode(k3Of(effort).prompt_ids), /thinking_effort=low`/);
    // temperature, top_p and top_k are sampled as in the in-process Sampler (here: seeded).
    const sampled = (seed: number) =>
      s.anthropic.messages.create({
        model: "tiny",
        max_tokens: 6,
        messages: user,
        temperature: 1,
        top_p: 0.9,
        top_k: 40,
        seed,
      } as Anthropic.MessageCreateParamsNonStreaming);
    assert.deepEqual(k3Of(await sampled(3)).completion_ids, k3Of(await sampled(3)).completion_ids);
  });
  const out = await xtmlIds(`Hmm.${CLOSE}think${SEP}${OPEN}response${SEP}One, two, STOP, three.`);
  await withServer({ script: [out] }, async (s) => {
    const m = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: 50,
      stop_sequences: ["STOP", "think"],
      messages: [{ role: "user", content: "Count" }],
    });
    assert.equal(texts(m.content).text, "One, two, ");
    assert.equal(m.stop_reason, "stop_sequence");
    assert.equal(m.stop_sequence, "STOP");
  });
});

Deno.test("messages: errors are Anthropic's shape; unsupported blocks and fields are 400s", async () => {
  await withServer({}, async (s) => {
    const user = [{ role: "user", content: "hi" }];
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ messages: user }, /max_tokens: is required/],
      [{ max_tokens: 5, messages: [...user, { role: "assistant", content: "Sure" }] }, /prefill/],
      [
        { max_tokens: 5, messages: [{ role: "user", content: [{ type: "image", source: {} }] }] },
        /text-only/,
      ],
      [
        { max_tokens: 5, messages: user, tools: [{ type: "web_search_20250305", name: "w" }] },
        /server tools/,
      ],
      [{ max_tokens: 5, messages: user, container: "c" }, /container/],
      [
        { max_tokens: 5, messages: user, thinking: { type: "enabled", budget_tokens: 9 } },
        /less than max_tokens/,
      ],
      [{ max_tokens: 5, messages: user, temperature: 1.5 }, /temperature/],
      [
        { max_tokens: 5, messages: user, tool_choice: { type: "tool", name: "none" } },
        /no tool is named/,
      ],
      [{
        max_tokens: 5,
        messages: [
          { role: "assistant", content: [{ type: "redacted_thinking", data: "x" }] },
          ...user,
        ],
      }, /redacted_thinking/],
    ];
    for (const [body, says] of cases) {
      const r = await postJson(`${s.url}/v1/messages`, { model: "tiny", ...body });
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(r.body.type, "error");
      assert.equal(r.body.error.type, "invalid_request_error");
      assert.match(r.body.error.message, says);
    }
    const ok = await s.anthropic.messages.create({
      model: "tiny",
      max_tokens: 1,
      messages: [{ role: "user", content: "ok?" }],
    });
    assert.equal(ok.type, "message");
  });
});
