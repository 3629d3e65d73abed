/**
 * The Ollama API through the `ollama` client library: chat and generate (whole and streamed
 * NDJSON) answer exactly what the OpenAI route answers for the same request and sampling,
 * options map onto k3's sampling, tool calls come back in Ollama's shape, the informational
 * routes answer, and refusals use Ollama's error shape.
 */
import assert from "node:assert/strict";
import { Ollama } from "ollama/browser";
import { CLOSE, OPEN, SEP } from "../../lib/text/chat.ts";
import { VERSION } from "../../lib/version.ts";
import { k3Of, postJson, withServer, xtmlIds } from "../support/serve_helpers.ts";

const MESSAGES = [{ role: "user", content: "Name three colours." }];

function client(url: string): Ollama {
  return new Ollama({ host: url });
}

/** The same request through /v1/chat/completions (k3's reference answer). */
async function viaOpenAi(url: string, extra: Record<string, unknown>) {
  const r = await postJson(`${url}/v1/chat/completions`, {
    model: "tiny",
    messages: MESSAGES,
    ...extra,
  });
  assert.equal(r.status, 200, JSON.stringify(r.body));
  return r.body;
}

Deno.test("serve ollama: chat whole and streamed equal the OpenAI route, options mapped", async () => {
  await withServer({}, async (s) => {
    const ollama = client(s.url);
    const options = { temperature: 0.8, seed: 7, top_k: 20, top_p: 0.9, num_predict: 10 };
    const whole = await ollama.chat({ model: "tiny", messages: MESSAGES, options });
    const ref = await viaOpenAi(s.url, {
      temperature: 0.8,
      seed: 7,
      top_k: 20,
      top_p: 0.9,
      max_tokens: 10,
    });
    const refMsg = ref.choices[0].message;
    assert.equal(whole.message.content, refMsg.content);
    assert.equal(whole.message.thinking ?? null, refMsg.reasoning_content || null);
    assert.equal(whole.done, true);
    assert.equal(whole.done_reason, "length");
    assert.equal(whole.eval_count, 10);
    assert.equal(whole.prompt_eval_count, ref.usage.prompt_tokens);
    assert.equal(whole.model, "tiny");
    assert.ok(whole.total_duration > 0);

    const parts = await ollama.chat({ model: "tiny", messages: MESSAGES, options, stream: true });
    let content = "", thinking = "";
    const chunks = [];
    for await (const part of parts) {
      chunks.push(part);
      content += part.message.content;
      thinking += part.message.thinking ?? "";
    }
    assert.ok(chunks.length > 2, "streamed in pieces");
    assert.ok(chunks.slice(0, -1).every((c) => !c.done));
    assert.equal(chunks.at(-1)!.done, true);
    assert.equal(chunks.at(-1)!.done_reason, "length");
    assert.equal(content, whole.message.content);
    assert.equal(thinking, whole.message.thinking ?? "");

    // The options are not ignored: greedy (no options) answers otherwise.
    assert.ok((whole.message.thinking ?? "").length > 0);
    const greedy = await ollama.chat({
      model: "tiny",
      messages: MESSAGES,
      options: { num_predict: 10 },
    });
    assert.notEqual(greedy.message.thinking, whole.message.thinking);
    assert.equal(
      greedy.message.thinking,
      (await viaOpenAi(s.url, { max_tokens: 10 })).choices[0].message.reasoning_content,
    );
    // think: false answers in content; penalties and stops map too.
    const plain = await ollama.chat({
      model: "tiny:latest",
      messages: MESSAGES,
      think: false,
      options: { num_predict: 6, repeat_penalty: 1.5, presence_penalty: 1, stop: ["zzz"] },
    });
    const refPlain = await viaOpenAi(s.url, {
      max_tokens: 6,
      repetition_penalty: 1.5,
      presence_penalty: 1,
      stop: ["zzz"],
      reasoning_effort: "none",
    });
    assert.ok(plain.message.content.length > 0);
    assert.equal(plain.message.thinking, undefined);
    assert.equal(plain.message.content, refPlain.choices[0].message.content);
  });
});

Deno.test("serve ollama: generate whole, streamed and raw", async () => {
  await withServer({}, async (s) => {
    const ollama = client(s.url);
    const whole = await ollama.generate({
      model: "tiny",
      prompt: MESSAGES[0].content,
      options: { num_predict: 8 },
    });
    const ref = await viaOpenAi(s.url, { max_tokens: 8 });
    assert.equal(whole.response, ref.choices[0].message.content);
    assert.equal(whole.thinking ?? null, ref.choices[0].message.reasoning_content || null);
    assert.equal(whole.eval_count, 8);

    const stream = await ollama.generate({
      model: "tiny",
      prompt: MESSAGES[0].content,
      options: { num_predict: 8 },
      stream: true,
    });
    let text = "", last;
    for await (const part of stream) {
      text += part.response;
      last = part;
    }
    assert.equal(text, whole.response);
    assert.equal(last?.done, true);

    // raw: the prompt as it is, like /v1/completions.
    const raw = await ollama.generate({
      model: "tiny",
      prompt: "Once upon a time",
      raw: true,
      options: { num_predict: 6 },
    });
    const completion = await postJson(`${s.url}/v1/completions`, {
      model: "tiny",
      prompt: "Once upon a time",
      max_tokens: 6,
    });
    assert.equal(raw.response, completion.body.choices[0].text);
    assert.equal(raw.eval_count, k3Of(completion.body).completion_ids.length);
  });
});

Deno.test("serve ollama: tags, show, ps, version", async () => {
  await withServer({ modelNames: ["tiny", "k3"] }, async (s) => {
    const ollama = client(s.url);
    const tags = await ollama.list();
    assert.deepEqual(tags.models.map((m) => m.name), ["tiny", "k3"]);
    assert.equal(tags.models[0].details.family, "kimi-k3");
    const show = await ollama.show({ model: "k3:latest" });
    assert.equal(
      (show.model_info as unknown as Record<string, unknown>)["kimi-k3.context_length"],
      4096,
    );
    assert.ok(show.capabilities.includes("tools"));
    const ps = await ollama.ps();
    assert.deepEqual(ps.models.map((m) => m.name), ["tiny", "k3"]);
    assert.deepEqual(await ollama.version(), { version: VERSION });
    await assert.rejects(ollama.show({ model: "nope" }), (e: Error & { status_code?: number }) => {
      assert.equal(e.status_code, 404);
      assert.match(e.message, /"nope" does not exist/);
      return true;
    });
  });
});

Deno.test("serve ollama: a tool call comes back in Ollama's shape, whole and streamed", async () => {
  const answer = await xtmlIds(
    `Need the weather.${CLOSE}think${SEP}${OPEN}response${SEP}${CLOSE}response${SEP}` +
      `${OPEN}tools${SEP}${OPEN}call tool="get_weather" index="1"${SEP}` +
      `${OPEN}argument key="city" type="string"${SEP}Paris${CLOSE}argument${SEP}${CLOSE}call${SEP}` +
      `${CLOSE}tools${SEP}${CLOSE}message${SEP}<|end_of_msg|>`,
  );
  const tools = [{
    type: "function",
    function: {
      name: "get_weather",
      description: "The weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } } },
    },
  }];
  await withServer({ script: [answer] }, async (s) => {
    const ollama = client(s.url);
    const r = await ollama.chat({ model: "tiny", messages: MESSAGES, tools });
    assert.equal(r.message.thinking, "Need the weather.");
    assert.deepEqual(r.message.tool_calls?.map((c) => c.function), [
      { index: 0, name: "get_weather", arguments: { city: "Paris" } },
    ]);
    assert.equal(r.done_reason, "stop");
    // The call sent back as an assistant turn, with the tool's answer, is accepted.
    const stream = await ollama.chat({
      model: "tiny",
      messages: [
        ...MESSAGES,
        r.message,
        { role: "tool", content: '{"sky": "clear"}', tool_name: "get_weather" },
      ],
      tools,
      stream: true,
    });
    const calls = [];
    for await (const part of stream) calls.push(...(part.message.tool_calls ?? []));
    assert.deepEqual(calls.map((c) => c.function.name), ["get_weather"]);
  });
});

Deno.test("serve ollama: refusals in Ollama's error shape", async () => {
  await withServer({}, async (s) => {
    const cases: [string, Record<string, unknown>, number, RegExp][] = [
      ["chat", { options: { mirostat: 2 } }, 400, /options\.mirostat: is not a field/],
      ["chat", { options: { temperature: "hot" } }, 400, /options\.temperature: must be a number/],
      ["chat", { options: { num_predict: 0 } }, 400, /options\.num_predict/],
      ["chat", { format: 42 }, 400, /format: must be "json" or a JSON schema object/],
      ["chat", { think: "sometimes" }, 400, /think: must be one of/],
      ["chat", { model: "nope" }, 404, /"nope" does not exist/],
      ["chat", { messages: [{ role: "user", content: "hi", images: ["AA=="] }] }, 400, /images/],
      ["generate", { prompt: "hi", suffix: "end" }, 400, /suffix: fill-in-the-middle/],
      ["generate", { prompt: "hi", context: [1, 2] }, 400, /context:/],
      ["generate", { prompt: "" }, 400, /prompt: must be a non-empty string/],
    ];
    for (const [route, fields, status, message] of cases) {
      const body = route === "chat"
        ? { model: "tiny", messages: MESSAGES, stream: false, ...fields }
        : { model: "tiny", stream: false, ...fields };
      const r = await postJson(`${s.url}/api/${route}`, body);
      assert.equal(r.status, status, JSON.stringify([fields, r.body]));
      assert.deepEqual(Object.keys(r.body), ["error"], JSON.stringify(r.body));
      assert.match(r.body.error, message);
    }
    // The client library surfaces the message.
    await assert.rejects(
      client(s.url).chat({ model: "tiny", messages: MESSAGES, options: { mirostat: 2 } }),
      /options\.mirostat/,
    );
    // An unknown /api/ path is a 404 in the same shape.
    const missing = await fetch(`${s.url}/api/pull`, { method: "POST", body: "{}" });
    assert.equal(missing.status, 404);
    assert.deepEqual(Object.keys(await missing.json()), ["error"]);
  });
});

Deno.test("serve ollama: the /api/ routes take the server's API key", async () => {
  await withServer({ apiKey: "sekret" }, async (s) => {
    const denied = await fetch(`${s.url}/api/tags`);
    assert.equal(denied.status, 401);
    assert.deepEqual(Object.keys(await denied.json()), ["error"]);
    const ollama = new Ollama({ host: s.url, headers: { authorization: "Bearer sekret" } });
    assert.deepEqual((await ollama.list()).models.map((m) => m.name), ["tiny"]);
  });
});
