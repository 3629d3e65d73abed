/**
 * `k3 sim-cache TRACE [--sizes 8,64,512 | --sizes 1GB,4GB]`: replays an expert trace (from
 * `k3 run --dump-cache-trace DIR`) under LRU, Belady and pinned-prefix + LRU at several
 * cache sizes, and prints hit rates, GB read per token and the compulsory misses.
 */
import { badInput, ExitCode } from "../errors.ts";
import { simulateBelady, simulateLru, simulatePinnedLru, traceKeys } from "../memory/simulate.ts";
import { readTrace } from "../memory/trace.ts";
import { parseCommand } from "./flags.ts";

const HELP = `usage: k3 sim-cache TRACE [--sizes LIST] [--json]

TRACE is DIR/expert_trace.jsonl (or DIR) from k3 run --dump-cache-trace DIR.
  --sizes LIST   cache sizes: slot counts (8,64,512) or GB (0.5GB,4GB); default doubling
                 sizes up to every distinct expert of the trace
  --json         print the table as JSON`;

/** Parses --sizes into slot counts. */
export function parseSizes(value: string, expertBytes: number): number[] {
  return value.split(",").map((s) => s.trim()).filter((s) => s).map((s) => {
    const gb = /^(\d+(?:\.\d+)?)\s*GB$/i.exec(s);
    const n = gb ? Math.floor((Number(gb[1]) * 1e9) / Math.max(1, expertBytes)) : Number(s);
    if (!Number.isInteger(n) || n < 1) {
      throw badInput(`--sizes: '${s}' is not a slot count >= 1 or a size like 2GB`);
    }
    return n;
  });
}

/** The flags `k3 sim-cache` parses (docs/CLI.md lists each; tests/repo/cli_docs.test.ts checks). */
export const OPTIONS = {
  sizes: { type: "string" },
  json: { type: "boolean" },
  help: { type: "boolean", short: "h" },
} as const;

export async function simCacheCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(args, OPTIONS, HELP);
  if (!parsed) return ExitCode.ok;
  const { values, positionals } = parsed;
  if (positionals.length !== 1) {
    throw badInput("usage: k3 sim-cache TRACE [--sizes LIST] (see --help)");
  }
  const trace = await readTrace(positionals[0]);
  const keys = traceKeys(trace);
  const distinct = new Set(keys).size;
  const tokens = Math.max(1, new Set(trace.records.map((r) => r.step)).size);
  const bytes = trace.header.expert_bytes;
  const sizes = values.sizes ? parseSizes(values.sizes, bytes) : defaultSizes(distinct);
  const rows = sizes.map((slots) => {
    const lru = simulateLru(keys, slots), belady = simulateBelady(keys, slots);
    const pin = simulatePinnedLru(keys, slots, trace.header.experts);
    const pct = (r: { hits: number }) => (keys.length ? (100 * r.hits) / keys.length : 0);
    const gbTok = (r: { misses: number }) => (r.misses * bytes) / 1e9 / tokens;
    return {
      slots,
      gb: (slots * bytes) / 1e9,
      lru_hits: lru.hits,
      belady_hits: belady.hits,
      pinned_lru_hits: pin.hits,
      lru_pct: pct(lru),
      belady_pct: pct(belady),
      pinned_lru_pct: pct(pin),
      lru_gb_per_token: gbTok(lru),
      belady_gb_per_token: gbTok(belady),
    };
  });
  if (values.json) {
    console.log(
      JSON.stringify(
        { requests: keys.length, distinct, tokens, compulsory_misses: distinct, rows },
        null,
        2,
      ),
    );
    return ExitCode.ok;
  }
  console.log(
    `trace: ${keys.length} requests, ${distinct} distinct experts, ${tokens} token(s); ` +
      `${(bytes / 1e6).toFixed(2)} MB per expert`,
  );
  console.log(`      SLOTS        GB      LRU   BELADY  PIN+LRU   LRU GB/TOK   BELADY GB/TOK`);
  for (const r of rows) {
    console.log(
      `${String(r.slots).padStart(11)} ${r.gb.toFixed(3).padStart(9)} ${
        r.lru_pct.toFixed(2).padStart(7)
      }% ` +
        `${r.belady_pct.toFixed(2).padStart(7)}% ${r.pinned_lru_pct.toFixed(2).padStart(7)}% ` +
        `${r.lru_gb_per_token.toFixed(4).padStart(12)} ${
          r.belady_gb_per_token.toFixed(4).padStart(15)
        }`,
    );
  }
  const ceiling = keys.length ? (100 * (keys.length - distinct)) / keys.length : 0;
  console.log(
    `compulsory misses: ${distinct} (every expert is read at least once): no policy at any ` +
      `size beats a ${ceiling.toFixed(2)}% hit rate on this trace`,
  );
  return ExitCode.ok;
}

/** 1, 2, 4, ... up to the first size holding every distinct expert. */
function defaultSizes(distinct: number): number[] {
  const out: number[] = [];
  for (let s = 1;; s *= 2) {
    out.push(Math.min(s, Math.max(1, distinct)));
    if (s >= distinct) break;
  }
  return out;
}
