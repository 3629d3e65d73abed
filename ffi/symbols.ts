/**
 * The one FFI border between TypeScript and libk3. Every entry mirrors a prototype in
 * `csrc/k3.h` (read the contracts there); each parameter is commented with its C name.
 *
 * Conventions: activations are `buffer` (any typed array, shared, not copied); weights and
 * native allocations are `pointer`; sizes are `i32`; file offsets and byte counts are `i64`
 * (bigint in TypeScript).
 *
 * The long kernels also have an `_nb` twin (the same C function, `nonblocking: true`): Deno
 * runs it on a worker thread and returns a Promise, so the event loop (HTTP, timers, signals)
 * keeps turning while C computes. A twin costs 15-75 us per call, so the forward pass calls it
 * only for work that takes longer than that by far (lib/model/forward.ts). The worker thread
 * has a 2 MiB stack: these kernels keep their large arrays on the heap.
 */
const blocking = {
  // ---- library ----
  k3_version: { parameters: [], result: "pointer" },
  k3_num_threads: { parameters: [], result: "i32" },
  k3_isa: { parameters: [], result: "pointer" },

  // ---- memory and reads ----
  k3_alloc: { parameters: ["i64" /* bytes */], result: "pointer" },
  k3_free: { parameters: ["pointer" /* p */], result: "void" },
  k3_open_read: { parameters: ["buffer", /* path */ "i32" /* direct */], result: "i32" },
  k3_close: { parameters: ["i32" /* fd */], result: "i32" },
  k3_file_size: { parameters: ["i32" /* fd */], result: "i64" },
  k3_pread_full: {
    parameters: ["i32", /* fd */ "pointer", /* dst */ "i64", /* offset */ "i64" /* nbytes */],
    result: "i64",
  },
  k3_peak_rss_bytes: { parameters: [], result: "i64" },

  // ---- linear algebra ----
  k3_matmul_bf16: {
    parameters: [
      "buffer", /* y */
      "pointer", /* w */
      "buffer", /* x */
      "i32", /* rows */
      "i32", /* cols */
      "i32", /* T */
    ],
    result: "void",
  },
  k3_matmul_bf16_rows: {
    parameters: [
      "buffer", /* y */
      "pointer", /* w */
      "buffer", /* x */
      "i32", /* rows */
      "i32", /* cols */
      "i32", /* T */
      "i32", /* y_stride */
    ],
    result: "i32",
  },
  k3_matmul_mxfp4: {
    parameters: [
      "buffer", /* y */
      "pointer", /* packed */
      "pointer", /* scales */
      "buffer", /* x */
      "i32", /* rows */
      "i32", /* cols */
      "i32", /* group */
      "i32", /* T */
    ],
    result: "i32",
  },

  // ---- lossless BF16 coding ----
  k3_codec_bound: {
    parameters: ["i32", /* rows */ "i32", /* cols */ "i32" /* block_rows */],
    result: "i64",
  },
  k3_codec_encode: {
    parameters: [
      "buffer", /* dst */
      "i64", /* capacity */
      "buffer", /* w */
      "i32", /* rows */
      "i32", /* cols */
      "i32", /* block_rows */
    ],
    result: "i64",
  },
  k3_codec_check: { parameters: ["buffer", /* src */ "i64" /* size */], result: "i32" },
  k3_codec_decode: {
    parameters: ["buffer", /* w */ "buffer", /* src */ "i64" /* size */],
    result: "i32",
  },
  k3_codec_strerror: { parameters: ["i32" /* code */], result: "pointer" },
  k3_matmul_coded: {
    parameters: [
      "buffer", /* y */
      "pointer", /* src */
      "i64", /* size */
      "buffer", /* x */
      "i32", /* T */
    ],
    result: "i32",
  },
  k3_matmul_coded_rows: {
    parameters: [
      "buffer", /* y */
      "pointer", /* src */
      "i64", /* size */
      "buffer", /* x */
      "i32", /* T */
      "i32", /* y_stride */
    ],
    result: "i32",
  },

  // ---- element-wise and norms ----
  k3_rmsnorm: {
    parameters: [
      "buffer", /* y */
      "buffer", /* x */
      "buffer", /* w */
      "i32", /* n */
      "f32", /* eps */
      "i32", /* T */
    ],
    result: "void",
  },
  k3_l2norm_heads: {
    parameters: [
      "buffer", /* x */
      "i32", /* heads */
      "i32", /* dim */
      "f32", /* eps */
      "f32", /* scale */
      "i32", /* T */
    ],
    result: "void",
  },
  k3_situ_glu: {
    parameters: [
      "buffer", /* out */
      "buffer", /* gate */
      "buffer", /* up */
      "i32", /* n */
      "f32", /* b1 */
      "f32", /* b2 */
      "i32", /* T */
    ],
    result: "void",
  },
  k3_add: { parameters: ["buffer", /* y */ "buffer", /* x */ "i32" /* n */], result: "void" },
  k3_mul_sigmoid: {
    parameters: ["buffer", /* y */ "buffer", /* g */ "i32" /* n */],
    result: "void",
  },
  k3_sigmoid: { parameters: ["buffer", /* y */ "buffer", /* x */ "i32" /* n */], result: "void" },
  k3_embed_bf16: {
    parameters: [
      "buffer", /* out */
      "pointer", /* table */
      "buffer", /* ids */
      "i32", /* vocab */
      "i32", /* H */
      "i32", /* T */
    ],
    result: "i32",
  },
  k3_attn_res: {
    parameters: [
      "buffer", /* out */
      "buffer", /* bank */
      "i32", /* nb */
      "i32", /* bank_stride */
      "buffer", /* p */
      "buffer", /* sw */
      "i32", /* H */
      "f32", /* eps */
      "i32", /* T */
    ],
    result: "void",
  },

  // ---- KDA ----
  k3_kda_conv: {
    parameters: [
      "buffer", /* out */
      "buffer", /* hist */
      "buffer", /* x */
      "buffer", /* w */
      "i32", /* C */
      "i32", /* K */
      "i32", /* T */
    ],
    result: "void",
  },
  k3_kda_gate: {
    parameters: [
      "buffer", /* alpha */
      "buffer", /* g */
      "buffer", /* dt_bias */
      "buffer", /* A_log */
      "i32", /* heads */
      "i32", /* dim */
      "f32", /* lb */
      "i32", /* T */
    ],
    result: "void",
  },
  k3_kda_recurrence: {
    parameters: [
      "buffer", /* o */
      "buffer", /* S */
      "buffer", /* q */
      "buffer", /* k */
      "buffer", /* v */
      "buffer", /* alpha */
      "buffer", /* beta */
      "i32", /* heads */
      "i32", /* dim */
      "i32", /* T */
    ],
    result: "void",
  },
  k3_gated_rmsnorm_heads: {
    parameters: [
      "buffer", /* y */
      "buffer", /* o */
      "buffer", /* w */
      "buffer", /* gate */
      "i32", /* heads */
      "i32", /* dim */
      "f32", /* eps */
      "i32", /* T */
    ],
    result: "void",
  },

  // ---- MLA ----
  k3_mla_absorb_q: {
    parameters: [
      "buffer", /* q_abs */
      "buffer", /* q */
      "pointer", /* kv_b */
      "i32", /* nh */
      "i32", /* dn */
      "i32", /* dr */
      "i32", /* dv */
      "i32", /* rkv */
      "i32", /* T */
    ],
    result: "void",
  },
  k3_mla_attend: {
    parameters: [
      "buffer", /* o_lat */
      "buffer", /* q_abs */
      "buffer", /* cache */
      "i32", /* pos0 */
      "i32", /* T */
      "i32", /* nh */
      "i32", /* rkv */
      "i32", /* dr */
      "f32", /* scale */
    ],
    result: "i32",
  },
  k3_mla_expand_o: {
    parameters: [
      "buffer", /* o */
      "buffer", /* o_lat */
      "pointer", /* kv_b */
      "i32", /* nh */
      "i32", /* dn */
      "i32", /* dv */
      "i32", /* rkv */
      "i32", /* T */
    ],
    result: "void",
  },

  // ---- MoE ----
  k3_router_topk: {
    parameters: [
      "buffer", /* ids */
      "buffer", /* weights */
      "buffer", /* logits */
      "buffer", /* bias */
      "i32", /* E */
      "i32", /* k */
      "i32", /* renorm */
      "f32", /* scale */
      "i32", /* T */
    ],
    result: "i32",
  },
  k3_moe_combine: {
    parameters: [
      "buffer", /* acc */
      "buffer", /* y */
      "buffer", /* w */
      "i32", /* k */
      "i32", /* n */
    ],
    result: "void",
  },

  // ---- background reads, fault hook, memory limits ----
  k3_io_pool_new: { parameters: ["i32" /* workers */], result: "pointer" },
  k3_io_pool_free: { parameters: ["pointer" /* p */], result: "void" },
  k3_io_submit: {
    parameters: [
      "pointer", /* p */
      "i32", /* klass */
      "i32", /* fd */
      "pointer", /* dst */
      "i64", /* offset */
      "i64", /* nbytes */
    ],
    result: "i64",
  },
  k3_io_wait: { parameters: ["pointer", /* p */ "i64" /* ticket */], result: "i64" },
  k3_io_poll: { parameters: ["pointer", /* p */ "i64" /* ticket */], result: "i32" },
  k3_io_stats: { parameters: ["pointer", /* p */ "buffer" /* out */], result: "void" },
  k3_fault_next_read: { parameters: [], result: "i32" },
  k3_mem_available_bytes: { parameters: [], result: "i64" },
  k3_cgroup_memory_max_bytes: { parameters: [], result: "i64" },
  // ---- SHA-256 (state in caller memory; nonblocking: runs off the JS thread) ----
  k3_sha256_impl: { parameters: [], result: "pointer" },
  k3_sha256_init: { parameters: ["buffer" /* state */], result: "void" },
  k3_sha256_blocks: {
    parameters: ["buffer", /* state */ "buffer", /* data */ "i64" /* nbytes */],
    result: "i32",
    nonblocking: true,
  },
  k3_sha256_final: {
    parameters: [
      "buffer", /* state */
      "buffer", /* tail */
      "i64", /* tail_len */
      "i64", /* total_len */
      "buffer", /* out */
    ],
    result: "i32",
  },
} as const satisfies Deno.ForeignLibraryInterface;

type Kernel = keyof typeof blocking;

/** The nonblocking twins of `names`: `<name>_nb`, the same C symbol off the JS thread. */
type OffThread<N extends Kernel> = {
  readonly [K in N as `${K}_nb`]: (typeof blocking)[K] & {
    readonly name: K;
    readonly nonblocking: true;
  };
};

function offThread<N extends Kernel>(names: readonly N[]): OffThread<N> {
  const twins = names.map((name) => [`${name}_nb`, { ...blocking[name], name, nonblocking: true }]);
  return Object.fromEntries(twins) as OffThread<N>;
}

/** Every symbol: the blocking table and the twins of the kernels that can run long. */
export const symbols = {
  ...blocking,
  ...offThread([
    "k3_matmul_bf16_rows",
    "k3_matmul_coded_rows",
    "k3_matmul_mxfp4",
    "k3_rmsnorm",
    "k3_l2norm_heads",
    "k3_situ_glu",
    "k3_add",
    "k3_mul_sigmoid",
    "k3_sigmoid",
    "k3_embed_bf16",
    "k3_attn_res",
    "k3_kda_conv",
    "k3_kda_gate",
    "k3_kda_recurrence",
    "k3_gated_rmsnorm_heads",
    "k3_mla_absorb_q",
    "k3_mla_attend",
    "k3_mla_expand_o",
    "k3_router_topk",
    "k3_io_wait",
  ]),
} as const satisfies Deno.ForeignLibraryInterface;

export type K3Symbols = typeof symbols;
