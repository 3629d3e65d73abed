/**
 * Ollama's `format` through the `ollama` client library on the tiny model (random weights:
 * only constrained decoding can make its answer valid): a JSON schema held token by token in
 * chat and generate, whole and streamed, for several seeds at temperature 1; "json" gives a
 * JSON object; the think channel stays free; a schema the engine cannot enforce and any other
 * format are 400s in Ollama's error shape.
 */
import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { Ollama } from "ollama/browser";
import { postJson, withServer } from "../support/serve_helpers.ts";

const PROMPT = "Describe a colour as JSON.";
const MESSAGES = [{ role: "user", content: PROMPT }];

const SCHEMA = {
  type: "object",
  properties: {
    color: { type: "string", enum: ["red", "green", "blue"] },
    shade: { type: "integer", minimum: 0, maximum: 9 },
    warm: { type: "boolean" },
  },
  required: ["color", "shade", "warm"],
  additionalProperties: false,
};
const validate = new Ajv().compile(SCHEMA);

function assertValid(text: string | undefined, context: string): void {
  let value: unknown;
  try {
    value = JSON.parse(text ?? "");
  } catch {
    assert.fail(`${context}: not JSON: ${JSON.stringify(text)}`);
  }
  assert.ok(validate(value), `${context}: ${text} ${JSON.stringify(validate.errors)}`);
}

function options(seed: number) {
  return { temperature: 1, seed, num_predict: 60 };
}

Deno.test("serve ollama format: a schema holds chat and generate, whole and streamed", async () => {
  await withServer({}, async (s) => {
    const ollama = new Ollama({ host: s.url });
    const common = { model: "tiny", format: SCHEMA, think: false } as const;
    const answers = new Set<string>();
    for (const seed of [1, 2, 3]) {
      const chat = await ollama.chat({ ...common, messages: MESSAGES, options: options(seed) });
      assertValid(chat.message.content, `chat seed ${seed}`);
      assert.equal(chat.done_reason, "stop");
      answers.add(chat.message.content);

      const parts = await ollama.chat({
        ...common,
        messages: MESSAGES,
        options: options(seed),
        stream: true,
      });
      let streamed = "";
      for await (const part of parts) streamed += part.message.content;
      // The same seed streamed is the same answer.
      assert.equal(streamed, chat.message.content);

      const gen = await ollama.generate({ ...common, prompt: PROMPT, options: options(seed) });
      assertValid(gen.response, `generate seed ${seed}`);
      const pieces = await ollama.generate({
        ...common,
        prompt: PROMPT,
        options: options(seed),
        stream: true,
      });
      let text = "";
      for await (const piece of pieces) text += piece.response;
      assert.equal(text, gen.response);
    }
    // The seeds are honoured: random weights answer differently, each within the schema.
    assert.ok(answers.size > 1, [...answers].join(" | "));

    // A raw prompt (no template) is held by the grammar alone.
    const raw = await ollama.generate({
      model: "tiny",
      prompt: "Once upon a time",
      raw: true,
      format: SCHEMA,
      options: options(5),
    });
    assertValid(raw.response, "raw generate");

    // "json": any JSON object.
    for (const seed of [1, 2]) {
      const json = await ollama.chat({
        model: "tiny",
        messages: MESSAGES,
        format: "json",
        think: false,
        options: { ...options(seed), num_predict: 40 },
      });
      if (json.done_reason === "stop") {
        const value = JSON.parse(json.message.content);
        assert.ok(value !== null && typeof value === "object" && !Array.isArray(value));
      } else assert.equal(json.message.content[0], "{", json.message.content);
    }
  });
});

Deno.test("serve ollama format: the think channel is written freely", async () => {
  // The grammar starts after the think channel: until then the same seed samples the same
  // thinking as a request whose schema is only shown to the model (OpenAI's json_schema that
  // is not strict renders the same prompt).
  await withServer({}, async (s) => {
    const ollama = new Ollama({ host: s.url });
    const sampling = { temperature: 1, seed: 9 };
    const shown = await postJson(`${s.url}/v1/chat/completions`, {
      model: "tiny",
      messages: MESSAGES,
      ...sampling,
      max_tokens: 24,
      response_format: {
        type: "json_schema",
        json_schema: { name: "format", schema: SCHEMA, strict: false },
      },
    });
    assert.equal(shown.status, 200, JSON.stringify(shown.body));
    const thinking = shown.body.choices[0].message.reasoning_content;
    assert.ok(thinking.length > 0, JSON.stringify(shown.body));
    const options = { ...sampling, num_predict: 24 };
    const chat = await ollama.chat({ model: "tiny", messages: MESSAGES, format: SCHEMA, options });
    assert.equal(chat.message.thinking, thinking);
    assert.equal(chat.eval_count, shown.body.usage.completion_tokens);
    const gen = await ollama.generate({ model: "tiny", prompt: PROMPT, format: SCHEMA, options });
    assert.equal(gen.thinking, thinking);
  });
});

Deno.test("serve ollama format: a bad schema or format is a 400 in Ollama's error shape", async () => {
  await withServer({}, async (s) => {
    const notSchema = { type: "object", properties: { a: { type: "string", not: { const: "" } } } };
    const cases: [string, unknown, RegExp][] = [
      ["chat", notSchema, /^format: .*"not" is not supported/],
      ["generate", notSchema, /^format: .*properties\.a/],
      ["chat", { type: "string", pattern: "([a-" }, /^format: /],
      ["chat", "yaml", /^format: must be "json" or a JSON schema object/],
      ["generate", 42, /^format: must be "json" or a JSON schema object/],
      ["generate", ["json"], /^format: must be "json" or a JSON schema object/],
    ];
    for (const [route, format, message] of cases) {
      const body = route === "chat"
        ? { model: "tiny", messages: MESSAGES, stream: false, format }
        : { model: "tiny", prompt: PROMPT, stream: false, format };
      const r = await postJson(`${s.url}/api/${route}`, body);
      assert.equal(r.status, 400, JSON.stringify([format, r.body]));
      assert.deepEqual(Object.keys(r.body), ["error"], JSON.stringify(r.body));
      assert.match(r.body.error, message);
    }
    // Streamed too: the refusal comes before any line is written, and the client says why.
    await assert.rejects(
      new Ollama({ host: s.url }).chat({
        model: "tiny",
        messages: MESSAGES,
        format: notSchema,
        stream: true,
      }),
      (e: Error & { status_code?: number }) => {
        assert.equal(e.status_code, 400);
        assert.match(e.message, /"not" is not supported/);
        return true;
      },
    );
    // Ollama's clients send "" for no format; the server is healthy after the refusals.
    const plain = await postJson(`${s.url}/api/chat`, {
      model: "tiny",
      messages: MESSAGES,
      stream: false,
      format: "",
      think: false,
      options: { num_predict: 3 },
    });
    assert.equal(plain.status, 200, JSON.stringify(plain.body));
    assert.equal(plain.body.eval_count, 3);
  });
});
