/**
 * Nothing is silently ignored: every field that would change the answer and is not supported
 * is a 400 naming it, informational fields are accepted, and client mistakes that used to be
 * 500s (bad tool_calls, schemas nested 10,000 deep, /v1/models/%ZZ) are 400s; after each, the
 * server keeps serving. Also: model names, x-api-key, and CORS (preflight and origins).
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { postJson, type Served, withServer } from "../support/serve_helpers.ts";

const USER = [{ role: "user", content: "hi" }];

/** A chat request that must succeed (the server is still healthy). */
async function healthy(s: Served, after: string): Promise<void> {
  const r = await s.openai.chat.completions.create({
    model: "tiny",
    messages: [{ role: "user", content: "ok?" }],
    max_tokens: 2,
  });
  assert.equal(r.choices[0].message.role, "assistant", `healthy after ${after}`);
}

/** Deeply nested JSON, as text (JSON.stringify would recurse). */
function nested(depth: number): string {
  return '{"type":"object","properties":{"a":'.repeat(depth) + "{}" + "}}".repeat(depth);
}

Deno.test("serve: each unsupported field is a 400 naming it; the server keeps serving", async () => {
  await withServer({}, async (s) => {
    const cases: [string, Record<string, unknown>, string][] = [
      ["chat/completions", { echo: true }, "echo"],
      ["chat/completions", { n: 17 }, "n"],
      ["completions", { n: 0 }, "n"],
      ["chat/completions", { best_of: 2 }, "best_of"],
      ["chat/completions", { suffix: "x" }, "suffix"],
      ["chat/completions", { store: true }, "store"],
      ["chat/completions", { audio: { voice: "alloy", format: "mp3" } }, "audio"],
      ["chat/completions", { modalities: ["text", "audio"] }, "modalities"],
      ["chat/completions", { prediction: { type: "content", content: "x" } }, "prediction"],
      ["chat/completions", { functions: [{ name: "f" }] }, "functions"],
      ["chat/completions", { function_call: "auto" }, "function_call"],
      ["chat/completions", { web_search_options: {} }, "web_search_options"],
      ["chat/completions", { verbosity: "low" }, "verbosity"],
      ["chat/completions", { frobnicate: 1 }, "frobnicate"],
      [
        "chat/completions",
        { stream_options: { include_usage: true, x: 1 }, stream: true },
        "stream_options.x",
      ],
      [
        "chat/completions",
        { chat_template_kwargs: { thinking_budget: 5 } },
        "chat_template_kwargs.thinking_budget",
      ],
      ["chat/completions", { tools: [{ type: "custom", custom: { name: "x" } }] }, "tools[0].type"],
      [
        "chat/completions",
        {
          tools: [{
            type: "function",
            function: { name: "f", strict: true, parameters: { type: "object", not: {} } },
          }],
        },
        "tools[0].function.parameters",
      ],
      [
        "chat/completions",
        {
          tools: [{ type: "function", function: { name: "f" } }],
          tool_choice: { type: "allowed_tools" },
        },
        "tool_choice",
      ],
      [
        "chat/completions",
        {
          tools: [{ type: "function", function: { name: "f" } }],
          tool_choice: { type: "function", function: { name: "g" } },
        },
        "tool_choice.function.name",
      ],
      [
        "chat/completions",
        { tools: [{ type: "function", function: { name: "f", strict: "no" } }] },
        "tools[0].function.strict",
      ],
      ["chat/completions", { tool_choice: "required" }, "tool_choice"],
      [
        "chat/completions",
        {
          response_format: {
            type: "json_schema",
            json_schema: { name: "x", schema: { type: "string", not: {} }, strict: true },
          },
        },
        "response_format.json_schema.schema",
      ],
      [
        "chat/completions",
        { response_format: { type: "json_schema", json_schema: { name: 5, schema: {} } } },
        "response_format.json_schema.name",
      ],
      ["chat/completions", { top_logprobs: 3 }, "top_logprobs"],
      ["chat/completions", { logit_bias: { "99999999": 1 } }, "logit_bias"],
      ["chat/completions", { logit_bias: { "5": 500 } }, "logit_bias.5"],
      ["chat/completions", { presence_penalty: 3 }, "presence_penalty"],
      ["chat/completions", { repetition_penalty: 0 }, "repetition_penalty"],
      ["completions", { echo: true }, "echo"],
      ["completions", { suffix: "x" }, "suffix"],
      ["completions", { best_of: 3 }, "best_of"],
      ["completions", { logprobs: 6 }, "logprobs"],
      ["completions", { messages: USER }, "messages"],
    ];
    for (const [path, extra, param] of cases) {
      const base = path === "completions" ? { prompt: "hi" } : { messages: USER };
      const r = await postJson(`${s.url}/v1/${path}`, { model: "tiny", ...base, ...extra });
      assert.equal(r.status, 400, `${path} ${JSON.stringify(extra)}: ${JSON.stringify(r.body)}`);
      assert.equal(r.body.error.param, param, JSON.stringify(r.body));
      assert.ok(r.body.error.message.startsWith(`${param}:`), r.body.error.message);
    }
    await healthy(s, "the refused fields");
    // Informational fields are accepted.
    const ok = await postJson(`${s.url}/v1/chat/completions`, {
      model: "tiny",
      messages: USER,
      max_tokens: 1,
      user: "u1",
      metadata: { run: "test" },
      store: false,
      service_tier: "auto",
      prompt_cache_key: "k",
      safety_identifier: "x",
      parallel_tool_calls: true,
      modalities: ["text"],
      verbosity: "medium",
    });
    assert.equal(ok.status, 200, JSON.stringify(ok.body));
  });
});

Deno.test("serve: bad tool_calls, schemas nested 10,000 deep and /v1/models/%ZZ are 400s, not 500s", async () => {
  await withServer({}, async (s) => {
    const url = `${s.url}/v1/chat/completions`;
    const badCalls: [unknown, RegExp][] = [
      ["abc", /messages\[1\]\.tool_calls: must be a list/],
      [[null], /messages\[1\]\.tool_calls\[0\]: must be an object/],
      [[{ function: 5 }], /tool_calls\[0\]\.function: must be an object/],
      [[{ function: { name: "" } }], /function\.name: must be a non-empty string/],
      [[{ function: { name: "f", arguments: 7 } }], /function\.arguments: must be a JSON string/],
      [[{ type: "web", function: { name: "f" } }], /tool_calls\[0\]\.type/],
      [[{ function: { name: "f", arguments: "[1, 2]" } }], /must encode a JSON object/],
    ];
    for (const [calls, says] of badCalls) {
      const r = await postJson(url, {
        model: "tiny",
        messages: [...USER, { role: "assistant", content: "", tool_calls: calls }],
      });
      assert.equal(r.status, 400, JSON.stringify(calls));
      assert.match(r.body.error.message, says);
      await healthy(s, `tool_calls ${JSON.stringify(calls)}`);
    }
    const deep = `{"model":"tiny","messages":[{"role":"user","content":"hi"}],` +
      `"tools":[{"type":"function","function":{"name":"f","parameters":${nested(10_000)}}}]}`;
    const r = await postJson(url, deep);
    assert.equal(r.status, 400);
    assert.match(r.body.error.message, /deeper than 128 levels/);
    await healthy(s, "a schema nested 10,000 deep");
    // The same depth in every API, and in a message's content.
    for (const path of ["responses", "messages"]) {
      const body = path === "responses"
        ? `{"model":"tiny","input":"hi","tools":[{"type":"function","name":"f","parameters":${
          nested(10_000)
        }}]}`
        : `{"model":"tiny","max_tokens":5,"messages":[{"role":"user","content":"hi"}],` +
          `"tools":[{"name":"f","input_schema":${nested(10_000)}}]}`;
      const d = await postJson(`${s.url}/v1/${path}`, body);
      assert.equal(d.status, 400, path);
      await healthy(s, `deep ${path}`);
    }
    for (const id of ["%ZZ", "%E0%A4%A", "%"]) {
      const m = await fetch(`${s.url}/v1/models/${id}`);
      assert.equal(m.status, 400, id);
      assert.match((await m.json()).error.message, /not valid percent-encoding/);
      await healthy(s, `/v1/models/${id}`);
    }
    assert.ok(!s.logs.some((l) => / 500 /.test(l)), s.logs.join("\n"));
  });
});

Deno.test("serve: model names, x-api-key, and one error shape per API", async () => {
  await withServer({ modelNames: ["kimi-k3", "tiny-dir"], apiKey: "sekret" }, async (s) => {
    const models = await s.openai.models.list();
    assert.deepEqual(models.data.map((m) => m.id), ["kimi-k3", "tiny-dir"]);
    for (const name of ["kimi-k3", "tiny-dir"]) {
      const r = await s.openai.chat.completions.create({
        model: name,
        messages: [{ role: "user", content: "x" }],
        max_tokens: 1,
      });
      assert.equal(r.model, name, "the answer carries the name the request used");
    }
    await assert.rejects(
      s.openai.chat.completions.create({
        model: "gpt-9",
        messages: [{ role: "user", content: "x" }],
      }),
      (e) => e instanceof OpenAI.NotFoundError && /kimi-k3/.test(e.message),
    );
    // x-api-key works on the OpenAI routes too; the Anthropic client sends it.
    const viaHeader = await postJson(`${s.url}/v1/chat/completions`, {
      model: "kimi-k3",
      messages: USER,
      max_tokens: 1,
    }, { "x-api-key": "sekret" });
    assert.equal(viaHeader.status, 200);
    const msg = await s.anthropic.messages.create({
      model: "kimi-k3",
      max_tokens: 1,
      messages: [{ role: "user", content: "x" }],
    });
    assert.equal(msg.type, "message");
    // Anthropic errors: {"type": "error", "error": {"type", "message"}} with its statuses.
    const wrong = new Anthropic({ baseURL: s.url, apiKey: "guess", maxRetries: 0 });
    await assert.rejects(
      wrong.messages.create({
        model: "kimi-k3",
        max_tokens: 1,
        messages: [{ role: "user", content: "x" }],
      }),
      (e) => e instanceof Anthropic.AuthenticationError && e.status === 401,
    );
    const shapes: [Record<string, unknown>, number, string][] = [
      [
        { model: "kimi-k3", messages: [{ role: "user", content: "x" }] },
        400,
        "invalid_request_error",
      ],
      [
        { model: "nope", max_tokens: 1, messages: [{ role: "user", content: "x" }] },
        404,
        "not_found_error",
      ],
    ];
    for (const [body, status, type] of shapes) {
      const r = await postJson(`${s.url}/v1/messages`, body, { "x-api-key": "sekret" });
      assert.equal(r.status, status);
      assert.deepEqual(Object.keys(r.body).sort(), ["error", "type"]);
      assert.equal(r.body.type, "error");
      assert.equal(r.body.error.type, type);
      assert.equal(typeof r.body.error.message, "string");
    }
    const unauth = await postJson(`${s.url}/v1/messages`, {});
    assert.deepEqual(unauth.body.error.type, "authentication_error");
  });
});

Deno.test("serve: CORS: OPTIONS preflight and headers for allowed origins; other pages refused", async () => {
  const allowed = "http://localhost:3000";
  await withServer({ corsOrigins: [allowed] }, async (s) => {
    const pre = await fetch(`${s.url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: {
        origin: allowed,
        "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type, x-stainless-os",
      },
    });
    await pre.body?.cancel();
    assert.equal(pre.status, 204);
    assert.equal(pre.headers.get("access-control-allow-origin"), allowed);
    assert.match(pre.headers.get("access-control-allow-methods")!, /POST/);
    assert.equal(
      pre.headers.get("access-control-allow-headers"),
      "authorization, content-type, x-stainless-os",
    );
    assert.ok(Number(pre.headers.get("access-control-max-age")) > 0);
    for (const path of ["chat/completions", "messages"]) {
      const body = path === "messages"
        ? { model: "tiny", max_tokens: 1, messages: USER }
        : { model: "tiny", max_tokens: 1, messages: USER };
      const r = await postJson(`${s.url}/v1/${path}`, body, { origin: allowed });
      assert.equal(r.status, 200);
      assert.equal(r.headers.get("access-control-allow-origin"), allowed);
      assert.equal(r.headers.get("vary"), "Origin");
    }
    const streamed = await fetch(`${s.url}/v1/chat/completions`, {
      method: "POST",
      headers: { origin: allowed },
      body: JSON.stringify({ model: "tiny", max_tokens: 1, messages: USER, stream: true }),
    });
    assert.equal(streamed.headers.get("access-control-allow-origin"), allowed);
    await streamed.text();
    const error = await postJson(`${s.url}/v1/chat/completions`, { messages: [] }, {
      origin: allowed,
    });
    assert.equal(error.status, 400);
    assert.equal(
      error.headers.get("access-control-allow-origin"),
      allowed,
      "errors are readable too",
    );
    const other = await postJson(
      `${s.url}/v1/chat/completions`,
      { model: "tiny", messages: USER },
      {
        origin: "https://evil.example",
      },
    );
    assert.equal(other.status, 403);
    assert.equal(other.headers.get("access-control-allow-origin"), null);
  });
  // Without --cors, a web page's request (it carries Origin) is refused; others are served.
  await withServer({}, async (s) => {
    const page = await postJson(`${s.url}/v1/chat/completions`, {
      model: "tiny",
      messages: USER,
      max_tokens: 1,
    }, {
      origin: "http://localhost:3000",
    });
    assert.equal(page.status, 403);
    assert.match(page.body.error.message, /--cors http:\/\/localhost:3000/);
    const pre = await fetch(`${s.url}/v1/chat/completions`, {
      method: "OPTIONS",
      headers: { origin: "http://localhost:3000", "access-control-request-method": "POST" },
    });
    await pre.body?.cancel();
    assert.equal(pre.status, 403);
    await healthy(s, "refused origins");
  });
});

Deno.test("serve: stream_options flags of the wrong type are a 400 naming the field", async () => {
  await withServer({}, async (s) => {
    const cases: [string, Record<string, unknown>, string][] = [
      ["chat/completions", { include_usage: "x" }, "stream_options.include_usage"],
      ["chat/completions", { include_usage: 1 }, "stream_options.include_usage"],
      ["chat/completions", { include_obfuscation: "no" }, "stream_options.include_obfuscation"],
      ["completions", { include_usage: "x" }, "stream_options.include_usage"],
      ["responses", { include_obfuscation: "x" }, "stream_options.include_obfuscation"],
    ];
    for (const [route, streamOptions, param] of cases) {
      const body = route === "responses"
        ? { input: "hi", max_output_tokens: 2 }
        : route === "completions"
        ? { prompt: "hi", max_tokens: 2 }
        : { messages: USER, max_tokens: 2 };
      const r = await postJson(`${s.url}/v1/${route}`, {
        model: "tiny",
        ...body,
        stream: true,
        stream_options: streamOptions,
      });
      assert.equal(r.status, 400, `${route} ${JSON.stringify(streamOptions)}: ${r.body}`);
      assert.equal(r.body.error.param, param);
      assert.match(r.body.error.message, new RegExp(`^${param}: must be true or false`));
    }
    // true and false are still taken: usage comes in the last chunk only when asked for.
    for (const includeUsage of [true, false]) {
      const r = await postJson(`${s.url}/v1/chat/completions`, {
        model: "tiny",
        messages: USER,
        max_tokens: 2,
        stream: true,
        stream_options: { include_usage: includeUsage },
      });
      assert.equal(r.status, 200);
      assert.equal(/"usage":\{/.test(r.body), includeUsage);
    }
  });
});

/** gzip of `text`. */
async function gzip(text: string): Promise<ArrayBuffer> {
  const stream = new Blob([text]).stream().pipeThrough(new CompressionStream("gzip"));
  return await new Response(stream).arrayBuffer();
}

Deno.test("serve: a body with a Content-Encoding k3 does not decode is a 415 in each API's error shape", async () => {
  await withServer({}, async (s) => {
    const bodies: [string, Record<string, unknown>][] = [
      ["chat/completions", { messages: USER, max_tokens: 2 }],
      ["completions", { prompt: "hi", max_tokens: 2 }],
      ["responses", { input: "hi", max_output_tokens: 2 }],
      ["messages", { messages: USER, max_tokens: 2 }],
    ];
    for (const [route, fields] of bodies) {
      const text = JSON.stringify({ model: "tiny", ...fields });
      // Compressed, and (worse: it would parse) plain JSON that claims an encoding.
      for (const [encoding, body] of [["gzip", await gzip(text)], ["br", text]] as const) {
        const r = await fetch(`${s.url}/v1/${route}`, {
          method: "POST",
          body,
          headers: { "content-type": "application/json", "content-encoding": encoding },
        });
        const answer = await r.json();
        assert.equal(r.status, 415, `${route} ${encoding}: ${JSON.stringify(answer)}`);
        const error = answer.error;
        assert.match(error.message, new RegExp(`Content-Encoding: ${encoding}; k3 reads only`));
        if (route === "messages") {
          assert.equal(answer.type, "error");
          assert.equal(error.type, "invalid_request_error");
        } else {
          assert.equal(error.type, "invalid_request_error");
          assert.equal(error.code, "unsupported_content_encoding");
        }
      }
      // identity is no encoding at all.
      const plain = await postJson(`${s.url}/v1/${route}`, text, {
        "content-encoding": "identity",
      });
      assert.equal(plain.status, 200, `${route} identity: ${JSON.stringify(plain.body)}`);
    }
    await healthy(s, "encoded bodies");
  });
});

Deno.test("serve: an 8 MiB prompt over the context is refused by a bound before it is encoded; /health answers meanwhile", async () => {
  await withServer({ maxBodyBytes: 16 << 20 }, async (s) => {
    const words = ["hello", "world", "über", "k3", "tokens", "12345", "the", "quick"];
    const parts: string[] = [];
    for (let i = 0, n = 0; n < 8 << 20; i++) {
      parts.push(words[(i * 7) % words.length], i % 13 ? " " : "\n");
      n += words[(i * 7) % words.length].length + 1;
    }
    const prompt = parts.join("");
    // /health is polled while the big requests are in flight; the slowest answer is kept.
    let slowest = 0, polls = 0, done = false;
    const poller = (async () => {
      while (!done) {
        const t0 = performance.now();
        const r = await fetch(`${s.url}/health`);
        await r.body?.cancel();
        assert.equal(r.status, 200);
        slowest = Math.max(slowest, performance.now() - t0);
        polls++;
        await new Promise((r) => setTimeout(r, 20));
      }
    })();
    const t0 = performance.now();
    const [completion, chat] = await Promise.all([
      postJson(`${s.url}/v1/completions`, { model: "tiny", prompt, max_tokens: 2 }),
      postJson(`${s.url}/v1/chat/completions`, {
        model: "tiny",
        messages: [{ role: "user", content: prompt }],
        max_tokens: 2,
      }),
    ]);
    const seconds = (performance.now() - t0) / 1000;
    done = true;
    await poller;
    console.log(
      `8 MiB prompts refused in ${seconds.toFixed(2)} s; slowest of ${polls} /health: ` +
        `${slowest.toFixed(0)} ms`,
    );
    assert.ok(polls > 0, "/health was asked");
    // Encoding 8 MiB takes tens of seconds here; the bound takes milliseconds (what remains is
    // moving and parsing 16 MiB of JSON, with room for a busy machine).
    assert.ok(seconds < 4, `refused after ${seconds.toFixed(2)} s`);
    assert.ok(slowest < 1500, `/health took ${slowest.toFixed(0)} ms`);
    for (const r of [completion, chat]) {
      assert.equal(r.status, 400, JSON.stringify(r.body).slice(0, 300));
      assert.equal(r.body.error.code, "context_length_exceeded");
      assert.match(
        r.body.error.message,
        /the prompt is at least \d+ tokens but the context budget is 4096 tokens/,
      );
    }
    await healthy(s, "an 8 MiB prompt");
  });
});
