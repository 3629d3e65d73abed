/**
 * `make bench-codec`: the lossless BF16 codec (csrc/codec.c) on normal weights (std
 * 1/sqrt(fan-in), seeded) against plain BF16, by build/codec_bench (csrc/tests/codec_bench.c):
 * - coded size over BF16 size, the measured exponent entropy, the escape rate, and the
 *   table-driven entropy code it was chosen against (size and decode speed);
 * - matrix x 1 and x 4 (T = 1, 4) in weights per second from DRAM (a matrix several times the
 *   last-level cache), logical (BF16 bytes / s) and physical (bytes read / s), the coded kernel
 *   against k3_matmul_bf16 in the same process, medians of 3, at OMP_NUM_THREADS 1 and 2;
 * - the same kernels on a block that fits in L2 (decode cost with no memory limit);
 * - each on the fastest path the CPU has (the ISA is printed), and the AVX2 path beside it
 *   when the fastest is AVX-512 (K3_ISA=avx2, a second process right after).
 * The load average is printed with every figure: the machine may be shared.
 *
 * Usage: deno run -A bench/codec.ts [--rows N] [--cols N] [--json FILE]
 */
import * as path from "node:path";

const repo = path.resolve(import.meta.dirname!, "..");

function flag(name: string, fallback: string): string {
  const at = Deno.args.indexOf(name);
  return at >= 0 ? Deno.args[at + 1] : fallback;
}
const rows = Number(flag("--rows", "40960")), cols = Number(flag("--cols", "7168"));
const json = flag("--json", path.join(repo, "build/bench-codec.json"));

interface Run {
  isa: string;
  threads: number;
  bf16_bytes: number;
  exponent_entropy: number;
  sign_exponent_entropy: number;
  coded_bytes: number;
  escape_rate: number;
  decode_s: number;
  huffman_bytes: number;
  huffman_decode_s: number;
  bf16_t1_s: number;
  coded_t1_s: number;
  bf16_t4_s: number;
  coded_t4_s: number;
  cache_weights: number;
  bf16_cache_t1_s: number;
  coded_cache_t1_s: number;
}

function load(): string {
  return Deno.loadavg().map((l) => l.toFixed(2)).join(" ");
}

/** One codec_bench run: the study too (the single-threaded decoders) unless `kernelsOnly`;
 * `isa` forces a path (K3_ISA), else libk3 takes the fastest the CPU has. */
async function run(threads: number, kernelsOnly: boolean, isa?: string): Promise<Run> {
  const out = await new Deno.Command(path.join(repo, "build/codec_bench"), {
    args: [String(rows), String(cols), "3", ...(kernelsOnly ? ["kernels"] : [])],
    env: { OMP_NUM_THREADS: String(threads), ...(isa ? { K3_ISA: isa } : {}) },
    stderr: "inherit",
  }).output();
  if (out.code !== 0) throw new Error(`codec_bench exited ${out.code}`);
  return JSON.parse(new TextDecoder().decode(out.stdout));
}

const f2 = (v: number) => v.toFixed(2), f3 = (v: number) => v.toFixed(3);
/** Each thread count: the fastest path, then the AVX2 path beside it when that is another
 * one (same process layout, right after; the BF16 kernel is measured again in each). */
const runs: { threads: number; loadBefore: string; loadAfter: string; r: Run; avx2?: Run }[] = [];
for (const threads of [1, 2]) {
  const loadBefore = load();
  const r = await run(threads, threads !== 1);
  const avx2 = r.isa === "avx512" ? await run(threads, true, "avx2") : undefined;
  runs.push({ threads, loadBefore, loadAfter: load(), r, avx2 });
}

const a = runs[0].r, weights = a.bf16_bytes / 2;
console.log(
  `bench-codec: ${rows} x ${cols} normal BF16 weights (${
    f2(a.bf16_bytes / 1e9)
  } GB), fastest ISA path ${a.isa}`,
);
console.log(
  `  exponent entropy ${f3(a.exponent_entropy)} bits (sign+exponent ${
    f3(a.sign_exponent_entropy)
  }); ` +
    `published for trained models: about 2.6 (DFloat11)`,
);
console.log(
  `  chosen code (3-bit exponent by row block + escapes): ${
    f3(a.coded_bytes / a.bf16_bytes)
  }x BF16, ` +
    `escapes ${(100 * a.escape_rate).toFixed(2)}% of weights; portable decode to memory ` +
    `${f2(weights / a.decode_s / 1e9)} G weights/s`,
);
console.log(
  `  entropy code (canonical Huffman of the exponent, table-driven): ${
    f3(a.huffman_bytes / a.bf16_bytes)
  }x BF16; ` +
    `decode to memory ${f2(weights / a.huffman_decode_s / 1e9)} G weights/s`,
);
/** The kernel lines of one run, its coded kernel on path `r.isa`. */
function kernelLines(r: Run) {
  for (const T of [1, 4]) {
    const bf = T === 1 ? r.bf16_t1_s : r.bf16_t4_s, cx = T === 1 ? r.coded_t1_s : r.coded_t4_s;
    console.log(
      `  T=${T}: bf16 ${f2(r.bf16_bytes / bf / 1e9)} GB/s | coded (${r.isa}) ${
        f2(r.bf16_bytes / cx / 1e9)
      } GB/s logical, ` +
        `${f2(r.coded_bytes / cx / 1e9)} GB/s physical | coded/bf16 ${f3(bf / cx)}x`,
    );
  }
  const cw = r.cache_weights;
  console.log(
    `  in L2 (${cw} weights, T=1, fastest of 400): bf16 ${
      f2(cw / r.bf16_cache_t1_s / 1e9)
    } G weights/s, ` +
      `coded (${r.isa}) ${f2(cw / r.coded_cache_t1_s / 1e9)} G weights/s`,
  );
}
for (const { threads, loadBefore, loadAfter, r, avx2 } of runs) {
  console.log(`OMP_NUM_THREADS=${threads} (load average ${loadBefore} -> ${loadAfter}):`);
  kernelLines(r);
  if (avx2) kernelLines(avx2);
}
await Deno.mkdir(path.dirname(json), { recursive: true });
await Deno.writeTextFile(json, JSON.stringify({ rows, cols, runs }, null, 2) + "\n");
console.log(`wrote ${json}`);
