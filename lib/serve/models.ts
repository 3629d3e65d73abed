/**
 * The model list in Anthropic's shape, for clients that send `anthropic-version` (the
 * Anthropic SDKs always do) to GET /v1/models and /v1/models/{id}: `{type: "model", id,
 * display_name, created_at}` entries, paged by `limit`, `after_id` and `before_id`. OpenAI's
 * shape is openai.ts's modelEntry. No I/O here.
 */
import { badField, optionalInt } from "./request.ts";

/** One model as Anthropic describes it; `created` is in Unix seconds. */
export function anthropicModel(id: string, created: number) {
  return {
    type: "model",
    id,
    display_name: id,
    created_at: new Date(created * 1000).toISOString(),
  };
}

/** Anthropic's page size when the request gives no `limit`. */
const DEFAULT_LIMIT = 20;

/**
 * A page of `names` for the query (`limit` 1..1000, then the ids after `after_id` or before
 * `before_id`), with `has_more`, `first_id` and `last_id` as Anthropic's list endpoints give.
 */
export function anthropicModelList(names: string[], created: number, query: URLSearchParams) {
  const raw = query.get("limit");
  const limit = optionalInt({ limit: raw === null ? undefined : Number(raw) }, "limit", 1, 1000) ??
    DEFAULT_LIMIT;
  const after = cursor(names, query, "after_id");
  const before = cursor(names, query, "before_id");
  if (after !== undefined && before !== undefined) {
    throw badField("before_id", "cannot be given with after_id; page one way at a time");
  }
  let page: string[];
  let more: boolean;
  if (before !== undefined) {
    const start = Math.max(0, before - limit);
    page = names.slice(start, before);
    more = start > 0;
  } else {
    const start = after === undefined ? 0 : after + 1;
    page = names.slice(start, start + limit);
    more = start + limit < names.length;
  }
  return {
    data: page.map((id) => anthropicModel(id, created)),
    has_more: more,
    first_id: page[0] ?? null,
    last_id: page.at(-1) ?? null,
  };
}

/** The index of the model a paging cursor names, or undefined when the query has none. */
function cursor(names: string[], query: URLSearchParams, key: string): number | undefined {
  const id = query.get(key);
  if (id === null) return undefined;
  const at = names.indexOf(id);
  if (at < 0) {
    throw badField(key, `${JSON.stringify(id)} is not a model this server lists`);
  }
  return at;
}
