/**
 * Tokenizer tests. The reference is an independent encoder written here: a JavaScript
 * translation of Kimi's pat_str (v-flag regex, explicit Rust White_Space class) plus a naive
 * lowest-rank-first byte-pair merge. tiktoken (Rust, WASM) must agree with it id for id.
 */

import assert from "node:assert/strict";
import * as path from "node:path";
import { K3Error } from "../../lib/errors.ts";
import { makeTiny } from "../../lib/synth/tiny.ts";
import {
  MAX_ENCODE_CHARS,
  MAX_RUN_CHARS,
  slicesAtLineStarts,
  splitForEncoding,
  StreamDecoder,
  Tokenizer,
} from "../../lib/text/tokenizer.ts";

// ---- test vocabularies ----

/** Special names at their MODEL.md §6.1 offsets from the first special id. */
const KNOWN_SPECIALS: Record<number, string> = {
  0: "[BOS]",
  1: "[EOS]",
  2: "<|end_of_msg|>",
  3: "<|open|>",
  4: "<|close|>",
  5: "<|sep|>",
  18: "<|media_begin|>",
  21: "<|media_pad|>",
  254: "[UNK]",
  255: "[PAD]",
};

/** Words whose every UTF-8 byte prefix becomes a token, so each is reachable by merges. */
const WORDS = [
  "he",
  "hello",
  " hello",
  " world",
  "the",
  " the",
  "Hello",
  "message",
  " role",
  '="',
  "user",
  "'s",
  "'re",
  "'ll",
  "  ",
  "    ",
  "\n\n",
  " \n",
  "中",
  "中文",
  "你好",
  "世界",
  "😀",
  "👩‍👩",
  "é",
  "café",
  "مرحبا",
  "שלום",
  "aa",
  "aaaa",
  "bc",
  "12",
  "123",
  "<|",
  "|>",
  "open",
];

function prefixTokens(words: string[]): Uint8Array[] {
  const enc = new TextEncoder();
  const tokens = Array.from({ length: 256 }, (_, b) => new Uint8Array([b]));
  const seen = new Set(tokens.map((t) => t.join(",")));
  for (const word of words) {
    const bytes = enc.encode(word);
    for (let n = 2; n <= bytes.length; n++) {
      const t = bytes.slice(0, n);
      if (!seen.has(t.join(","))) {
        seen.add(t.join(","));
        tokens.push(t);
      }
    }
  }
  return tokens;
}

function b64(bytes: Uint8Array): string {
  return btoa(String.fromCharCode(...bytes));
}

function rankFile(tokens: Uint8Array[]): string {
  return tokens.map((t, rank) => `${b64(t)} ${rank}`).join("\n") + "\n";
}

function tokenizerConfig(first: number): string {
  const decoder: Record<string, { content: string; special: boolean }> = {};
  for (const [k, content] of Object.entries(KNOWN_SPECIALS)) {
    decoder[String(first + Number(k))] = { content, special: true };
  }
  return JSON.stringify({ added_tokens_decoder: decoder });
}

/** Temp folders this file made, removed when its runtime ends (tests leave nothing behind). */
const made: string[] = [];
globalThis.addEventListener("unload", () => {
  for (const d of made) Deno.removeSync(d, { recursive: true });
});

async function writeTokenizer(ranks: string, config: string): Promise<string> {
  const dir = await Deno.makeTempDir({ prefix: "k3-tok-" });
  made.push(dir);
  await Deno.writeTextFile(path.join(dir, "tiktoken.model"), ranks);
  await Deno.writeTextFile(path.join(dir, "tokenizer_config.json"), config);
  return dir;
}

const TOKENS = prefixTokens(WORDS);
const DIR = await writeTokenizer(rankFile(TOKENS), tokenizerConfig(TOKENS.length));

// ---- the independent reference encoder ----

const WS = String.raw`\t\n\v\f\r \x85\xA0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000`;
const UPPERISH = String.raw`[[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]--\p{sc=Han}]`;
const LOWERISH = String.raw`[[\p{Ll}\p{Lm}\p{Lo}\p{M}]--\p{sc=Han}]`;
const CONTRACTION = String.raw`(?:'[sSſ]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])`;
const REFERENCE_PAT = new RegExp(
  [
    String.raw`\p{sc=Han}+`,
    String.raw`[^\r\n\p{L}\p{N}]?${UPPERISH}*${LOWERISH}+${CONTRACTION}?`,
    String.raw`[^\r\n\p{L}\p{N}]?${UPPERISH}+${LOWERISH}*${CONTRACTION}?`,
    String.raw`\p{N}{1,3}`,
    String.raw` ?[^${WS}\p{L}\p{N}]+[\r\n]*`,
    String.raw`[${WS}]*[\r\n]+`,
    String.raw`[${WS}]+(?![^${WS}])`,
    String.raw`[${WS}]+`,
  ].join("|"),
  "gv",
);

const RANKS = new Map(TOKENS.map((t, rank) => [t.join(","), rank]));

function referenceBpe(bytes: Uint8Array): number[] {
  const whole = RANKS.get(bytes.join(","));
  if (whole !== undefined) return [whole];
  let parts = Array.from(bytes, (b) => [b]);
  for (;;) {
    let best = -1;
    let bestRank = Infinity;
    for (let i = 0; i + 1 < parts.length; i++) {
      const rank = RANKS.get([...parts[i], ...parts[i + 1]].join(",")) ?? Infinity;
      if (rank < bestRank) [best, bestRank] = [i, rank];
    }
    if (best < 0) break;
    parts = [
      ...parts.slice(0, best),
      [...parts[best], ...parts[best + 1]],
      ...parts.slice(best + 2),
    ];
  }
  return parts.map((p) => RANKS.get(p.join(","))!);
}

function referenceEncode(text: string): number[] {
  const enc = new TextEncoder();
  return [...text.matchAll(REFERENCE_PAT)].flatMap((m) => referenceBpe(enc.encode(m[0])));
}

const MULTILINGUAL = [
  "Hello world, hello the world!",
  "中文你好，世界！東京タワーは高い。中。Ab",
  "family 👩‍👩‍👧‍👦 flag 🏳️‍🌈 skin 👍🏽 😀😀",
  "مرحبا بالعالم — שלום עולם (RTL) ‏mixed‎",
  "café naïve Ångström e\u0301 ÉCOLE Straße",
  "a \t\n\n   \r\n  b      c\u00a0\u3000d\u0085e \n",
  "I'm they're WE'LL it'S don't ſ'ſ O'NEIL's",
  "12345 3.14159 ١٢٣ ⅷ x²",
  "function f(x) {\n    return x * 2; // ok\n}\n",
  "\ufeffBOM first, then <|open|> and [EOS] as text",
];

// ---- tests ----

Deno.test("encode matches the independent reference and round-trips", async () => {
  const tok = await Tokenizer.load(DIR);
  try {
    for (const text of MULTILINGUAL) {
      const ids = tok.encode(text);
      assert.deepEqual(ids, referenceEncode(text), `ids of ${JSON.stringify(text)}`);
      assert.equal(tok.decode(ids), text);
    }
    assert.ok(tok.encode(" hello world").length < new TextEncoder().encode(" hello world").length);
  } finally {
    tok.free();
  }
});

Deno.test("ids, vocabSize and special names follow tokenizer_config.json", async () => {
  const tok = await Tokenizer.load(DIR);
  try {
    const n = TOKENS.length;
    assert.equal(tok.vocabSize, n + 256);
    assert.equal(tok.specialId("<|end_of_msg|>"), n + 2);
    assert.equal(tok.specialName(n + 3), "<|open|>");
    assert.equal(tok.specialName(n + 7), `<|reserved_token_${n + 7}|>`);
    assert.equal(tok.specialName(5), undefined);
    assert.ok(
      tok.isSpecial(n) && tok.isSpecial(n + 255) && !tok.isSpecial(n - 1) &&
        !tok.isSpecial(n + 256),
    );
    assert.deepEqual(tok.idToBytes(n + 3), new TextEncoder().encode("<|open|>"));
    assert.deepEqual(tok.idToBytes(RANKS.get(TOKENS[300].join(","))!), TOKENS[300]);
    assert.throws(() => tok.idToBytes(n + 256), K3Error);
  } finally {
    tok.free();
  }
});

Deno.test("special strings: ids with allowSpecial, plain bytes without", async () => {
  const tok = await Tokenizer.load(DIR);
  try {
    const n = TOKENS.length;
    const text = "hi <|open|>x<|end_of_msg|>[EOS]";
    const special = tok.encode(text, { allowSpecial: true });
    assert.deepEqual(special, [
      ...referenceEncode("hi "),
      n + 3,
      ...referenceEncode("x"),
      n + 2,
      n + 1,
    ]);
    const plain = tok.encode(text, { allowSpecial: false });
    assert.deepEqual(plain, referenceEncode(text));
    assert.ok(plain.every((id) => !tok.isSpecial(id)));
    assert.equal(tok.decode(plain), text);
    assert.equal(tok.decode(special), text);
  } finally {
    tok.free();
  }
});

Deno.test("pre-split: 25,000-character runs and 400,000-character windows (code points)", async () => {
  const lengths = (text: string) => splitForEncoding(text).map((p) => Array.from(p).length);
  assert.deepEqual(lengths(""), [0]);
  assert.deepEqual(lengths("a".repeat(MAX_RUN_CHARS)), [MAX_RUN_CHARS]);
  assert.deepEqual(lengths("a".repeat(MAX_RUN_CHARS + 1)), [MAX_RUN_CHARS, 1]);
  assert.deepEqual(lengths("x" + " ".repeat(60_000) + "y"), [25_001, 25_000, 10_001]);
  assert.deepEqual(lengths("😀".repeat(MAX_RUN_CHARS + 2)), [MAX_RUN_CHARS, 2]);
  // \x1c is whitespace to Python's str.isspace (and so breaks a non-whitespace run).
  assert.deepEqual(lengths("a".repeat(20_000) + "\x1c" + "a".repeat(20_000)), [40_001]);
  assert.deepEqual(lengths("a ".repeat(MAX_ENCODE_CHARS / 2) + "z"), [MAX_ENCODE_CHARS, 1]);

  // The split changes ids: "bc" is one token, but a run cut between b and c is not.
  const tok = await Tokenizer.load(DIR);
  try {
    const bc = RANKS.get([98, 99].join(","))!;
    const short = tok.encode("a".repeat(10) + "bc");
    assert.equal(short.at(-1), bc);
    const long = tok.encode("a".repeat(MAX_RUN_CHARS - 1) + "bc");
    assert.deepEqual(long.slice(-2), [98, 99]);
    assert.equal(tok.decode(long), "a".repeat(MAX_RUN_CHARS - 1) + "bc");
  } finally {
    tok.free();
  }
});

Deno.test("StreamDecoder never emits half a character", async () => {
  const tok = await Tokenizer.load(DIR);
  try {
    // Single-byte ids split every multi-byte character across tokens.
    const text = "é中😀👩‍👩‍👧 ok";
    const bytes = new TextEncoder().encode(text);
    const stream = new StreamDecoder(tok);
    const pieces = [...bytes].map((b) => stream.push(b));
    pieces.push(stream.flush());
    assert.equal(pieces.join(""), text);
    for (const piece of pieces) assert.ok(!/[\ufffd]/.test(piece) && piece.isWellFormed());
    assert.equal(pieces[0], ""); // first byte of é alone
    assert.equal(pieces[1], "é");
    // An incomplete tail becomes U+FFFD on flush, as decode() does.
    const cut = new StreamDecoder(tok);
    assert.equal(cut.push(0xe4) + cut.push(0xb8), "");
    assert.equal(cut.flush(), "\ufffd");
    assert.equal(tok.decode([0xe4, 0xb8]), "\ufffd");
  } finally {
    tok.free();
  }
});

Deno.test("the generator's tokenizer (lib/synth/tiny.ts) loads and round-trips", async () => {
  const dir = await Deno.makeTempDir({ prefix: "k3-tiny-tok-" });
  made.push(dir);
  await makeTiny(dir);
  const tok = await Tokenizer.load(dir);
  try {
    assert.equal(tok.specialName(tok.vocabSize - 256 + 2), "<|end_of_msg|>");
    for (const text of MULTILINGUAL) assert.equal(tok.decode(tok.encode(text)), text);
  } finally {
    tok.free();
  }
});

Deno.test("malformed tokenizer files are bad input naming the file and line", async () => {
  const good = rankFile(TOKENS).split("\n").slice(0, -1);
  const config = tokenizerConfig(TOKENS.length);
  const cases: [string, string, string, RegExp][] = [
    [
      "bad base64",
      [...good.slice(0, 3), "@@@ 3", ...good.slice(4)].join("\n"),
      config,
      /tiktoken\.model line 4/,
    ],
    [
      "missing rank",
      [...good.slice(0, 5), good[5].split(" ")[0], ...good.slice(6)].join("\n"),
      config,
      /line 6/,
    ],
    [
      "duplicate rank",
      [...good, `${b64(new Uint8Array([1, 2, 3]))} 7`].join("\n"),
      config,
      /rank 7 is listed twice/,
    ],
    [
      "duplicate token",
      [...good, `${good[0].split(" ")[0]} ${good.length}`].join("\n"),
      config,
      /line \d+: the same token is already listed on line 1\b/,
    ],
    [
      "gap in ranks",
      good.filter((_, i) => i !== 300).join("\n"),
      config,
      /line \d+: rank \d+ is too large/,
    ],
    [
      "missing byte",
      good.slice(1).map((l, i) => `${l.split(" ")[0]} ${i}`).join("\n"),
      config,
      /byte 0x00 has no token/,
    ],
    ["bad config JSON", good.join("\n"), "{nope", /tokenizer_config\.json: not valid JSON/],
    [
      "bad config entry",
      good.join("\n"),
      JSON.stringify({ added_tokens_decoder: { [TOKENS.length]: { content: 3 } } }),
      /content must be/,
    ],
  ];
  for (const [label, ranks, cfg, pattern] of cases) {
    const dir = await writeTokenizer(ranks, cfg);
    await assert.rejects(Tokenizer.load(dir), (e: unknown) => {
      assert.ok(e instanceof K3Error, label);
      assert.equal(e.exitCode, 2, label);
      assert.match(e.message, pattern, label);
      return true;
    });
  }
  const empty = await Deno.makeTempDir({ prefix: "k3-tok-" });
  made.push(empty);
  await assert.rejects(
    Tokenizer.load(empty),
    /tiktoken\.model: tokenizer file does not exist; pass the model directory/,
  );
});

Deno.test("a full-size rank file (163,584 lines) loads quickly, with K3's special ids", async () => {
  const count = 163_584;
  const lines: string[] = [];
  for (let b = 0; b < 256; b++) lines.push(`${b64(new Uint8Array([b]))} ${b}`);
  for (let i = 0; lines.length < count; i++) {
    // Six bytes, distinct in their first three, so the file is about the real one's size.
    const bytes = [i >> 16, (i >> 8) & 255, i & 255, 32, 97 + (i % 26), 98];
    lines.push(`${b64(new Uint8Array(bytes))} ${lines.length}`);
  }
  const text = lines.join("\n") + "\n";
  const dir = await writeTokenizer(text, tokenizerConfig(count));
  const t0 = performance.now();
  const tok = await Tokenizer.load(dir);
  const ms = performance.now() - t0;
  console.log(`load of ${(text.length / 1e6).toFixed(2)} MB rank file: ${ms.toFixed(0)} ms`);
  try {
    assert.ok(ms < 3000, `load took ${ms} ms`);
    assert.equal(tok.vocabSize, 163_840);
    assert.equal(tok.specialId("<|end_of_msg|>"), 163_586);
    assert.equal(tok.specialId("<|open|>"), 163_587);
    assert.equal(tok.specialId("<|sep|>"), 163_589);
    assert.equal(tok.specialId("<|media_pad|>"), 163_605);
    assert.equal(tok.specialName(163_839), "[PAD]");
    assert.equal(tok.decode(tok.encode("round trip 中文 😀")), "round trip 中文 😀");
  } finally {
    tok.free();
  }
});

Deno.test("encodeYielding gives encode's ids, cut at line starts, and lets timers run meanwhile", async () => {
  const tok = await Tokenizer.load(DIR);
  try {
    // Line ends of every kind before letters, digits, spaces, punctuation and specials.
    const joints = ["\n", "\n\n", " \n", "\r\n", "!\n", "\n ", "\n\t", "'\n", "\n1", "\n<|open|>"];
    const lines: string[] = [];
    for (let i = 0; lines.join("").length < 300_000; i++) {
      lines.push(MULTILINGUAL[i % MULTILINGUAL.length], joints[i % joints.length]);
      if (i % 97 === 0) lines.push("x".repeat(MAX_RUN_CHARS + 5), " ".repeat(100));
    }
    const text = lines.join("");
    assert.ok(slicesAtLineStarts(text, 16384).length > 10, "the text is cut into slices");
    for (const allowSpecial of [false, true]) {
      let ticks = 0;
      const timer = setInterval(() => ticks++, 0);
      const yielded = await tok.encodeYielding(text, { allowSpecial });
      clearInterval(timer);
      assert.deepEqual(yielded, tok.encode(text, { allowSpecial }), `allowSpecial ${allowSpecial}`);
      assert.ok(ticks > 0, "timers ran while it encoded");
    }
    assert.deepEqual(slicesAtLineStarts("a\nb", 1), ["a\n", "b"]);
    assert.deepEqual(slicesAtLineStarts("a\n b\n\n", 1), ["a\n b\n\n"]);
  } finally {
    tok.free();
  }
});
