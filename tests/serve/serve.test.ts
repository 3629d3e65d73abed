/**
 * `k3 serve`, Chat Completions and Completions: the server on a tiny model, driven by the
 * official `openai` client. Answers are checked against independent references: `k3 run` in
 * a child process, the in-process decode loop, renderChatIds and parseOutput.
 */
import assert from "node:assert/strict";
import * as path from "node:path";
import OpenAI from "openai";
import { ChannelView } from "../../lib/chat/display.ts";
import { isLoopback } from "../../lib/cli/serve.ts";
import { parseChatRequest } from "../../lib/serve/openai.ts";
import {
  type ChatMessage,
  CLOSE,
  END_OF_MSG,
  OPEN,
  renderChatIds,
  SEP,
} from "../../lib/text/chat.ts";
import { parseOutput } from "../../lib/text/parse.ts";
import { Sampler } from "../../lib/text/sampler.ts";
import { runK3, tempDir, tinyModel } from "../support/helpers.ts";
import {
  type K3Field,
  k3Of,
  MODEL_SEED,
  type Served,
  soloIds,
  untilStop,
  withServer,
} from "../support/serve_helpers.ts";

/** The text of generated ids, without the stop token (as the server decodes it). */
function textOf(s: Served, ids: number[]): string {
  return s.tokenizer.decode(ids.filter((id) => !s.stopIds.includes(id)));
}

const HELLO: ChatMessage[] = [
  { role: "developer", content: "You are terse." },
  { role: "user", content: "What is the capital of France?" },
];

/** The top-level fields of a completion (and of a usage chunk): OpenAI's, then k3's own. */
const OPENAI_KEYS = ["choices", "created", "id", "k3", "model", "object", "usage"];

Deno.test("serve: greedy chat equals `k3 run` on the same rendered prompt, token for token", async () => {
  await withServer({}, async (s) => {
    const gen = 16;
    const response = await s.openai.chat.completions.create({
      model: "tiny",
      messages: HELLO as OpenAI.ChatCompletionMessageParam[],
      max_tokens: gen,
    });
    const k3 = k3Of(response);
    assert.deepEqual(Object.keys(response).sort(), OPENAI_KEYS, "OpenAI's fields, and k3's");
    const { ids } = renderChatIds(s.tokenizer, HELLO);
    assert.deepEqual(k3.prompt_ids, ids, "the server renders what renderChatIds renders");

    const out = path.join(tempDir(), "run.json");
    const run = await runK3([
      "run",
      s.dir,
      "--ids",
      ids.join(","),
      "--gen",
      String(gen),
      "--out",
      out,
    ]);
    assert.equal(run.code, 0, run.stderr);
    const runIds: number[] = JSON.parse(await Deno.readTextFile(out)).generated_ids;
    assert.deepEqual(k3.completion_ids, untilStop(runIds, s.stopIds));

    const expected = parseOutput(textOf(s, k3.completion_ids));
    const message = response.choices[0].message as unknown as Record<string, unknown>;
    assert.equal(message.content, expected.content);
    assert.equal(message.reasoning_content, expected.reasoning);
    const stopped = s.stopIds.includes(k3.completion_ids.at(-1)!);
    assert.equal(response.choices[0].finish_reason, stopped ? "stop" : "length");
    assert.equal(response.usage?.prompt_tokens, ids.length);
    assert.equal(response.usage?.completion_tokens, k3.completion_ids.length);
    assert.equal(s.logs.length, 1, "one log line per request");
    assert.match(
      s.logs[0],
      /queue .* ms .*prompt \d+ \(reused 0\), completion \d+, ttft .* tok\/s/,
    );
  });
});

Deno.test("serve: a streamed chat adds up to the non-streamed answer (thinking on and off)", async () => {
  await withServer({}, async (s) => {
    for (const effort of ["high", "none"] as const) {
      const request = {
        model: "tiny",
        messages: HELLO as OpenAI.ChatCompletionMessageParam[],
        max_tokens: 24,
        reasoning_effort: effort as OpenAI.ReasoningEffort,
      };
      const whole = await s.openai.chat.completions.create(request);
      const stream = await s.openai.chat.completions.create({
        ...request,
        stream: true,
        stream_options: { include_usage: true },
      });
      let content = "", reasoning = "", finish: string | null = null;
      let usage: OpenAI.CompletionUsage | undefined, last: unknown;
      for await (const chunk of stream) {
        assert.equal(chunk.object, "chat.completion.chunk");
        const keys = chunk.usage ? OPENAI_KEYS : ["choices", "created", "id", "model", "object"];
        assert.deepEqual(Object.keys(chunk).sort(), keys);
        const choice = chunk.choices[0];
        const delta = (choice?.delta ?? {}) as { content?: string; reasoning_content?: string };
        content += delta.content ?? "";
        reasoning += delta.reasoning_content ?? "";
        finish = choice?.finish_reason ?? finish;
        usage = chunk.usage ?? usage;
        last = chunk;
      }
      const message = whole.choices[0].message as unknown as Record<string, unknown>;
      assert.equal(content, message.content, `content, effort ${effort}`);
      assert.equal(reasoning, message.reasoning_content ?? "", `reasoning, effort ${effort}`);
      assert.equal(effort === "none", message.reasoning_content === null);
      assert.equal(finish, whole.choices[0].finish_reason);
      assert.deepEqual(k3Of(last).completion_ids, k3Of(whole).completion_ids);
      assert.equal(usage?.completion_tokens, whole.usage?.completion_tokens);
      assert.equal(usage?.prompt_tokens, whole.usage?.prompt_tokens);
    }
  });
});

Deno.test("serve: the thinking switch per request", async () => {
  await withServer({}, async (s) => {
    const promptOf = async (extra: Record<string, unknown>) => {
      const r = await s.openai.chat.completions.create({
        model: "tiny",
        messages: HELLO as OpenAI.ChatCompletionMessageParam[],
        max_tokens: 1,
        ...extra,
      });
      return s.tokenizer.decode(k3Of(r).prompt_ids);
    };
    const think = `${OPEN}think${SEP}`, respond = `${OPEN}response${SEP}`;
    const byDefault = await promptOf({});
    assert.ok(byDefault.endsWith(think), "thinking is on by default");
    assert.match(byDefault, /thinking_effort=max`/);
    assert.match(await promptOf({ reasoning_effort: "medium" }), /thinking_effort=high`/);
    for (
      const off of [{ reasoning_effort: "none" }, { chat_template_kwargs: { thinking: false } }]
    ) {
      const prompt = await promptOf(off);
      assert.ok(prompt.endsWith(respond), JSON.stringify(off));
      assert.doesNotMatch(prompt, /thinking_effort/);
    }
  });
});

Deno.test("serve: a follow-up turn resumes the retained state of the earlier prompt", async () => {
  await withServer({}, async (s) => {
    const first = await s.openai.chat.completions.create({
      model: "tiny",
      messages: HELLO as OpenAI.ChatCompletionMessageParam[],
      max_tokens: 6,
    });
    const answer = first.choices[0].message as unknown as ChatMessage;
    const turn2: ChatMessage[] = [
      ...HELLO,
      { role: "assistant", content: answer.content, reasoning_content: answer.reasoning_content },
      { role: "user", content: "And of Italy?" },
    ];
    const second = await s.openai.chat.completions.create({
      model: "tiny",
      messages: turn2 as OpenAI.ChatCompletionMessageParam[],
      max_tokens: 6,
    });
    assert.equal(first.usage?.prompt_tokens_details?.cached_tokens, 0);
    assert.equal(
      second.usage?.prompt_tokens_details?.cached_tokens,
      first.usage?.prompt_tokens,
      "turn 2 resumes after turn 1's prompt instead of prefilling it again",
    );
    const { ids } = renderChatIds(s.tokenizer, turn2);
    assert.deepEqual(k3Of(second).completion_ids, await soloIds(s, ids, 6));
  });
});

Deno.test("serve: a tool-call round trip is accepted and rendered", async () => {
  await withServer({}, async (s) => {
    const tools: OpenAI.ChatCompletionTool[] = [{
      type: "function",
      function: {
        name: "get_weather",
        description: "Weather for a city",
        parameters: { type: "object", properties: { city: { type: "string" } } },
      },
    }];
    const messages: OpenAI.ChatCompletionMessageParam[] = [
      { role: "user", content: "Weather in Hangzhou?" },
      {
        role: "assistant",
        content: "",
        reasoning_content: "I should call the tool.",
        tool_calls: [{
          id: "call_1",
          type: "function",
          function: { name: "get_weather", arguments: '{"city":"Hangzhou","days":3}' },
        }],
      } as OpenAI.ChatCompletionAssistantMessageParam,
      { role: "tool", tool_call_id: "call_1", content: '{"temp": 21}' },
    ];
    const r = await s.openai.chat.completions.create({
      model: "tiny",
      messages,
      tools,
      tool_choice: "auto",
      max_tokens: 4,
    });
    const k3 = k3Of(r);
    const { ids } = renderChatIds(s.tokenizer, messages as ChatMessage[], { tools });
    assert.deepEqual(k3.prompt_ids, ids);
    const prompt = s.tokenizer.decode(k3.prompt_ids);
    assert.ok(prompt.includes(`${OPEN}call tool="get_weather" index="1"${SEP}`));
    assert.ok(prompt.includes(`key="days" type="number"${SEP}3${CLOSE}argument`));
    assert.ok(prompt.includes(`role="tool" tool="get_weather" index="1"${SEP}{"temp": 21}`));
    assert.ok(prompt.includes("I should call the tool."), "reasoning_content is sent back");
    assert.ok(prompt.includes('"name":"get_weather"'), "the tool is declared");
  });
});

/** A generation in XTML with reasoning, an answer and two tool calls (MODEL.md §7.4). */
const SYNTHETIC = "Let me check the weather." +
  `${CLOSE}think${SEP}${OPEN}response${SEP}Checking.${CLOSE}response${SEP}` +
  `${OPEN}tools${SEP}` +
  `${OPEN}call tool="get_weather" index="1"${SEP}` +
  `${OPEN}argument key="city" type="string"${SEP}Hangzhou${CLOSE}argument${SEP}` +
  `${OPEN}argument key="days" type="number"${SEP}3${CLOSE}argument${SEP}${CLOSE}call${SEP}` +
  `${OPEN}call tool="raw" index="2"${SEP}${OPEN}json type="object"${SEP}{"a": [1, 2]}` +
  `${CLOSE}json${SEP}${CLOSE}call${SEP}${CLOSE}tools${SEP}${CLOSE}message${SEP}`;

Deno.test("serve: streamed channel deltas add up to parseOutput, however the text is split", () => {
  const texts = [
    SYNTHETIC,
    "no markers at all < not a tag",
    `thinking${CLOSE}think${SEP}${OPEN}response${SEP}a < b <|c${END_OF_MSG}`,
    `cut off${CLOSE}thi`,
  ];
  for (const text of texts) {
    for (const thinking of [true, false]) {
      for (const size of [1, 2, 3, 7, 1000]) {
        const channels = new ChannelView(thinking);
        let reasoning = "", content = "";
        for (let i = 0; i < text.length; i += size) {
          const d = channels.push(text.slice(i, i + size));
          reasoning += d.reasoning;
          content += d.content;
        }
        const last = channels.flush();
        reasoning += last.reasoning;
        content += last.content;
        const expected = parseOutput(text, { thinking });
        assert.equal(reasoning, expected.reasoning ?? "", `${text} / ${thinking} / ${size}`);
        assert.equal(content, expected.content, `${text} / ${thinking} / ${size}`);
      }
    }
  }
  // Reasoning is sent before its channel closes, and a marker being written is held back.
  const live = new ChannelView(true);
  assert.deepEqual(live.push("abc"), { reasoning: "abc", content: "" });
  assert.deepEqual(live.push(`${CLOSE}thi`), { reasoning: "", content: "" });
  assert.deepEqual(live.push(`nk${SEP}${OPEN}response${SEP}ok`), { reasoning: "", content: "ok" });
});

Deno.test("serve: /v1/completions continues raw text like `k3 run --prompt`", async () => {
  await withServer({}, async (s) => {
    const prompt = "The capital of France is";
    const gen = 12;
    const whole = await s.openai.completions.create({ model: "tiny", prompt, max_tokens: gen });
    const k3 = k3Of(whole);
    assert.deepEqual(Object.keys(whole).sort(), OPENAI_KEYS);
    assert.deepEqual(k3.prompt_ids, s.tokenizer.encode(prompt, { allowSpecial: false }));
    const out = path.join(tempDir(), "run.json");
    const run = await runK3(["run", s.dir, "--prompt", prompt, "--gen", String(gen), "--out", out]);
    assert.equal(run.code, 0, run.stderr);
    assert.deepEqual(k3.completion_ids, JSON.parse(await Deno.readTextFile(out)).generated_ids);
    assert.equal(whole.choices[0].text, textOf(s, k3.completion_ids));

    let streamed = "";
    const stream = await s.openai.completions.create({
      model: "tiny",
      prompt,
      max_tokens: gen,
      stream: true,
    });
    for await (const chunk of stream) streamed += chunk.choices[0]?.text ?? "";
    assert.equal(streamed, whole.choices[0].text);

    // A stop string taken from the middle of the answer cuts it there.
    const text = whole.choices[0].text;
    const stop = [...text].slice(3, 5).join("");
    const cut = await s.openai.completions.create({ model: "tiny", prompt, max_tokens: gen, stop });
    assert.equal(cut.choices[0].text, text.slice(0, text.indexOf(stop)));
    assert.equal(cut.choices[0].finish_reason, "stop");
  });
});

Deno.test("serve: seeded sampling matches the Sampler in process", async () => {
  await withServer({}, async (s) => {
    const ask = (seed: number) =>
      s.openai.chat.completions.create({
        model: "tiny",
        messages: HELLO as OpenAI.ChatCompletionMessageParam[],
        max_tokens: 8,
        temperature: 1,
        top_p: 0.9,
        seed,
        reasoning_effort: "none" as OpenAI.ReasoningEffort,
      });
    const a = k3Of(await ask(7));
    const picker = new Sampler({ temperature: 1, topP: 0.9, seed: 7 });
    assert.deepEqual(a.completion_ids, await soloIds(s, a.prompt_ids, 8, picker));
    assert.deepEqual(k3Of(await ask(7)).completion_ids, a.completion_ids);
    assert.notDeepEqual(k3Of(await ask(8)).completion_ids, a.completion_ids);
  });
});

Deno.test("serve: /v1/models and the API key", async () => {
  await withServer({ apiKey: "sekret" }, async (s) => {
    const models = await s.openai.models.list();
    assert.deepEqual(models.data.map((m) => m.id), ["tiny"]);
    assert.equal((await s.openai.models.retrieve("tiny")).id, "tiny");

    const wrong = new OpenAI({ baseURL: `${s.server.url}/v1`, apiKey: "guess", maxRetries: 0 });
    await assert.rejects(
      wrong.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "x" }] }),
      (e) => e instanceof OpenAI.AuthenticationError && e.status === 401,
    );
    const bare = await fetch(`${s.server.url}/v1/models`);
    assert.equal(bare.status, 401);
    assert.equal((await bare.json()).error.code, "invalid_api_key");
    const health = await fetch(`${s.server.url}/health`);
    assert.equal((await health.json()).status, "ok", "/health needs no key");
    const ok = await s.openai.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "x" }],
      max_tokens: 2,
    });
    assert.equal(ok.choices.length, 1);
  });
});

Deno.test("serve: a client that leaves mid-stream frees the engine within a step", async () => {
  await withServer({}, async (s) => {
    const long = 3000;
    const stream = await s.openai.chat.completions.create({
      model: "tiny",
      messages: HELLO as OpenAI.ChatCompletionMessageParam[],
      max_tokens: long,
      stream: true,
    });
    let chunks = 0;
    for await (const _ of stream) if (++chunks === 4) break; // break aborts the request
    const t0 = performance.now();
    const next = await s.openai.chat.completions.create({
      model: "tiny",
      messages: [{ role: "user", content: "Next" }],
      max_tokens: 2,
    });
    const waited = performance.now() - t0;
    assert.equal(next.choices.length, 1);
    const health = await (await fetch(`${s.server.url}/health`)).json();
    const [cancelled, served] = health.recent;
    assert.equal(cancelled.finish, "cancelled");
    assert.ok(cancelled.completion_tokens < 200, `stopped after ${cancelled.completion_tokens}`);
    assert.ok(served.queue_ms < 1000, `the next request waited ${served.queue_ms} ms`);
    assert.ok(waited < 5000, `the next request took ${waited} ms`);

    // A non-streamed request whose client gives up is cancelled too.
    const gone = new AbortController();
    const request = s.openai.chat.completions.create(
      { model: "tiny", messages: [{ role: "user", content: "Bye" }], max_tokens: long },
      { signal: gone.signal },
    );
    setTimeout(() => gone.abort(), 200);
    await assert.rejects(request);
    for (let i = 0; i < 100 && s.logs.length < 3; i++) await new Promise((r) => setTimeout(r, 20));
    assert.match(s.logs[2], /cancelled$/);
    assert.equal(health.queue_depth, 0);
  });
});

Deno.test("serve: four requests at once are each answered as if alone, in arrival order", async () => {
  await withServer({}, async (s) => {
    const questions: ChatMessage[][] = ["one", "two", "three", "four"].map((w) => [
      { role: "user", content: `Say ${w}.` },
    ]);
    const solo: number[][] = [];
    for (const q of questions) solo.push(await soloIds(s, renderChatIds(s.tokenizer, q).ids, 10));
    // Two whole answers and two streams, all sent at once.
    const answers = await Promise.all(questions.map(async (q, i) => {
      const request = {
        model: "tiny",
        messages: q as OpenAI.ChatCompletionMessageParam[],
        max_tokens: 10,
      };
      if (i % 2 === 0) return k3Of(await s.openai.chat.completions.create(request));
      const stream = await s.openai.chat.completions.create({
        ...request,
        stream: true,
        stream_options: { include_usage: true },
      });
      let k3: K3Field | undefined;
      for await (const chunk of stream) k3 = (chunk as { k3?: K3Field }).k3 ?? k3;
      return k3!;
    }));
    answers.forEach((a, i) => assert.deepEqual(a.completion_ids, solo[i], `request ${i}`));
    assert.deepEqual(
      answers.map((a) => a.timing.queued_behind).sort(),
      [0, 1, 2, 3],
      "each queued behind the earlier ones",
    );
    // The server logs each request as it finishes: one line each, in arrival order.
    const finished = s.logs.map((line) => Number(/chatcmpl-(\d+)-/.exec(line)![1]));
    assert.deepEqual(finished, answers.map((a) => a.timing.seq).sort((a, b) => a - b));
  });
});

Deno.test("serve: bad requests get OpenAI errors with the right status, then service goes on", async () => {
  await withServer({ maxBodyBytes: 4000, contextTokens: 300 }, async (s) => {
    const url = `${s.server.url}/v1/chat/completions`;
    const healthy = async (what: string) => {
      const r = await s.openai.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: "ok?" }],
        max_tokens: 2,
        reasoning_effort: "none" as OpenAI.ReasoningEffort,
      });
      assert.equal(r.choices[0].message.role, "assistant", `healthy after ${what}`);
    };
    const expectError = async (what: string, response: Response, status: number, says: RegExp) => {
      assert.equal(response.status, status, what);
      const body = await response.json();
      assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
      assert.match(body.error.message, says, what);
      await healthy(what);
    };
    const post = (body: BodyInit, headers: Record<string, string> = {}, target = url) =>
      fetch(target, {
        method: "POST",
        body,
        headers: { "content-type": "application/json", ...headers },
      });
    const chat = (extra: Record<string, unknown>) =>
      post(
        JSON.stringify({ model: "tiny", messages: [{ role: "user", content: "hi" }], ...extra }),
      );

    await expectError("malformed JSON", await post("{not json"), 400, /not valid JSON/);
    await expectError("not an object", await post("[1, 2]"), 400, /JSON object/);
    await expectError(
      "unknown model",
      await chat({ model: "gpt-9" }),
      404,
      /gpt-9.*does not exist/,
    );
    await expectError("no messages", await chat({ messages: [] }), 400, /messages/);
    await expectError("bad role", await chat({ messages: [{ role: "robot" }] }), 400, /role/);
    await expectError("bad temperature", await chat({ temperature: "hot" }), 400, /temperature/);
    await expectError(
      "bad effort",
      await chat({ reasoning_effort: "extreme" }),
      400,
      /reasoning_effort/,
    );
    await expectError("bad stop", await chat({ stop: [""] }), 400, /stop/);
    await expectError(
      "bad tool_choice",
      await chat({ tool_choice: { type: "function" } }),
      400,
      /tool_choice/,
    );
    const image = {
      messages: [{
        role: "user",
        content: [{ type: "text", text: "what is this?" }, {
          type: "image_url",
          image_url: { url: "data:image/png;base64,AAAA" },
        }],
      }],
    };
    await expectError("image part", await chat(image), 400, /image content is not supported/);
    const long = { messages: [{ role: "user", content: "word ".repeat(400) }] };
    await expectError(
      "prompt over the context",
      await chat(long),
      400,
      /at most 299 prompt tokens fit/,
    );
    await expectError(
      "max_tokens over the context",
      await chat({ max_tokens: 100000 }),
      400,
      /completion tokens fit/,
    );
    const big = JSON.stringify({
      model: "tiny",
      messages: [{ role: "user", content: "x".repeat(5000) }],
    });
    await expectError("body over the limit", await post(big), 413, /over the limit of 4000 bytes/);
    // No Content-Length: the limit applies to the bytes that actually arrive.
    const chunked = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(new TextEncoder().encode(big));
        c.close();
      },
    });
    const unsized = await fetch(
      url,
      { method: "POST", body: chunked, duplex: "half" } as RequestInit,
    );
    await expectError("unsized body over the limit", unsized, 413, /over the limit/);
    await expectError("wrong method", await fetch(url), 405, /takes POST, not GET/);
    await expectError("wrong path", await fetch(`${s.server.url}/v1/nothing`), 404, /no route/);

    // Through the official client, the same errors arrive as its typed exceptions.
    await assert.rejects(
      s.openai.chat.completions.create({
        model: "gpt-9",
        messages: [{ role: "user", content: "x" }],
      }),
      (e) => e instanceof OpenAI.NotFoundError,
    );
    await assert.rejects(
      s.openai.chat.completions.create({
        model: "tiny",
        messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "x" } }] }],
      }),
      (e) => e instanceof OpenAI.BadRequestError && /text-only/.test(e.message),
    );
    await healthy("client errors");
    assert.ok(
      s.logs.some((l) => /POST \/v1\/chat\/completions: 413 /.test(l)),
      "errors are logged",
    );
    const health = await (await fetch(`${s.server.url}/health`)).json();
    assert.equal(health.status, "ok");
    assert.ok(health.requests_served >= 16);
  });
});

Deno.test("serve: request fields are checked before anything is queued", () => {
  const base = { messages: [{ role: "user", content: "hi" }] };
  const r = parseChatRequest({ ...base, max_completion_tokens: 5, stop: "x", temperature: 0.5 });
  assert.equal(r.spec.maxTokens, 5);
  assert.deepEqual(r.spec.stops, ["x"]);
  assert.equal(r.spec.sampling.temperature, 0.5);
  const render = (extra: Record<string, unknown>) => {
    const input = parseChatRequest({ ...base, ...extra }).spec.input;
    assert.equal(input.kind, "chat");
    return input.kind === "chat" ? input.render : {};
  };
  assert.equal(render({ reasoning_effort: "medium" }).thinkingEffort, "high");
  assert.equal(render({ reasoning_effort: "minimal" }).thinkingEffort, "low");
  assert.equal(render({ reasoning_effort: "xhigh" }).thinkingEffort, "max");
  assert.equal(render({ reasoning_effort: "none" }).thinking, false);
  assert.throws(() => parseChatRequest({ ...base, n: 17 }), /n.*16/);
  assert.equal(parseChatRequest({ ...base, n: 3 }).n, 3);
  for (const name of ["constructor", "toString", "__proto__"]) {
    assert.throws(() => parseChatRequest({ ...base, reasoning_effort: name }), /reasoning_effort/);
  }
  assert.throws(() => parseChatRequest({ ...base, max_tokens: 0 }), /max_tokens/);
  assert.ok(isLoopback("127.0.0.1") && isLoopback("::1") && isLoopback("localhost"));
  assert.ok(!isLoopback("0.0.0.0") && !isLoopback("192.168.1.2"));
});

/** Starts `k3 serve` as a child process and returns its URL once it is listening. */
async function spawnServe(dir: string, env: Record<string, string>, extra: string[] = []) {
  const repo = path.resolve(import.meta.dirname!, "..", "..");
  const child = new Deno.Command(path.join(repo, "k3"), {
    args: ["serve", dir, "--port", "0", "--threads", "1", ...extra],
    env,
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const lines = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
  let out = "";
  while (!/listening on (\S+)/.test(out)) {
    const { value, done } = await lines.read();
    if (done) break;
    out += value;
  }
  const url = /listening on (\S+)/.exec(out)?.[1];
  const stderr = new Response(child.stderr).text();
  return { child, url, stderr, lines };
}

Deno.test("serve: `k3 serve` binds loopback on a free port, warns without a key, stops on SIGTERM", async () => {
  const dir = await tinyModel({ seed: MODEL_SEED });
  const [open, locked] = await Promise.all([
    spawnServe(dir, {}),
    spawnServe(dir, { K3_API_KEY: "from-env" }, [
      "--model-name",
      "k3",
      "--model-name",
      "other",
      "--cors",
      "http://localhost:3000",
    ]),
  ]);
  try {
    assert.match(open.url ?? "", /^http:\/\/127\.0\.0\.1:\d+\/v1$/);
    const health = await (await fetch(`${open.url!.replace(/\/v1$/, "")}/health`)).json();
    assert.deepEqual(health.models, ["kimi-k3", path.basename(dir)]);
    const client = new OpenAI({ baseURL: open.url, apiKey: "none", maxRetries: 0 });
    const r = await client.chat.completions.create({
      model: "kimi-k3",
      messages: [{ role: "user", content: "hi" }],
      max_tokens: 3,
    });
    assert.equal(r.choices.length, 1);

    const denied = await fetch(`${locked.url}/models`);
    assert.equal(denied.status, 401);
    await denied.body?.cancel();
    const allowed = await fetch(`${locked.url}/models`, {
      headers: { authorization: "Bearer from-env" },
    });
    const listed = (await allowed.json()).data.map((m: { id: string }) => m.id);
    assert.deepEqual(listed, ["k3", "other"], "--model-name replaces the default names");
    const preflight = await fetch(`${locked.url}/messages`, {
      method: "OPTIONS",
      headers: { origin: "http://localhost:3000", "access-control-request-method": "POST" },
    });
    await preflight.body?.cancel();
    assert.equal(preflight.status, 204, "--cors allows the origin, no key needed for preflight");
    assert.equal(preflight.headers.get("access-control-allow-origin"), "http://localhost:3000");
    const page = await fetch(`${open.url}/models`, {
      headers: { origin: "http://localhost:3000" },
    });
    assert.equal(page.status, 403, "without --cors a web page is refused");
    await page.body?.cancel();
  } finally {
    for (const s of [open, locked]) {
      s.child.kill("SIGTERM");
      await s.lines.cancel();
    }
  }
  const [a, b] = await Promise.all([open.child.status, locked.child.status]);
  assert.equal(a.code, 0);
  assert.equal(b.code, 0);
  const openErr = await open.stderr, lockedErr = await locked.stderr;
  assert.match(openErr, /WARNING: no API key/);
  assert.doesNotMatch(lockedErr, /WARNING: no API key/);
  assert.equal(openErr.match(/k3 serve: chatcmpl-/g)?.length, 1, "one log line per request");
  for (const bad of [["--cors", "localhost:3000/app"], ["--model-name", " "]]) {
    const r = await runK3(["serve", dir, ...bad]);
    assert.equal(r.code, 2, r.stderr);
    assert.match(r.stderr, new RegExp(bad[0]));
  }
});
