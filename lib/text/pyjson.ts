/**
 * Python compatibility for the chat renderer and the tokenizer: `json.dumps` as the official
 * K3 encoder calls it, and the `str.isspace` / `str.strip` rules it relies on.
 *
 * `pyJsonDumps(x)` reproduces Python `json.dumps(x, ensure_ascii=False)` (separators ", " and
 * ": "); `{ compact: true }` gives `separators=(",", ":")`; `{ sortKeys: true }` gives
 * `sort_keys=True`, which prints the same text as dumping a deep-sorted copy.
 *
 * Numbers, one rule: JavaScript has a single number type, so a value parsed from JSON has lost
 * Python's int/float distinction (`1.0` and `1` are the same JS value). **Every integral value
 * prints as a Python int** (`1`, `-3`, `100000000000000000000`); every other finite value prints
 * as a Python float repr (`0.5`, `1e-05`, `1.5e-07`). A Python float that happens to be integral
 * (`1.0`) therefore prints as `1` here. Non-finite values print as Python does: `NaN`,
 * `Infinity`, `-Infinity`.
 *
 * Object key order: JS objects list integer-like keys ("0", "12") first, in numeric order, then
 * the rest in insertion order. Python keeps insertion order for all keys. The two agree unless an
 * object mixes integer-like keys with others and is printed without `sortKeys`.
 */

/** Python `str.isspace()` for one code point: Unicode Zs plus the bidi classes WS, B and S. */
export function isPythonSpace(codePoint: number): boolean {
  if (codePoint <= 0x20) {
    return codePoint === 0x20 || (codePoint >= 0x09 && codePoint <= 0x0d) || codePoint >= 0x1c;
  }
  if (codePoint < 0x85) return false;
  return codePoint === 0x85 || codePoint === 0xa0 || codePoint === 0x1680 ||
    (codePoint >= 0x2000 && codePoint <= 0x200a) || codePoint === 0x2028 || codePoint === 0x2029 ||
    codePoint === 0x202f || codePoint === 0x205f || codePoint === 0x3000;
}

/** Python `str.strip()` with no argument: trims `str.isspace()` characters at both ends. */
export function pythonStrip(s: string): string {
  // Every Python whitespace character is in the BMP, so UTF-16 units can be tested one by one.
  let start = 0;
  let end = s.length;
  while (start < end && isPythonSpace(s.charCodeAt(start))) start++;
  while (end > start && isPythonSpace(s.charCodeAt(end - 1))) end--;
  return s.slice(start, end);
}

/** How to print: `compact` = separators (",", ":"); `sortKeys` = sort_keys=True. */
interface PyJsonOptions {
  compact?: boolean;
  sortKeys?: boolean;
}

/**
 * Python `json.dumps(value, ensure_ascii=False, ...)`. Throws TypeError on values JSON cannot
 * hold (functions, symbols, bigint, undefined), as Python raises on unserialisable objects.
 */
export function pyJsonDumps(value: unknown, options: PyJsonOptions = {}): string {
  const itemSep = options.compact ? "," : ", ";
  const keySep = options.compact ? ":" : ": ";
  const sortKeys = options.sortKeys ?? false;
  const dump = (v: unknown): string => {
    if (v === null) return "null";
    if (typeof v === "boolean") return v ? "true" : "false";
    if (typeof v === "number") return pyNumber(v);
    if (typeof v === "string") return pyString(v);
    if (Array.isArray(v)) return "[" + v.map(dump).join(itemSep) + "]";
    if (typeof v === "object") {
      const keys = Object.keys(v as object);
      if (sortKeys) keys.sort(compareCodePoints);
      const record = v as Record<string, unknown>;
      return "{" + keys.map((k) => pyString(k) + keySep + dump(record[k])).join(itemSep) + "}";
    }
    throw new TypeError(`Object of type ${typeof v} is not JSON serializable`);
  };
  return dump(value);
}

/**
 * A deep copy with every object's keys sorted (Python `sorted()` order, by code point); list
 * order is kept. Printing it with `sortKeys` is what makes the order survive JS key ordering.
 */
export function deepSort(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(deepSort);
  if (value !== null && typeof value === "object") {
    const record = value as Record<string, unknown>;
    const sorted: Record<string, unknown> = {};
    for (const key of Object.keys(record).sort(compareCodePoints)) {
      sorted[key] = deepSort(record[key]);
    }
    return sorted;
  }
  return value;
}

/** Python string ordering: by code point (JS `<` compares UTF-16 units, which differs above U+FFFF). */
function compareCodePoints(a: string, b: string): number {
  const ca = Array.from(a);
  const cb = Array.from(b);
  for (let i = 0; i < Math.min(ca.length, cb.length); i++) {
    const d = ca[i].codePointAt(0)! - cb[i].codePointAt(0)!;
    if (d !== 0) return d;
  }
  return ca.length - cb.length;
}

/** A number as Python prints it (see the module comment for the int/float rule). */
function pyNumber(x: number): string {
  if (Number.isNaN(x)) return "NaN";
  if (x === Infinity) return "Infinity";
  if (x === -Infinity) return "-Infinity";
  if (Number.isInteger(x)) return BigInt(x).toString(); // no exponent, and -0 prints as 0
  return pyFloatRepr(x);
}

/**
 * Python `repr(float)` for a finite non-integral value: the shortest round-trip digits (the same
 * digits JS picks), positional when 1e-4 <= |x| < 1e16, else `d.ddde-XX` with at least two
 * exponent digits. Non-integral values are always below 2**53, so only small ones need exponents.
 */
function pyFloatRepr(x: number): string {
  if (Math.abs(x) >= 1e-4) return String(x);
  const [mantissa, exponent] = x.toExponential().split("e");
  const sign = exponent.startsWith("-") ? "-" : "+";
  const digits = exponent.replace(/^[+-]/, "").padStart(2, "0");
  return `${mantissa}e${sign}${digits}`;
}

/** A JSON string literal with Python's escapes and ensure_ascii=False (non-ASCII stays raw). */
function pyString(s: string): string {
  return '"' + s.replace(ESCAPED_CHARS, escapeChar) + '"';
}

// deno-lint-ignore no-control-regex
const ESCAPED_CHARS = /["\\\x00-\x1f]/g;
const SHORT_ESCAPES: Record<string, string> = {
  '"': '\\"',
  "\\": "\\\\",
  "\n": "\\n",
  "\r": "\\r",
  "\t": "\\t",
  "\b": "\\b",
  "\f": "\\f",
};

function escapeChar(ch: string): string {
  return SHORT_ESCAPES[ch] ?? "\\u" + ch.charCodeAt(0).toString(16).padStart(4, "0");
}
