/**
 * `--json-schema FILE` and `--grammar FILE` of `k3 run`: the output constrained token by token
 * to a JSON Schema or an EBNF grammar (lib/text/grammar.ts). The file is read and its schema
 * checked before the model loads, so a bad one fails in a moment, not after the load.
 */
import { badInput } from "../errors.ts";
import { readUserText } from "../io/files.ts";
import {
  checkSchema,
  ConstrainedPicker,
  GrammarEngine,
  type GrammarSpec,
  MAX_GRAMMAR_BYTES,
} from "../text/grammar.ts";
import { Sampler, type SamplingOptions } from "../text/sampler.ts";
import type { Tokenizer } from "../text/tokenizer.ts";

export const GRAMMAR_HELP = `constrained output (the answer always matches; needs the tokenizer):
  --json-schema FILE    JSON matching the JSON Schema in FILE (compact, one line)
  --grammar FILE        text matching the EBNF grammar in FILE (xgrammar notation, rule root)`;

export const GRAMMAR_OPTIONS = {
  "json-schema": { type: "string" },
  grammar: { type: "string" },
} as const;

/** The grammar the flags ask for (read and checked), or undefined. */
export async function grammarFlags(
  values: { "json-schema"?: string; grammar?: string },
): Promise<GrammarSpec | undefined> {
  const schemaFile = values["json-schema"], grammarFile = values.grammar;
  if (schemaFile !== undefined && grammarFile !== undefined) {
    throw badInput("give one of --json-schema and --grammar, not both");
  }
  const limits = { limit: MAX_GRAMMAR_BYTES };
  if (grammarFile !== undefined) {
    return { type: "ebnf", grammar: (await readUserText(grammarFile, "--grammar", limits))! };
  }
  if (schemaFile === undefined) return undefined;
  const text = (await readUserText(schemaFile, "--json-schema", limits))!;
  let schema: unknown;
  try {
    schema = JSON.parse(text);
  } catch (e) {
    throw badInput(`${schemaFile}: --json-schema is not JSON (${(e as Error).message})`);
  }
  checkSchema(schema, schemaFile);
  return { type: "json_schema", schema };
}

/** A sampler, constrained to `spec` when there is one (the grammar ends at a stop id). */
export async function grammarPicker(
  spec: GrammarSpec | undefined,
  sampling: SamplingOptions,
  tokenizer: Tokenizer | undefined,
  vocabSize: number,
  stopIds: number[],
): Promise<Sampler | ConstrainedPicker> {
  const sampler = new Sampler(sampling);
  if (!spec) return sampler;
  const flag = spec.type === "ebnf" ? "--grammar" : "--json-schema";
  if (!tokenizer) throw badInput(`${flag} needs the tokenizer: give --prompt or --prompt-file`);
  if (stopIds.length === 0) {
    throw badInput(`${flag} ends the output at a stop id: it cannot be used with --ignore-eos`);
  }
  const engine = await GrammarEngine.create(tokenizer, vocabSize, stopIds);
  return new ConstrainedPicker(sampler, await engine.matcher(await engine.compile(spec)));
}
