/**
 * POST /tokenize and POST /detokenize, as llama.cpp's server has them: text to the model's
 * token ids (`{content, add_special?, parse_special?, with_pieces?}` → `{tokens}`), and ids
 * back to text (`{tokens}` → `{content}`). The same tokenizer as every generation route.
 * No I/O here.
 */
import type { Tokenizer } from "../text/tokenizer.ts";
import { badField, type Body, checkFields, optional } from "./request.ts";

/** A token with its text: a string when its bytes are UTF-8, else the bytes. */
interface TokenPiece {
  id: number;
  piece: string | number[];
}

const strictUtf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * `content` as token ids. `parse_special` (default true, as llama.cpp) reads the text of a
 * special token (`<|im_end|>`...) as that token; false reads it as plain text. K3's tokenizer
 * adds no begin or end token around a text, so `add_special` changes nothing.
 */
export async function tokenize(
  tokenizer: Tokenizer,
  body: Body,
): Promise<{ tokens: number[] | TokenPiece[] }> {
  checkFields(body, {
    handled: ["content", "add_special", "parse_special", "with_pieces"],
    informational: [],
  });
  const content = body.content;
  if (typeof content !== "string") throw badField("content", "must be a string (the text)");
  optional<boolean>(body, "add_special", "boolean", "true or false");
  const special = optional<boolean>(body, "parse_special", "boolean", "true or false") ?? true;
  const pieces = optional<boolean>(body, "with_pieces", "boolean", "true or false") ?? false;
  const ids = await tokenizer.encodeYielding(content, { allowSpecial: special });
  if (!pieces) return { tokens: ids };
  return { tokens: ids.map((id) => ({ id, piece: pieceOf(tokenizer, id) })) };
}

function pieceOf(tokenizer: Tokenizer, id: number): string | number[] {
  const bytes = tokenizer.idToBytes(id);
  try {
    return strictUtf8.decode(bytes);
  } catch {
    return [...bytes]; // part of a character: the bytes, as llama.cpp gives them
  }
}

/** Token ids as text; special tokens read as their names. */
export function detokenize(tokenizer: Tokenizer, body: Body): { content: string } {
  checkFields(body, { handled: ["tokens"], informational: [] });
  const tokens = body.tokens;
  if (!Array.isArray(tokens)) throw badField("tokens", "must be a list of token ids");
  const bad = tokens.findIndex((id) =>
    !Number.isSafeInteger(id) || id < 0 || id >= tokenizer.vocabSize
  );
  if (bad >= 0) {
    throw badField(
      `tokens[${bad}]`,
      `${JSON.stringify(tokens[bad])} is not a token id (0..${tokenizer.vocabSize - 1})`,
    );
  }
  return { content: tokenizer.decode(tokens) };
}
