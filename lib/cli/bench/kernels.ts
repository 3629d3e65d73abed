/**
 * `k3 bench kernels`: the hot kernels at K3's true shapes, from buffers larger than the
 * last-level cache, against the machine's measured read bandwidth.
 *
 * OpenMP reads OMP_NUM_THREADS when libk3 loads, so each thread count runs in its own
 * child process (`k3 bench kernels --child`), which prints one JSON result per line; the
 * parent adds the speed-up over the portable scalar path (another child, K3_ISA=scalar)
 * and prints the table.
 */
import * as path from "node:path";
import { k3, k3Isa, k3Threads } from "../../../ffi/library.ts";
import { badInput } from "../../errors.ts";

/** One timed kernel, as written to `--json`. */
interface KernelResult {
  kernel: string;
  shape: string;
  threads: number;
  isa: string;
  /** Median milliseconds of one call (one sweep over every expert for "x16" shapes). */
  ms: number;
  /** Weight bytes streamed per second, GB/s (1e9). */
  gbps: number;
  stream_gbps: number;
  /** gbps / stream_gbps. */
  fraction: number;
  gflops: number;
  /** Speed-up over the portable scalar path (K3_ISA=scalar), same threads. */
  speedup?: number;
}

/** Every buffer a timed call reads adds up to at least this, so caches cannot hold it. */
const SWEEP_BYTES = 512 * 2 ** 20;
/** The scalar reference times at most this many weight bytes per call (it is slow). */
const SCALAR_BYTES = 48 * 2 ** 20;
const SCALAR_FMAS = 4e8;
const REPEATS = 5;

interface Case {
  kernel: "bf16" | "mxfp4";
  name: string;
  rows: number;
  cols: number;
  /** Matrices per call (16 experts are one call of the benchmark, one after the other). */
  count: number;
  T: number;
}

/** K3's hot shapes (MODEL.md §3.3): rows = outputs, cols = inputs. */
const CASES: Case[] = [
  { kernel: "mxfp4", name: "expert up 3584->3072 x16", rows: 3072, cols: 3584, count: 16, T: 1 },
  { kernel: "mxfp4", name: "expert down 3072->3584 x16", rows: 3584, cols: 3072, count: 16, T: 1 },
  { kernel: "bf16", name: "7168->12288", rows: 12288, cols: 7168, count: 1, T: 1 },
  { kernel: "bf16", name: "12288->7168", rows: 7168, cols: 12288, count: 1, T: 1 },
  { kernel: "bf16", name: "7168->3584", rows: 3584, cols: 7168, count: 1, T: 1 },
  { kernel: "bf16", name: "3584->7168", rows: 7168, cols: 3584, count: 1, T: 1 },
  { kernel: "bf16", name: "router 7168->896", rows: 896, cols: 7168, count: 1, T: 1 },
  { kernel: "bf16", name: "lm_head 7168->163840", rows: 163840, cols: 7168, count: 1, T: 1 },
  { kernel: "bf16", name: "prefill 7168->3584", rows: 3584, cols: 7168, count: 1, T: 64 },
  { kernel: "bf16", name: "prefill 7168->3584", rows: 3584, cols: 7168, count: 1, T: 512 },
  { kernel: "mxfp4", name: "prefill expert 3584->3072", rows: 3072, cols: 3584, count: 1, T: 64 },
  { kernel: "mxfp4", name: "prefill expert 3584->3072", rows: 3072, cols: 3584, count: 1, T: 512 },
];

/** Weight bytes of one matrix (MXFP4: packed nibbles plus one scale byte per 32). */
function matrixBytes(c: Case): number {
  return c.kernel === "bf16" ? c.rows * c.cols * 2 : c.rows * c.cols / 2 + c.rows * c.cols / 32;
}

/** A native buffer of `bytes`, pre-faulted by k3_alloc, filled by repeating `block`. */
function nativeFilled(bytes: number, block: Uint8Array): Deno.PointerObject {
  const p = k3().k3_alloc(BigInt(bytes));
  if (p === null) throw badInput(`bench: cannot allocate ${bytes} bytes; free memory first`);
  const CHUNK = 256 * 2 ** 20;
  for (let at = 0; at < bytes; at += CHUNK) {
    const n = Math.min(CHUNK, bytes - at);
    const view = new Uint8Array(
      Deno.UnsafePointerView.getArrayBuffer(Deno.UnsafePointer.offset(p, at)!, n),
    );
    for (let i = 0; i < n; i += block.length) {
      view.set(block.subarray(0, Math.min(block.length, n - i)), i);
    }
  }
  return p;
}

/** 1 MiB of weight bytes: BF16 values in (-1, 1), or MXFP4 codes with the scales after. */
function weightBlock(kind: Case["kernel"]): Uint8Array {
  const block = new Uint8Array(2 ** 20);
  let s = 0x9e3779b9;
  const next = () => (s = (Math.imul(s ^ (s >>> 15), 0x2c1b3c6d) + 0x6d2b79f5) >>> 0);
  if (kind === "bf16") {
    const f = new Float32Array(1);
    const u = new Uint32Array(f.buffer);
    const w = new Uint16Array(block.buffer);
    for (let i = 0; i < w.length; i++) {
      f[0] = next() / 2 ** 32 * 2 - 1;
      w[i] = u[0] >>> 16;
    }
  } else {
    for (let i = 0; i < block.length; i++) block[i] = next() & 255;
  }
  return block;
}

/** Median of a list of numbers. */
function median(v: number[]): number {
  const s = [...v].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

/** Median ms of `call` over `repeats` runs (after one warm-up). */
function timeIt(call: () => void, repeats: number): number {
  call();
  const times: number[] = [];
  for (let i = 0; i < repeats; i++) {
    const t0 = performance.now();
    call();
    times.push(performance.now() - t0);
  }
  return median(times);
}

/**
 * STREAM-like read bandwidth in GB/s: a BF16 matrix of 64 columns (128-byte rows) times one
 * vector, over 2 GiB. Each row costs eight fused multiply-adds, so this is a sequential read
 * of the whole buffer split across the threads, and nothing else. (A scalar build would be
 * compute-bound: measure it on the automatic path only.)
 */
export function streamReadGbps(): number {
  const lib = k3(), bytes = 2 * 2 ** 30, cols = 64, rows = bytes / (cols * 2);
  const w = nativeFilled(bytes, weightBlock("bf16"));
  const x = new Float32Array(cols).fill(0.5), y = new Float32Array(rows);
  try {
    const ms = timeIt(() => lib.k3_matmul_bf16(y, w, x, rows, cols, 1), REPEATS);
    return bytes / (ms / 1000) / 1e9;
  } finally {
    lib.k3_free(w);
  }
}

/** Rows the scalar reference times: at most SCALAR_BYTES of weights and SCALAR_FMAS. */
function scalarRows(c: Case): number {
  const byBytes = Math.floor(SCALAR_BYTES / matrixBytes({ ...c, rows: 1 }));
  const byWork = Math.floor(SCALAR_FMAS / (c.cols * c.T * c.count));
  return Math.max(4, Math.min(c.rows, byBytes, byWork));
}

/** Times one case; `scalar` limits the rows so the slow portable path stays short. */
function runCase(c: Case, stream: number, scalar: boolean): KernelResult {
  const lib = k3();
  const rows = scalar ? scalarRows(c) : c.rows;
  const shape = { ...c, rows };
  const one = matrixBytes(shape);
  // Enough copies that one call's weights plus the next calls' exceed the caches.
  const copies = Math.max(1, Math.ceil(SWEEP_BYTES / (one * c.count)));
  const mats = Math.max(c.count, scalar ? c.count : copies * c.count);
  const block = weightBlock(c.kernel);
  const buf = nativeFilled(one * mats, block);
  const x = new Float32Array(c.T * c.cols).map((_, i) => Math.sin(i) * 0.5);
  const y = new Float32Array(c.T * rows);
  const at = (m: number) => Deno.UnsafePointer.offset(buf, m * one)!;
  const packed = c.kernel === "mxfp4" ? rows * c.cols / 2 : 0;
  if (c.kernel === "mxfp4") {
    // Scales in 120..134 after the packed nibbles of every matrix.
    for (let m = 0; m < mats; m++) {
      const view = new Uint8Array(
        Deno.UnsafePointerView.getArrayBuffer(
          Deno.UnsafePointer.offset(buf, m * one + packed)!,
          one - packed,
        ),
      );
      for (let i = 0; i < view.length; i++) view[i] = 120 + (i * 7) % 15;
    }
  }
  let next = 0;
  const call = () => {
    for (let e = 0; e < c.count; e++) {
      const m = next++ % mats;
      if (c.kernel === "bf16") lib.k3_matmul_bf16(y, at(m), x, rows, c.cols, c.T);
      else {
        const rc = lib.k3_matmul_mxfp4(
          y,
          at(m),
          Deno.UnsafePointer.offset(at(m), packed)!,
          x,
          rows,
          c.cols,
          32,
          c.T,
        );
        if (rc !== 0) throw new Error(`k3_matmul_mxfp4 returned ${rc}`);
      }
    }
  };
  try {
    const ms = timeIt(call, scalar ? 1 : REPEATS);
    const gbps = one * c.count / (ms / 1000) / 1e9;
    return {
      kernel: c.kernel,
      shape: c.T === 1 ? c.name : `${c.name} T=${c.T}`,
      threads: k3Threads(),
      isa: k3Isa(),
      ms,
      gbps,
      stream_gbps: stream,
      fraction: gbps / stream,
      gflops: 2 * rows * c.cols * c.count * c.T / (ms / 1000) / 1e9,
    };
  } finally {
    lib.k3_free(buf);
  }
}

/** The child: prints the stream result and then one JSON line per case. */
export function runKernelsChild(scalar: boolean): void {
  const stream = scalar ? 0 : streamReadGbps();
  for (const c of CASES) console.log(JSON.stringify(runCase(c, stream, scalar)));
}

/** Runs `k3 bench kernels --child` with `threads` OpenMP threads; returns its results. */
async function childResults(threads: number, scalar: boolean): Promise<KernelResult[]> {
  const main = path.join(import.meta.dirname!, "..", "..", "main.ts");
  const env: Record<string, string> = { OMP_NUM_THREADS: String(threads), OMP_PROC_BIND: "false" };
  if (scalar) env.K3_ISA = "scalar";
  const out = await new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "--quiet",
      "-A",
      main,
      "bench",
      "kernels",
      "--child",
      ...(scalar ? ["--scalar"] : []),
    ],
    env,
    stdout: "piped",
    stderr: "inherit",
  }).output();
  if (out.code !== 0) throw new Error(`bench child (${threads} threads) exited with ${out.code}`);
  return new TextDecoder().decode(out.stdout).trim().split("\n").map((l) => JSON.parse(l));
}

/** Prints one table row. */
function formatRow(r: KernelResult): string {
  const cols = [
    r.kernel.padEnd(6),
    r.shape.padEnd(36),
    String(r.threads).padStart(3),
    r.ms.toFixed(2).padStart(9),
    r.gbps.toFixed(1).padStart(7),
    r.stream_gbps.toFixed(1).padStart(7),
    `${(100 * r.fraction).toFixed(0)}%`.padStart(6),
    r.gflops.toFixed(1).padStart(8),
    r.speedup === undefined ? "" : `${r.speedup.toFixed(1)}x`.padStart(8),
  ];
  return cols.join(" ");
}

/** The parent: every thread count in a child, the table, the JSON file. */
export async function benchKernels(threads: number[], jsonFile?: string): Promise<KernelResult[]> {
  const all: KernelResult[] = [];
  console.log(
    `${"kernel".padEnd(6)} ${
      "shape".padEnd(36)
    } thr        ms    GB/s  stream  frac   GFLOP/s vs scalar`,
  );
  for (const n of threads) {
    const [fast, slow] = [await childResults(n, false), await childResults(n, true)];
    fast.forEach((r, i) => {
      r.speedup = r.gbps / slow[i].gbps;
      all.push(r);
      console.log(formatRow(r));
    });
  }
  if (jsonFile) await Deno.writeTextFile(jsonFile, JSON.stringify(all, null, 2) + "\n");
  return all;
}
