/**
 * Structured output through `k3 serve` on the tiny model (random weights: only constrained
 * decoding can make its answer valid): the openai client's `chat.completions.parse()` with a
 * Zod schema, json_object, Responses `text.format`, a streamed answer, and the 400s for a
 * schema the engine cannot enforce (with a healthy request after).
 */
import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { xgrammarRequested } from "../../lib/text/grammar.ts";
import { postJson, withServer } from "../support/serve_helpers.ts";

const USER = [{ role: "user" as const, content: "Describe a colour as JSON." }];

const Answer = z.object({
  color: z.enum(["red", "green", "blue"]),
  shade: z.number().int().min(0).max(9),
  tags: z.array(z.enum(["warm", "cool"])).max(2),
});

Deno.test("serve grammar: openai chat.completions.parse() with a Zod schema returns a parsed object", async () => {
  await withServer({}, async (s) => {
    // A request without a grammar does not load the engine (when nothing before did).
    const before = xgrammarRequested();
    await s.openai.chat.completions.create({ model: "tiny", messages: USER, max_tokens: 2 });
    assert.equal(xgrammarRequested(), before);
    for (const seed of [1, 2, 3]) {
      const r = await s.openai.chat.completions.parse(
        {
          model: "tiny",
          messages: USER,
          response_format: zodResponseFormat(Answer, "answer"),
          max_completion_tokens: 60,
          temperature: 1,
          seed,
          reasoning_effort: "none",
        } as Parameters<typeof s.openai.chat.completions.parse>[0],
      );
      const parsed = r.choices[0].message.parsed as z.infer<typeof Answer> | null;
      assert.ok(parsed, JSON.stringify(r.choices[0]));
      assert.deepEqual(Answer.parse(parsed), parsed);
      assert.equal(r.choices[0].finish_reason, "stop");
    }
  });
});

Deno.test("serve grammar: json_object, a streamed strict schema, and Responses text.format", async () => {
  await withServer({}, async (s) => {
    const url = `${s.url}/v1/chat/completions`;
    const base = { model: "tiny", messages: USER, max_tokens: 40, reasoning_effort: "none" };
    const obj = await postJson(url, {
      ...base,
      temperature: 1,
      seed: 4,
      response_format: { type: "json_object" },
    });
    assert.equal(obj.status, 200, JSON.stringify(obj.body));
    const content = obj.body.choices[0].message.content;
    if (obj.body.choices[0].finish_reason === "stop") {
      const value = JSON.parse(content);
      assert.ok(value !== null && typeof value === "object" && !Array.isArray(value));
    } else assert.equal(content[0], "{");

    const schema = {
      type: "object",
      properties: { n: { type: "integer", minimum: 10, maximum: 20 } },
      required: ["n"],
      additionalProperties: false,
    };
    const validate = new Ajv().compile(schema);
    const stream = await s.openai.chat.completions.create(
      {
        ...base,
        messages: USER,
        stream: true,
        response_format: { type: "json_schema", json_schema: { name: "n", schema, strict: true } },
      } as unknown as Parameters<typeof s.openai.chat.completions.create>[0],
    ) as unknown as AsyncIterable<
      { choices: { delta: { content?: string } }[] }
    >;
    let streamed = "";
    for await (const chunk of stream) streamed += chunk.choices[0]?.delta.content ?? "";
    assert.ok(validate(JSON.parse(streamed)), streamed);

    const resp = await s.openai.responses.create(
      {
        model: "tiny",
        input: "A number, please.",
        max_output_tokens: 40,
        reasoning: { effort: "none" },
        temperature: 1,
        text: { format: { type: "json_schema", name: "n", schema, strict: true } },
      } as Parameters<typeof s.openai.responses.create>[0],
    ) as { output_text: string };
    assert.ok(validate(JSON.parse(resp.output_text)), resp.output_text);
  });
});

Deno.test("serve grammar: an unenforceable schema is a 400 naming the keyword, then a healthy request", async () => {
  await withServer({}, async (s) => {
    const url = `${s.url}/v1/chat/completions`;
    const bad = await postJson(url, {
      model: "tiny",
      messages: USER,
      max_tokens: 4,
      response_format: {
        type: "json_schema",
        json_schema: {
          name: "x",
          strict: true,
          schema: { type: "object", properties: { a: { type: "string", not: { const: "" } } } },
        },
      },
    });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.type, "invalid_request_error");
    assert.equal(bad.body.error.param, "response_format.json_schema.schema");
    assert.match(bad.body.error.message, /"not" is not supported/);
    assert.match(bad.body.error.message, /properties\.a/);
    const grammarError = await postJson(url, {
      model: "tiny",
      messages: USER,
      max_tokens: 4,
      response_format: {
        type: "json_schema",
        json_schema: { name: "x", strict: true, schema: { type: "string", pattern: "([a-" } },
      },
    });
    assert.equal(grammarError.status, 400, JSON.stringify(grammarError.body));
    assert.equal(grammarError.body.error.param, "response_format.json_schema.schema");
    const ok = await postJson(url, {
      model: "tiny",
      messages: USER,
      max_tokens: 30,
      reasoning_effort: "none",
      response_format: { type: "json_object" },
    });
    assert.equal(ok.status, 200);
    assert.equal(ok.body.choices[0].message.content[0], "{");
  });
});
