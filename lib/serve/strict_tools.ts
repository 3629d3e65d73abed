/**
 * Strict tools and forced tool choices, for every API: which grammar a request's tools and
 * tool choice ask for. A strict tool's arguments are held to its schema; `required` (OpenAI),
 * `any` (Anthropic) and a named tool are made certain by the grammar, not only asked for in
 * the prompt. A request whose tools are none of them strict, and that forces nothing by
 * grammar, decodes as before (the schemas are only shown to the model).
 */
import type { GenerationSpec } from "./generation.ts";
import { badField, type Body, isAbsent } from "./request.ts";
import { checkSchema, type GrammarTool } from "../text/grammar.ts";

/** A declared tool, in any API's shape, as the grammar needs it. */
export interface DeclaredTool {
  name: string;
  /** The arguments' schema: a strict tool's, checked; absent for a tool that is not strict. */
  schema?: unknown;
  /** Where the tool is in the request (`tools[0].function`), for errors. */
  at: string;
}

/** The arguments of a strict tool that declares no parameters: an empty object. */
const NO_ARGUMENTS = { type: "object", properties: {}, additionalProperties: false };

/**
 * A tool's `strict` flag and, when it is true, its schema (under `schemaKey`), checked: a
 * keyword the engine cannot enforce is a 400 naming it and where it is.
 */
export function strictSchema(f: Body, at: string, schemaKey: string): unknown {
  const strict = f.strict;
  if (!isAbsent(strict) && typeof strict !== "boolean") {
    throw badField(`${at}.strict`, "must be true or false");
  }
  if (strict !== true) return undefined;
  const schema = isAbsent(f[schemaKey]) ? NO_ARGUMENTS : f[schemaKey];
  const where = `${at}.${schemaKey}`;
  try {
    checkSchema(schema, where);
  } catch (e) {
    throw badField(where, (e as Error).message.replace(`${where}: `, ""));
  }
  return schema;
}

/** Tools shaped `{name, [schemaKey], strict}` (Responses, Anthropic), already checked. */
export function declaredTools(tools: Body[], schemaKey: string): DeclaredTool[] {
  return tools.map((t, i) => ({
    name: t.name as string,
    schema: strictSchema(t, `tools[${i}]`, schemaKey),
    at: `tools[${i}]`,
  }));
}

/** How the request chose: K3's rendered choice, and a tool it forces (pre-filled), if any. */
export interface ToolPlan {
  render?: "auto" | "required" | "none";
  force?: string;
}

/**
 * The grammar for a chat request's answer: a forced strict tool's arguments; `required`: at
 * least one call of a declared tool; any strict tool under `auto`: its calls held to its
 * schema, and the plain answer to `format` (the response format's grammar) when there is one.
 * Otherwise `format`, as without tools (a forced tool that is not strict: no grammar).
 */
export function toolsGrammar(
  tools: DeclaredTool[],
  plan: ToolPlan,
  maxCalls: number | undefined,
  format: GenerationSpec["grammar"],
): GenerationSpec["grammar"] {
  const grammarTools: GrammarTool[] = tools.map((t) => ({ name: t.name, schema: t.schema }));
  if (plan.force !== undefined) {
    const tool = tools.find((t) => t.name === plan.force)!;
    if (tool.schema === undefined) return undefined;
    const spec = { type: "tool_calls" as const, tools: [grammarTools[tools.indexOf(tool)]] };
    return { spec: { ...spec, mode: "forced" }, field: tool.at };
  }
  if (tools.length === 0 || plan.render === "none") return format;
  if (plan.render === "required") {
    return {
      spec: { type: "tool_calls", tools: grammarTools, mode: "required", maxCalls },
      field: "tools",
    };
  }
  if (!tools.some((t) => t.schema !== undefined)) return format;
  const content = format?.spec.type === "json_schema" || format?.spec.type === "json_object"
    ? format.spec
    : undefined;
  return {
    spec: { type: "tool_calls", tools: grammarTools, mode: "auto", maxCalls, content },
    field: "tools",
  };
}
