/**
 * A small deterministic byte-level BPE trainer for synthetic tokenizers. Ranks 0..255 are the
 * single bytes in byte order; every later rank is the most frequent adjacent pair of the
 * training text (ties to the lowest pair of ids), merged inside pre-tokenised words only.
 * The result is written in tiktoken's rank-file format: `<base64 of the bytes> <rank>` per line.
 */

import { Buffer } from "node:buffer";

/** Words, runs of digits, runs of punctuation (each with one optional leading space), spaces. */
const PRE_TOKEN = / ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+/gu;

/** The largest vocabulary the trainer handles (pair keys pack two ids into one number). */
const MAX_RANKS = 65536;

/** Splits text into the pieces merges may not cross. */
function pretokenize(text: string): string[] {
  return text.match(PRE_TOKEN) ?? [];
}

/** Distinct pre-tokens as byte-id sequences, with how often each occurs. */
function countWords(text: string): { ids: number[]; count: number }[] {
  const counts = new Map<string, number>();
  for (const piece of pretokenize(text)) counts.set(piece, (counts.get(piece) ?? 0) + 1);
  const encoder = new TextEncoder();
  return [...counts].map(([piece, count]) => ({ ids: [...encoder.encode(piece)], count }));
}

/** The most frequent adjacent pair (ties: smallest left id, then smallest right id), or null. */
function bestPair(words: { ids: number[]; count: number }[]): [number, number] | null {
  const pairCounts = new Map<number, number>();
  for (const { ids, count } of words) {
    for (let i = 0; i + 1 < ids.length; i++) {
      const key = ids[i] * MAX_RANKS + ids[i + 1];
      pairCounts.set(key, (pairCounts.get(key) ?? 0) + count);
    }
  }
  let bestKey = -1, bestCount = 0;
  for (const [key, count] of pairCounts) {
    if (count > bestCount || (count === bestCount && key < bestKey)) {
      bestKey = key;
      bestCount = count;
    }
  }
  return bestKey < 0 ? null : [Math.floor(bestKey / MAX_RANKS), bestKey % MAX_RANKS];
}

/** Replaces every non-overlapping (left, right) pair, scanning left to right, by `merged`. */
function applyMerge(ids: number[], left: number, right: number, merged: number): number[] {
  const out: number[] = [];
  for (let i = 0; i < ids.length; i++) {
    if (i + 1 < ids.length && ids[i] === left && ids[i + 1] === right) {
      out.push(merged);
      i++;
    } else {
      out.push(ids[i]);
    }
  }
  return out;
}

/** Bytes as a map key (one char per byte). */
function bytesKey(bytes: Uint8Array): string {
  return String.fromCharCode(...bytes);
}

/**
 * Trains a byte-level BPE vocabulary of exactly `numRanks` tokens on `text`.
 * @returns the token bytes indexed by rank (ranks 0..255 are the single bytes)
 * @throws RangeError when numRanks is outside 256..65536 or the text runs out of pairs first
 */
export function trainBpe(text: string, numRanks: number): Uint8Array[] {
  if (!Number.isInteger(numRanks) || numRanks < 256 || numRanks > MAX_RANKS) {
    throw new RangeError(
      `trainBpe: numRanks must be an integer in 256..${MAX_RANKS}, got ${numRanks}`,
    );
  }
  const tokens: Uint8Array[] = Array.from({ length: 256 }, (_, b) => Uint8Array.of(b));
  const idOf = new Map(tokens.map((t, id) => [bytesKey(t), id]));
  let words = countWords(text);
  while (tokens.length < numRanks) {
    const pair = bestPair(words);
    if (pair === null) {
      throw new RangeError(
        `trainBpe: the training text yields only ${tokens.length} tokens, ${numRanks} asked`,
      );
    }
    const [left, right] = pair;
    const bytes = new Uint8Array([...tokens[left], ...tokens[right]]);
    const key = bytesKey(bytes);
    // Two different pairs can spell the same bytes ("ab"+"c", "a"+"bc"): reuse the rank.
    let merged = idOf.get(key);
    if (merged === undefined) {
      merged = tokens.length;
      tokens.push(bytes);
      idOf.set(key, merged);
    }
    words = words.map(({ ids, count }) => ({ ids: applyMerge(ids, left, right, merged), count }));
  }
  return tokens;
}

/** Formats tokens (indexed by rank) as a tiktoken rank file: `<base64> <rank>\n` per token. */
export function formatTiktokenRanks(tokens: readonly Uint8Array[]): string {
  return tokens.map((t, rank) => `${Buffer.from(t).toString("base64")} ${rank}\n`).join("");
}

/**
 * Extends a vocabulary to exactly `count` ranks with filler tokens ` r<rank>` (a space, "r",
 * the rank's digits). Every pre-tokeniser here (Kimi's and the trainer's) splits letters from
 * digits, so no text piece can hold a whole filler: they never change how text encodes, and
 * decode to readable text when a random model samples them.
 * @throws RangeError when `count` is below the vocabulary's size
 */
export function padVocabulary(tokens: readonly Uint8Array[], count: number): Uint8Array[] {
  if (!Number.isInteger(count) || count < tokens.length) {
    throw new RangeError(
      `padVocabulary: ${count} ranks asked, the vocabulary has ${tokens.length}`,
    );
  }
  const encoder = new TextEncoder();
  const out = [...tokens];
  while (out.length < count) out.push(encoder.encode(` r${out.length}`));
  return out;
}
