/**
 * Chat Completions and Completions beyond plain generation: log probabilities against a
 * softmax of `k3 run --dump-logits`, a forced tool choice, penalties and bias as in the
 * in-process Sampler, usage details, stop strings that never fire in markup.
 */
import assert from "node:assert/strict";
import type OpenAI from "openai";
import { type ChatMessage, CLOSE, OPEN, renderChatIds, SEP } from "../../lib/text/chat.ts";
import { Sampler } from "../../lib/text/sampler.ts";
import {
  k3Of,
  logSoftmax,
  runIds,
  type Served,
  soloIds,
  withServer,
  xtmlIds,
} from "../support/serve_helpers.ts";

const TOOLS: OpenAI.ChatCompletionTool[] = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Weather for a city",
      parameters: { type: "object", properties: { city: { type: "string" } } },
    },
  },
  {
    type: "function",
    function: { name: "get_time", parameters: { type: "object", properties: {} } },
  },
];

/** The XTML control tokens' ids (a reserved special token's name is answer text; these are not). */
function CONTROL_IDS(s: Served): number[] {
  return [OPEN, CLOSE, SEP, "<|end_of_msg|>"].map((n) => s.tokenizer.specialId(n)!);
}

/** The reference top-k: ids by falling logit, ties to the lowest id. */
function topK(logits: Float32Array, k: number): number[] {
  return [...logits.keys()].sort((a, b) => logits[b] - logits[a] || a - b).slice(0, k);
}

/** Checks entries {token, bytes, logprob, top_logprobs} against the reference step by step. */
function checkEntries(
  s: Served,
  entries: OpenAI.ChatCompletionTokenLogprob[],
  ids: number[],
  logits: Float32Array[],
  top: number,
) {
  assert.equal(entries.length, ids.length);
  entries.forEach((e, i) => {
    const ref = logSoftmax(logits[i]);
    assert.ok(
      Math.abs(e.logprob - ref[ids[i]]) <= 1e-12,
      `step ${i}: ${e.logprob} vs ${ref[ids[i]]}`,
    );
    assert.deepEqual(e.bytes, [...s.tokenizer.idToBytes(ids[i])]);
    assert.equal(e.token, s.tokenizer.decode([ids[i]]));
    const want = topK(logits[i], top);
    assert.deepEqual(
      e.top_logprobs.map((t) => t.bytes),
      want.map((id) => [...s.tokenizer.idToBytes(id)]),
    );
    e.top_logprobs.forEach((t, k) => assert.ok(Math.abs(t.logprob - ref[want[k]]) <= 1e-12));
  });
}

Deno.test("serve: chat logprobs equal a softmax of `k3 run --dump-logits`, whole and streamed", async () => {
  await withServer({}, async (s) => {
    const gen = 8;
    // Thinking off, so every token is the answer's; find a prompt whose answer has no
    // control token in its first `gen` tokens (then logprobs.content covers all of them).
    let found = false;
    for (const q of ["What is the capital of France?", "Say hello.", "Count to three.", "Hi"]) {
      const request = {
        model: "tiny",
        messages: [{ role: "user" as const, content: q }],
        max_tokens: gen,
        reasoning_effort: "none" as OpenAI.ReasoningEffort,
        logprobs: true,
        top_logprobs: 5,
      };
      const whole = await s.openai.chat.completions.create(request);
      const k3 = k3Of(whole);
      if (
        k3.completion_ids.length < gen ||
        k3.completion_ids.some((id) => CONTROL_IDS(s).includes(id))
      ) {
        continue;
      }
      found = true;
      const run = await runIds(s.dir, k3.prompt_ids, gen, { logits: true });
      assert.deepEqual(k3.completion_ids, run.ids, "greedy equals k3 run");
      const entries = whole.choices[0].logprobs!.content!;
      checkEntries(s, entries, run.ids, run.logits, 5);
      assert.equal(entries.map((e) => e.token).join(""), whole.choices[0].message.content);

      const streamed: OpenAI.ChatCompletionTokenLogprob[] = [];
      const stream = await s.openai.chat.completions.create({ ...request, stream: true });
      for await (const chunk of stream) {
        streamed.push(...(chunk.choices[0]?.logprobs?.content ?? []));
      }
      assert.deepEqual(streamed, entries, "the stream carries the same entries");
      break;
    }
    assert.ok(found, "no prompt gave 8 plain answer tokens");
  });
});

Deno.test("serve: completions logprobs (and their top alternatives) equal the reference", async () => {
  await withServer({}, async (s) => {
    const gen = 6;
    const prompt = "The capital of France is";
    const whole = await s.openai.completions.create({
      model: "tiny",
      prompt,
      max_tokens: gen,
      logprobs: 3,
    });
    const k3 = k3Of(whole);
    const run = await runIds(s.dir, k3.prompt_ids, gen, { logits: true });
    assert.deepEqual(k3.completion_ids, run.ids);
    const lp = whole.choices[0].logprobs!;
    assert.equal(lp.token_logprobs!.length, gen);
    run.ids.forEach((id, i) => {
      const ref = logSoftmax(run.logits[i]);
      assert.ok(Math.abs(lp.token_logprobs![i] - ref[id]) <= 1e-12);
      assert.equal(lp.tokens![i], s.tokenizer.decode([id]));
      const best = Math.max(...Object.values(lp.top_logprobs![i]));
      assert.ok(Math.abs(best - ref[topK(run.logits[i], 1)[0]]) <= 1e-12);
    });
    assert.equal(lp.text_offset![0], 0);
    let streamed: number[] = [];
    const stream = await s.openai.completions.create({
      model: "tiny",
      prompt,
      max_tokens: gen,
      logprobs: 0,
      stream: true,
    });
    for await (const chunk of stream) {
      streamed = streamed.concat(chunk.choices[0]?.logprobs?.token_logprobs ?? []);
    }
    assert.deepEqual(streamed, lp.token_logprobs);
  });
});

Deno.test("serve: tool_choice naming a function calls it (prefilled call, same tokens as k3 run)", async () => {
  await withServer({}, async (s) => {
    const messages: ChatMessage[] = [{ role: "user", content: "Weather in Paris?" }];
    for (const thinking of [true, false]) {
      const gen = 6;
      const r = await s.openai.chat.completions.create({
        model: "tiny",
        messages: messages as OpenAI.ChatCompletionMessageParam[],
        tools: TOOLS,
        tool_choice: { type: "function", function: { name: "get_time" } },
        max_tokens: gen,
        reasoning_effort: (thinking ? "low" : "none") as OpenAI.ReasoningEffort,
      });
      const k3 = k3Of(r);
      const rendered = renderChatIds(s.tokenizer, messages, {
        tools: TOOLS,
        toolChoice: "required",
        thinking,
        thinkingEffort: thinking ? "low" : undefined,
      }).ids;
      assert.deepEqual(k3.prompt_ids, [...rendered, ...k3.prefill_ids!]);
      const prefill = s.tokenizer.decode(k3.prefill_ids!);
      assert.ok(
        prefill.endsWith(`${OPEN}tools${SEP}${OPEN}call tool="get_time" index="1"${SEP}`),
        prefill,
      );
      assert.equal(prefill.startsWith(`${CLOSE}think${SEP}`), thinking);
      const calls = r.choices[0].message.tool_calls!;
      assert.equal(calls.length, 1);
      assert.equal(calls[0].type, "function");
      const fn = (calls[0] as OpenAI.ChatCompletionMessageFunctionToolCall).function;
      assert.equal(fn.name, "get_time");
      assert.equal(typeof JSON.parse(fn.arguments), "object");
      assert.equal(r.choices[0].message.content, "");
      const message = r.choices[0].message as unknown as { reasoning_content: string | null };
      assert.equal(message.reasoning_content, thinking ? "" : null);
      // A random-weight model does not write valid arguments: the forced call is reported
      // with what it completed, and generation ends there (or at max_tokens).
      const run = await runIds(s.dir, k3.prompt_ids, gen);
      const n = k3.completion_ids.length;
      assert.ok(n > 0 && n <= gen);
      assert.deepEqual(k3.completion_ids, run.ids.slice(0, n), "token for token as k3 run");
      if (n < gen) assert.match(k3.malformed_tool_calls!.join("\n"), /reported with the arguments/);
    }
  });
});

Deno.test("serve: a forced call's arguments are parsed and generation stops at its end", async () => {
  const firstCall =
    `${OPEN}argument key="city" type="string"${SEP}Paris${CLOSE}argument${SEP}${CLOSE}call${SEP}`;
  const args = await xtmlIds(
    firstCall + `${OPEN}call tool="get_time" index="2"${SEP}${CLOSE}call${SEP}${CLOSE}tools${SEP}`,
  );
  await withServer({ script: [args] }, async (s) => {
    const r = await s.openai.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Weather in Paris?" }],
      tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_weather" } },
    });
    const calls = r.choices[0].message.tool_calls as OpenAI.ChatCompletionMessageFunctionToolCall[];
    assert.deepEqual(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]), [
      ["get_weather", { city: "Paris" }],
    ]);
    assert.match(calls[0].id, /^call_/);
    assert.equal(r.choices[0].finish_reason, "tool_calls");
    const k3 = k3Of(r);
    assert.deepEqual(k3.completion_ids, await xtmlIds(firstCall), "stops right after the call");

    // Streamed: the call arrives in one tool_calls chunk.
    const stream = await s.openai.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Weather in Paris?" }],
      tools: TOOLS,
      tool_choice: { type: "function", function: { name: "get_weather" } },
      stream: true,
    });
    const chunks: OpenAI.ChatCompletionChunk[] = [];
    for await (const c of stream) chunks.push(c);
    const streamedCalls = chunks.flatMap((c) => c.choices[0]?.delta.tool_calls ?? []);
    assert.deepEqual(streamedCalls.map((c) => [c.index, c.function?.name, c.function?.arguments]), [
      [0, "get_weather", '{"city":"Paris"}'],
    ]);
    assert.equal(chunks.at(-1)!.choices[0].finish_reason, "tool_calls");
  });
});

Deno.test("serve: a tool round trip: the call the server returned is sent back and rendered", async () => {
  const answer = await xtmlIds(
    `Need the weather.${CLOSE}think${SEP}${OPEN}response${SEP}Checking.${CLOSE}response${SEP}` +
      `${OPEN}tools${SEP}${OPEN}call tool="get_weather" index="1"${SEP}` +
      `${OPEN}argument key="city" type="string"${SEP}Paris${CLOSE}argument${SEP}${CLOSE}call${SEP}` +
      `${CLOSE}tools${SEP}${CLOSE}message${SEP}<|end_of_msg|>`,
  );
  const final = await xtmlIds(`Done.${CLOSE}think${SEP}${OPEN}response${SEP}It is sunny.`);
  await withServer({ script: [answer, final] }, async (s) => {
    const messages: OpenAI.ChatCompletionMessageParam[] = [{ role: "user", content: "Weather?" }];
    const first = await s.openai.chat.completions.create({ model: "tiny", messages, tools: TOOLS });
    const msg = first.choices[0].message;
    assert.equal(first.choices[0].finish_reason, "tool_calls");
    assert.equal(msg.content, "Checking.");
    assert.equal(
      (msg as unknown as { reasoning_content: string }).reasoning_content,
      "Need the weather.",
    );
    const call = msg.tool_calls![0] as OpenAI.ChatCompletionMessageFunctionToolCall;
    const turn2: OpenAI.ChatCompletionMessageParam[] = [
      ...messages,
      msg as OpenAI.ChatCompletionAssistantMessageParam,
      { role: "tool", tool_call_id: call.id, content: '{"sky": "clear"}' },
    ];
    const second = await s.openai.chat.completions.create({
      model: "tiny",
      messages: turn2,
      tools: TOOLS,
    });
    assert.equal(second.choices[0].message.content, "It is sunny.");
    assert.equal(second.choices[0].finish_reason, "length");
    const prompt = s.tokenizer.decode(k3Of(second).prompt_ids);
    // The first answer comes back exactly as the model wrote it (preserved thinking).
    assert.ok(prompt.includes(s.tokenizer.decode(answer.slice(0, -1))), prompt);
    assert.ok(prompt.includes(`role="tool" tool="get_weather" index="1"${SEP}{"sky": "clear"}`));
    assert.deepEqual(
      k3Of(second).prompt_ids,
      renderChatIds(s.tokenizer, turn2 as ChatMessage[], { tools: TOOLS }).ids,
    );
  });
});

Deno.test("serve: penalties and logit_bias through the API equal the in-process Sampler", async () => {
  await withServer({}, async (s) => {
    const messages = [{ role: "user" as const, content: "Repeat after me: la la la" }];
    const gen = 12;
    const plain = await s.openai.chat.completions.create({
      model: "tiny",
      messages,
      max_tokens: gen,
    });
    const k3 = k3Of(plain);
    const cases: [Record<string, unknown>, ConstructorParameters<typeof Sampler>[0]][] = [
      [{ presence_penalty: 1.5 }, { presencePenalty: 1.5 }],
      [{ frequency_penalty: 2 }, { frequencyPenalty: 2 }],
      [{ repetition_penalty: 1.8 }, { repetitionPenalty: 1.8 }],
      [{ logit_bias: { [k3.completion_ids[0]]: -100 } }, {
        logitBias: { [k3.completion_ids[0]]: -100 },
      }],
      [{ top_k: 3, min_p: 0.05, temperature: 0.8, seed: 4, presence_penalty: 0.5 }, {
        topK: 3,
        minP: 0.05,
        temperature: 0.8,
        seed: 4,
        presencePenalty: 0.5,
      }],
    ];
    for (const [fields, options] of cases) {
      const r = await s.openai.chat.completions.create({
        model: "tiny",
        messages,
        max_tokens: gen,
        ...fields,
      });
      const ids = k3Of(r).completion_ids;
      assert.deepEqual(
        ids,
        await soloIds(s, k3.prompt_ids, gen, new Sampler(options)),
        JSON.stringify(fields),
      );
    }
    const biased = await s.openai.chat.completions.create({
      model: "tiny",
      messages,
      max_tokens: gen,
      logit_bias: { [k3.completion_ids[0]]: -100 },
    });
    assert.notEqual(k3Of(biased).completion_ids[0], k3.completion_ids[0], "the bias acts");
  });
});

Deno.test("serve: usage carries reasoning_tokens and cached_tokens", async () => {
  const reasoning = await xtmlIds("one two three four");
  const close = await xtmlIds(`${CLOSE}think${SEP}`);
  const rest = await xtmlIds(`${OPEN}response${SEP}Five.`);
  await withServer({ script: [[...reasoning, ...close, ...rest]] }, async (s) => {
    const r = await s.openai.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Count" }],
    });
    assert.equal(r.usage!.completion_tokens, reasoning.length + close.length + rest.length);
    assert.equal(
      r.usage!.completion_tokens_details!.reasoning_tokens,
      reasoning.length + close.length,
    );
    assert.equal(r.usage!.prompt_tokens_details!.cached_tokens, 0);
    assert.equal(r.choices[0].message.content, "Five.");
  });
});

Deno.test("serve: a stop string inside markup or a special token's name does not fire", async () => {
  await withServer({}, async (s) => {
    const reserved = s.tokenizer.vocabSize - 3;
    const name = s.tokenizer.specialName(reserved)!;
    for (
      const [path, body] of [
        ["chat/completions", {
          messages: [{ role: "user", content: "hi" }],
          reasoning_effort: "none",
        }],
        ["completions", { prompt: "hi" }],
      ] as const
    ) {
      const r = await fetch(`${s.url}/v1/${path}`, {
        method: "POST",
        body: JSON.stringify({
          model: "tiny",
          ...body,
          max_tokens: 3,
          stop: ["ve", "<|"],
          logit_bias: { [reserved]: 100 },
        }),
      }).then((r) => r.json());
      const choice = r.choices[0];
      assert.equal(choice.finish_reason, "length", path);
      assert.equal(choice.message?.content ?? choice.text, name.repeat(3), path);
    }
  });
  const out = await xtmlIds(
    `Thinking about responses${CLOSE}think${SEP}${OPEN}response${SEP}Yes, a response.`,
  );
  await withServer({ script: [out] }, async (s) => {
    const ask = (stop: string) =>
      s.openai.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "?" }],
        stop,
      });
    const markup = await ask("think"); // only in the marker <|close|>think<|sep|>
    assert.equal(markup.choices[0].message.content, "Yes, a response.");
    const content = await ask("a resp");
    assert.equal(content.choices[0].message.content, "Yes, ");
    assert.equal(content.choices[0].finish_reason, "stop");
    const inReasoning = await ask("about");
    assert.equal(
      (inReasoning.choices[0].message as unknown as { reasoning_content: string })
        .reasoning_content,
      "Thinking ",
    );
    assert.equal(inReasoning.choices[0].message.content, "");
  });
});
