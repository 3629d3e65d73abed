/**
 * The library's grammar option: generate, complete and chat on the tiny model (random weights:
 * only the constraint makes the output valid), each checked by an independent validator (ajv).
 */
import assert from "node:assert/strict";
import { Ajv } from "ajv";
import { type GrammarSpec, K3Error, openModel } from "../../mod.ts";
import { tinyModel } from "../support/helpers.ts";

const SCHEMA = {
  type: "object",
  properties: {
    size: { enum: ["S", "M", "L"] },
    count: { type: "integer", minimum: 1, maximum: 99 },
    extra: { anyOf: [{ type: "boolean" }, { type: "null" }] },
  },
  required: ["size", "count", "extra"],
  additionalProperties: false,
};

Deno.test("library: generate, complete and chat with a grammar give output that validates", async () => {
  const model = await openModel(await tinyModel({ seed: 11 }), { context: 512 });
  const validate = new Ajv().compile(SCHEMA);
  const grammar: GrammarSpec = { type: "json_schema", schema: SCHEMA };
  try {
    for (const seed of [1, 2, 3]) {
      const sampling = { temperature: 1, seed };
      const ids: number[] = [];
      const prompt = model.tokenizer.encode("Order:");
      for await (const step of model.generate(prompt, { maxTokens: 40, sampling, grammar })) {
        ids.push(step.token);
      }
      assert.ok(model.stopIds.includes(ids.at(-1)!), "ended at a stop id");
      assert.ok(validate(JSON.parse(model.tokenizer.decode(ids.slice(0, -1)))));

      const completion: { finish: string; text: string } = await model.complete("Order:", {
        maxTokens: 40,
        sampling,
        grammar,
      }).result;
      assert.equal(completion.finish, "stop");
      assert.ok(validate(JSON.parse(completion.text)), completion.text);

      const chat = await model.chat([{ role: "user", content: "Order?" }], {
        thinking: false,
        maxTokens: 40,
        sampling,
        grammar,
      }).result;
      assert.ok(validate(JSON.parse(chat.message.content)), chat.message.content);
    }
    await assert.rejects(
      model.complete("x", { grammar: { type: "json_schema", schema: { not: {} } } }).result,
      (e: unknown) => e instanceof K3Error && e.exitCode === 2 && /"not"/.test(e.message),
    );
    assert.throws(
      () => model.complete("x", { grammar, stopAtEos: false }),
      (e: unknown) => e instanceof K3Error && /stopAtEos/.test(e.message),
    );
  } finally {
    model.close();
  }
});
