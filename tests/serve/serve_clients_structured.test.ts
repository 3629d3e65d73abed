/**
 * Structured output and strict tools through the official clients, each on its default path,
 * against `k3 serve` (a child process) on the tiny model (random weights: only constrained
 * decoding can make the answers parse): the Anthropic SDK's strict tool use (created and streamed), the Vercel AI
 * SDK's `generateObject` with `supportsStructuredOutputs`, and LangChain's
 * `withStructuredOutput` (its default json_schema method and its function-calling method).
 */
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { createOpenAICompatible } from "@ai-sdk/openai-compatible";
import { ChatOpenAI } from "@langchain/openai";
import { generateObject } from "ai";
import { z } from "zod";
import { MODEL_SEED } from "../support/serve_helpers.ts";
import { tinyModel } from "../support/helpers.ts";
import { startServe } from "../support/serve_child.ts";

/**
 * Runs `fn` against `k3 serve` on the tiny model in a child process (its base URL, without
 * /v1), then stops it with SIGTERM and checks that it exited 0.
 */
async function withK3Serve(fn: (url: string) => Promise<void>): Promise<void> {
  const dir = await tinyModel({ seed: MODEL_SEED });
  const { child, url, stderr } = await startServe([
    dir,
    "--threads",
    "1",
    "--context",
    "2048",
    "--model-name",
    "tiny",
  ]);
  try {
    await fn(url);
  } finally {
    child.kill("SIGTERM");
  }
  const status = await child.status;
  assert.equal(status.code, 0, await stderr);
}

const Weather = z.object({
  city: z.enum(["paris", "oslo", "lima"]),
  days: z.number().int().min(1).max(7),
  windy: z.boolean(),
});

const WEATHER_SCHEMA: Anthropic.Tool.InputSchema = {
  type: "object",
  properties: {
    city: { type: "string", enum: ["paris", "oslo", "lima"] },
    days: { type: "integer", minimum: 1, maximum: 7 },
    windy: { type: "boolean" },
  },
  required: ["city", "days", "windy"],
  additionalProperties: false,
};

Deno.test("clients: @anthropic-ai/sdk strict tool use returns a parsed tool input", async () => {
  await withK3Serve(async (url) => {
    const anthropic = new Anthropic({ baseURL: url, apiKey: "none", maxRetries: 0 });
    const params = {
      model: "tiny",
      max_tokens: 160,
      temperature: 1,
      thinking: { type: "disabled" as const },
      messages: [{ role: "user" as const, content: "What is the weather?" }],
      tools: [{ name: "get_weather", input_schema: WEATHER_SCHEMA, strict: true }],
      tool_choice: { type: "tool" as const, name: "get_weather" },
    };
    const created = await anthropic.messages.create(params);
    const use = created.content.find((b) => b.type === "tool_use");
    assert.ok(use && use.type === "tool_use", JSON.stringify(created.content));
    assert.equal(use.name, "get_weather");
    assert.deepEqual(Weather.parse(use.input), use.input);
    assert.equal(created.stop_reason, "tool_use");

    // Streamed: the SDK assembles the input from input_json_delta events and parses it.
    const stream = anthropic.messages.stream({ ...params, tool_choice: { type: "any" } });
    const final = await stream.finalMessage();
    const streamed = final.content.find((b) => b.type === "tool_use");
    assert.ok(streamed && streamed.type === "tool_use", JSON.stringify(final.content));
    assert.deepEqual(Weather.parse(streamed.input), streamed.input);
  });
});

// generateObject still works in this SDK version but logs a deprecation on every call.
(globalThis as { AI_SDK_LOG_WARNINGS?: boolean }).AI_SDK_LOG_WARNINGS = false;

Deno.test("clients: Vercel AI SDK generateObject with supportsStructuredOutputs returns a parsed object", async () => {
  await withK3Serve(async (url) => {
    const k3 = createOpenAICompatible({
      name: "k3",
      baseURL: `${url}/v1`,
      apiKey: "none",
      supportsStructuredOutputs: true,
    });
    for (const seed of [1, 2]) {
      const { object, finishReason } = await generateObject({
        model: k3.chatModel("tiny"),
        schema: Weather,
        schemaName: "weather",
        prompt: "What is the weather?",
        temperature: 1,
        seed,
        maxOutputTokens: 60,
        maxRetries: 0,
        providerOptions: { k3: { reasoning_effort: "none" } },
      });
      assert.equal(finishReason, "stop");
      assert.deepEqual(Weather.parse(object), object);
    }
  });
});

Deno.test("clients: LangChain withStructuredOutput returns a parsed object (json_schema and function calling)", async () => {
  await withK3Serve(async (url) => {
    const llm = new ChatOpenAI({
      model: "tiny",
      apiKey: "none",
      temperature: 1,
      maxTokens: 160,
      maxRetries: 0,
      configuration: { baseURL: `${url}/v1` },
      modelKwargs: { reasoning_effort: "none" },
    });
    const prompt = "What is the weather?";
    const viaSchema = await llm.withStructuredOutput(Weather, { name: "weather", strict: true })
      .invoke(prompt);
    assert.deepEqual(Weather.parse(viaSchema), viaSchema);
    const viaTool = await llm.withStructuredOutput(Weather, {
      name: "weather",
      method: "functionCalling",
      strict: true,
    }).invoke(prompt);
    assert.deepEqual(Weather.parse(viaTool), viaTool);
  });
});
