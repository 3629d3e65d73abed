/**
 * The smaller routes and shapes of `k3 serve`, through the official clients where one exists:
 * /v1/embeddings says there is no embedding model, the model list in Anthropic's shape for
 * Anthropic's clients, /v1/messages/count_tokens, OpenAI's error type names on every OpenAI
 * route, a 404 the ollama client prints, llama.cpp's /tokenize and /detokenize, Anthropic
 * stream usage that agrees between message_start and message_delta, and no empty text block
 * when thinking used all of max_tokens.
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";
import { Ollama } from "ollama/browser";
import { k3Of, postJson, withServer, xtmlIds } from "../support/serve_helpers.ts";

const USER = [{ role: "user" as const, content: "Name three colours." }];

/** The events of a raw SSE body, each checked to be named by its type. */
function sseEvents(raw: string): any[] {
  return raw.trim().split("\n\n").map((block) => {
    const [eventLine, dataLine] = block.split("\n");
    const data = JSON.parse(dataLine.slice("data: ".length));
    assert.equal(eventLine, `event: ${data.type}`);
    return data;
  });
}

Deno.test("serve api: /v1/embeddings says k3 serves no embedding model (OpenAI and Ollama)", async () => {
  await withServer({}, async (s) => {
    await assert.rejects(
      s.openai.embeddings.create({ model: "tiny", input: "hello" }),
      (e: unknown) => {
        assert.ok(e instanceof OpenAI.NotFoundError, String(e));
        assert.equal(e.status, 404);
        assert.equal(e.type, "invalid_request_error");
        assert.equal(e.code, "model_not_found");
        assert.match(e.message, /no embedding model: it serves one chat model/);
        return true;
      },
    );
    const ollama = new Ollama({ host: s.url });
    await assert.rejects(
      ollama.embed({ model: "tiny", input: "hello" }),
      (e: Error & { status_code?: number }) => {
        assert.equal(e.status_code, 404);
        assert.match(e.message, /^k3 serve has no embedding model/);
        return true;
      },
    );
  });
});

Deno.test("serve api: /v1/models in Anthropic's shape for anthropic-version, paged", async () => {
  await withServer({ modelNames: ["tiny", "k3", "third"] }, async (s) => {
    const page = await s.anthropic.models.list({ limit: 2 });
    assert.deepEqual(page.data.map((m) => m.id), ["tiny", "k3"]);
    assert.equal(page.has_more, true);
    assert.equal(page.first_id, "tiny");
    assert.equal(page.last_id, "k3");
    for (const m of page.data) {
      assert.deepEqual(Object.keys(m).sort(), ["created_at", "display_name", "id", "type"]);
      assert.equal(m.type, "model");
      assert.match(m.created_at, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    }
    // The SDK's auto-paging follows after_id to the end.
    const all = [];
    for await (const m of s.anthropic.models.list({ limit: 1 })) all.push(m.id);
    assert.deepEqual(all, ["tiny", "k3", "third"]);
    const before = await s.anthropic.models.list({ before_id: "third", limit: 1 });
    assert.deepEqual(before.data.map((m) => m.id), ["k3"]);
    assert.equal(before.has_more, true);

    const one = await s.anthropic.models.retrieve("k3");
    assert.equal(one.type, "model");
    assert.equal(one.id, "k3");
    assert.equal(one.display_name, "k3");
    await assert.rejects(s.anthropic.models.retrieve("nope"), (e: unknown) => {
      assert.ok(e instanceof Anthropic.NotFoundError, String(e));
      assert.equal((e.error as any).error.type, "not_found_error");
      assert.match(e.message, /nope.* does not exist/);
      return true;
    });
    await assert.rejects(s.anthropic.models.list({ after_id: "nope" }), Anthropic.BadRequestError);

    // Without the header: OpenAI's shape, as before.
    const openai = await s.openai.models.list();
    assert.deepEqual(openai.data.map((m) => [m.object, m.id]), [
      ["model", "tiny"],
      ["model", "k3"],
      ["model", "third"],
    ]);
    assert.equal((await s.openai.models.retrieve("k3")).object, "model");
  });
});

Deno.test("serve api: count_tokens counts what the Messages request prefills", async () => {
  await withServer({}, async (s) => {
    const tools = [{
      name: "get_weather",
      description: "The weather in a city",
      input_schema: { type: "object" as const, properties: { city: { type: "string" } } },
    }];
    const requests = [
      { system: "You are terse.", messages: USER },
      { messages: USER, tools },
      // A forced tool: the prompt ends with the call's opening, which counts too.
      { messages: USER, tools, tool_choice: { type: "tool" as const, name: "get_weather" } },
      { messages: USER, thinking: { type: "disabled" as const } },
    ];
    const counts = [];
    for (const fields of requests) {
      const counted = await s.anthropic.messages.countTokens({ model: "tiny", ...fields });
      assert.deepEqual(Object.keys(counted), ["input_tokens"]);
      const m = await s.anthropic.messages.create({ model: "tiny", max_tokens: 1, ...fields });
      assert.equal(counted.input_tokens, k3Of(m).prompt_ids.length, JSON.stringify(fields));
      assert.equal(
        counted.input_tokens,
        m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0),
      );
      counts.push(counted.input_tokens);
    }
    assert.equal(new Set(counts).size, counts.length, `each prompt differs: ${counts}`);
    // Its errors are the Messages route's.
    await assert.rejects(
      s.anthropic.messages.countTokens({ model: "nope", messages: USER }),
      Anthropic.NotFoundError,
    );
    const r = await postJson(`${s.url}/v1/messages/count_tokens`, {
      model: "tiny",
      messages: USER,
      temperature: 0.5,
    });
    assert.equal(r.status, 400);
    assert.equal(r.body.error.type, "invalid_request_error");
    assert.match(r.body.error.message, /temperature: is not a field/);
  });
});

Deno.test("serve api: count_tokens counts a prompt past the context, which Messages refuses", async () => {
  await withServer({ contextTokens: 64 }, async (s) => {
    const long = [{ role: "user" as const, content: "colour ".repeat(100) }];
    const counted = await s.anthropic.messages.countTokens({ model: "tiny", messages: long });
    assert.ok(counted.input_tokens > 100, String(counted.input_tokens));
    await assert.rejects(
      s.anthropic.messages.create({ model: "tiny", max_tokens: 1, messages: long }),
      (e: unknown) => e instanceof Anthropic.BadRequestError && /context budget/.test(e.message),
    );
  });
});

Deno.test("serve api: OpenAI-shaped errors use OpenAI's type names on every route", async () => {
  await withServer({ apiKey: "sekret", maxBodyBytes: 4096 }, async (s) => {
    const key = { authorization: "Bearer sekret" };
    const cases: [string, string, RequestInit, number][] = [
      ["no key", "/v1/chat/completions", { method: "POST", body: "{}" }, 401],
      ["wrong key", "/v1/models", { headers: { authorization: "Bearer x" } }, 401],
      ["web page", "/v1/models", { headers: { ...key, origin: "http://evil.example" } }, 403],
      ["no route", "/v1/nothing", { headers: key }, 404],
      ["no model", "/v1/models/nope", { headers: key }, 404],
      ["method", "/v1/chat/completions", { headers: key }, 405],
      [
        "too big",
        "/v1/chat/completions",
        { method: "POST", headers: key, body: "x".repeat(5000) },
        413,
      ],
      ["gzip", "/v1/responses", {
        method: "POST",
        headers: { ...key, "content-encoding": "gzip" },
        body: "{}",
      }, 415],
      ["not json", "/v1/completions", { method: "POST", headers: key, body: "{" }, 400],
      ["bad field", "/v1/responses", {
        method: "POST",
        headers: key,
        body: JSON.stringify({ model: "tiny", input: "hi", nonsense: 1 }),
      }, 400],
      ["model", "/v1/chat/completions", {
        method: "POST",
        headers: key,
        body: JSON.stringify({ model: "nope", messages: USER }),
      }, 404],
      ["tokenize", "/tokenize", { method: "POST", body: "{}" }, 401],
    ];
    for (const [what, route, init, status] of cases) {
      const r = await fetch(`${s.url}${route}`, init);
      const body = await r.json();
      assert.equal(r.status, status, `${what}: ${JSON.stringify(body)}`);
      assert.deepEqual(Object.keys(body.error).sort(), ["code", "message", "param", "type"]);
      assert.equal(body.error.type, "invalid_request_error", `${what}: ${JSON.stringify(body)}`);
    }
    // The OpenAI client maps them by status, and sees the type.
    const noKey = new OpenAI({ baseURL: `${s.url}/v1`, apiKey: "wrong", maxRetries: 0 });
    await assert.rejects(noKey.models.list(), (e: unknown) => {
      assert.ok(e instanceof OpenAI.AuthenticationError, String(e));
      assert.equal(e.type, "invalid_request_error");
      assert.equal(e.code, "invalid_api_key");
      return true;
    });
    // Anthropic's routes keep Anthropic's names for the same failures.
    const messages = await fetch(`${s.url}/v1/messages`, { method: "POST", body: "{}" });
    assert.equal((await messages.json()).error.type, "authentication_error");
  });
});

Deno.test("serve api: a 404 under /api/ is a message the ollama client prints", async () => {
  await withServer({}, async (s) => {
    const ollama = new Ollama({ host: s.url });
    for (
      const [call, route] of [
        [() => ollama.pull({ model: "tiny" }), "POST /api/pull"],
        [() => ollama.delete({ model: "tiny" }), "DELETE /api/delete"],
        [() => ollama.copy({ source: "tiny", destination: "x" }), "POST /api/copy"],
      ] as const
    ) {
      await assert.rejects(call(), (e: Error & { status_code?: number }) => {
        assert.equal(e.status_code, 404);
        assert.equal(
          e.message,
          `k3 serve has no route ${route}; its /api/ routes are /api/chat, /api/generate, ` +
            "/api/tags, /api/ps, /api/version, /api/show, /api/embed, /api/embeddings",
        );
        return true;
      });
    }
  });
});

Deno.test("serve api: /tokenize and /detokenize as llama.cpp's server has them", async () => {
  await withServer({}, async (s) => {
    const text = "Hello world 😀 €";
    const plain = await postJson(`${s.url}/tokenize`, { content: text });
    assert.equal(plain.status, 200, JSON.stringify(plain.body));
    assert.deepEqual(plain.body, { tokens: s.tokenizer.encode(text) });
    // The same ids with add_special (K3 adds no begin/end token to a text).
    const special = await postJson(`${s.url}/tokenize`, { content: text, add_special: true });
    assert.deepEqual(special.body, plain.body);

    const pieces = await postJson(`${s.url}/tokenize`, { content: text, with_pieces: true });
    const list: { id: number; piece: string | number[] }[] = pieces.body.tokens;
    assert.deepEqual(list.map((t) => t.id), plain.body.tokens);
    const bytes = list.flatMap((t) =>
      typeof t.piece === "string" ? [...new TextEncoder().encode(t.piece)] : t.piece
    );
    assert.equal(new TextDecoder().decode(new Uint8Array(bytes)), text);
    assert.ok(list.some((t) => Array.isArray(t.piece)), "a piece inside a character is bytes");
    assert.ok(list.some((t) => t.piece === "Hel" || t.piece === "H"), JSON.stringify(list));

    // Special tokens' text: one id by default, plain text with parse_special: false.
    const marker = "<|end_of_msg|>";
    const parsed = await postJson(`${s.url}/tokenize`, { content: marker });
    assert.deepEqual(parsed.body.tokens, [s.tokenizer.specialId(marker)]);
    const literal = await postJson(`${s.url}/tokenize`, { content: marker, parse_special: false });
    assert.deepEqual(literal.body.tokens, s.tokenizer.encode(marker));
    assert.ok(literal.body.tokens.length > 1);

    const back = await postJson(`${s.url}/detokenize`, {
      tokens: [...plain.body.tokens, ...parsed.body.tokens],
    });
    assert.deepEqual(back.body, { content: text + marker });

    const refusals: [string, unknown, RegExp][] = [
      ["/tokenize", {}, /content: must be a string/],
      ["/tokenize", { content: "x", with_pieces: "yes" }, /with_pieces: must be true or false/],
      ["/tokenize", { content: "x", stream: true }, /stream: is not a field/],
      ["/detokenize", { tokens: [1, 99999] }, /tokens\[1\]: 99999 is not a token id \(0\.\.1279\)/],
      ["/detokenize", { tokens: "1 2" }, /tokens: must be a list/],
    ];
    for (const [route, body, message] of refusals) {
      const r = await postJson(`${s.url}${route}`, body);
      assert.equal(r.status, 400, JSON.stringify(r.body));
      assert.equal(r.body.error.type, "invalid_request_error");
      assert.match(r.body.error.message, message);
    }
  });
});

Deno.test("serve api: Anthropic stream usage agrees between message_start and message_delta", async () => {
  await withServer({}, async (s) => {
    const request = { model: "tiny", max_tokens: 6, messages: USER };
    const whole = await s.anthropic.messages.create(request);
    const prompt = k3Of(whole).prompt_ids.length;
    // The second and third ask the same: the server resumes from the first's retained state.
    let reused = 0;
    for (let i = 0; i < 2; i++) {
      const raw = await fetch(`${s.url}/v1/messages`, {
        method: "POST",
        body: JSON.stringify({ ...request, stream: true }),
        headers: { "anthropic-version": "2023-06-01" },
      }).then((r) => r.text());
      const events = sseEvents(raw);
      const start = events[0].message.usage;
      const end = events.at(-2).usage;
      assert.equal(events[0].type, "message_start");
      assert.equal(events.at(-2).type, "message_delta");
      for (
        const key of ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"]
      ) {
        assert.equal(end[key], start[key], `${key}: ${JSON.stringify([start, end])}`);
      }
      assert.equal(start.input_tokens + start.cache_read_input_tokens, prompt);
      assert.equal(start.output_tokens, 0);
      assert.equal(end.output_tokens, whole.usage.output_tokens);
      reused = Math.max(reused, start.cache_read_input_tokens);
    }
    assert.ok(reused > 0, "a retained state was reused, so the split is tested");
    // The SDK's accumulated message carries the same usage.
    const final = await s.anthropic.messages.stream(request).finalMessage();
    assert.equal(final.usage.input_tokens + (final.usage.cache_read_input_tokens ?? 0), prompt);
    assert.equal(final.usage.output_tokens, whole.usage.output_tokens);
  });
});

Deno.test("serve api: thinking that used all of max_tokens comes without an empty text block", async () => {
  const thinking = await xtmlIds("Let me think about colours for a long while before answering.");
  await withServer({ script: [thinking] }, async (s) => {
    const request = { model: "tiny", max_tokens: 4, messages: USER };
    const whole = await s.anthropic.messages.create(request);
    assert.equal(whole.stop_reason, "max_tokens");
    assert.deepEqual(whole.content.map((b) => b.type), ["thinking"]);
    assert.ok((whole.content[0] as Anthropic.ThinkingBlock).thinking.length > 0);
    assert.equal(whole.usage.output_tokens, 4);

    const streamed = await s.anthropic.messages.stream(request).finalMessage();
    assert.deepEqual(streamed.content.map((b) => b.type), ["thinking"]);
    assert.equal(streamed.stop_reason, "max_tokens");
    const raw = await fetch(`${s.url}/v1/messages`, {
      method: "POST",
      body: JSON.stringify({ ...request, stream: true }),
    }).then((r) => r.text());
    const starts = sseEvents(raw).filter((e) => e.type === "content_block_start");
    assert.deepEqual(starts.map((e) => e.content_block.type), ["thinking"]);
  });
});
