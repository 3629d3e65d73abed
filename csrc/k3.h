/* libk3: the numeric kernels and the reads behind k3.
 *
 * Contracts that hold for every function here:
 *  - Activations are fp32. Weights stay as stored: BF16 (uint16 bit patterns, widened
 *    exactly), F32, or MXFP4 (packed nibbles + E8M0 scales, decoded exactly).
 *  - Batched kernels take T tokens laid out token-major ([T][n]). Token t's result never
 *    depends on T, on the other tokens, on the thread count or on the SIMD path: every
 *    reduction runs in one canonical order (below), so prefill, decode and recompute agree
 *    byte for byte.
 *  - Threads (OpenMP, or libk3's own pool: parallel.h) split independent outputs (rows,
 *    heads), never one reduction.
 *  - No global state except the ISA choice, made once (k3_isa) and read-only afterwards, and
 *    the thread pool of builds without OpenMP (parallel.c).
 *  - Sizes are int (every K3 dimension fits), file offsets and byte counts are int64_t.
 *
 * Canonical dot order ("8-lane order"): lane l (0..7) accumulates the products of
 * elements i with i % 8 == l, in increasing i, each step one fused multiply-add, from 0.
 * The lanes are then combined as ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
 * MXFP4 rows have their own order ("MXFP4 group order"). A code is decoded to code2,
 * twice its E2M1 value (an integer in [-12, 12]), and the group's scale byte s to
 * 2^(s-128): the same weight, with the factor 2 moved into the scale. For group g
 * (columns g*G .. g*G+G-1), four partials q0..q3 start at 0; the column at offset o in
 * the group goes to q[(o mod 16) div 4], in increasing o, each step q = fma(code2, x, q).
 * Then for p = 0..3, acc[4*(g mod 2) + p] = fma(q[p], 2^(s-128), acc[4*(g mod 2) + p]),
 * acc[0..7] from 0, and the row folds acc in the tree above. (This is what a 256-bit
 * register holds when two groups' nibbles are decoded by byte lookups: simd_avx2.c.)
 * "Sequential order" means a plain left-to-right fma/add chain from 0.
 */
#ifndef K3_H
#define K3_H

#include <stdint.h>

/* ---- library ------------------------------------------------------------------------ */

/* Version string of the library, static storage. */
const char *k3_version(void);
/* Team size of the kernels' threads: OMP_NUM_THREADS (read when the library loads, by
 * OpenMP or by libk3's own pool, whichever the build uses) or one per CPU. */
int k3_num_threads(void);
/* The SIMD path in use: "scalar", "avx2", "avx512" or "neon" (the widest the CPU has).
 * K3_ISA=scalar in the environment forces the portable path, K3_ISA=avx2 the AVX2 one; the
 * choice is made on first use. Every path gives the same bytes. */
const char *k3_isa(void);

/* ---- memory and reads (io.c) -------------------------------------------------------- */

/* Where a read may land. Every read of libk3 (k3_pread_full, k3_io_submit) lands only in
 * memory that k3_alloc handed out, and only inside ONE such block: C keeps a registry of
 * its blocks (base, size, reads in flight) and refuses with -EFAULT a read whose
 * [dst, dst + nbytes) is not inside one, before touching anything. k3_free waits for the
 * reads still landing in the block, so no read ever lands in freed memory.
 * Why a registry rather than a capacity argument: a capacity is computed by the same
 * TypeScript that computes the read, so the bug that asks for too many bytes can pass too
 * large a capacity with it. The registry is C's own record of what it allocated; no value
 * TypeScript passes can widen it. It cannot tell two layers inside one ring buffer apart:
 * that is the pack index's validation (lib/checkpoint/pack.ts). Cost: a binary search under
 * one mutex per read. */

/* 4096-aligned allocation of `bytes`, every page touched once (pre-faulted) so that later
 * use runs at memory speed, and recorded in the block registry. Returns NULL when the
 * system refuses. Free with k3_free. */
void *k3_alloc(int64_t bytes);
/* Frees a block of k3_alloc, after waiting for the reads still landing in it. Any other
 * pointer (or NULL) is ignored, never passed to free(). */
void k3_free(void *p);
/* Opens `path` (NUL-terminated UTF-8) read-only; direct != 0 asks to bypass the page cache
 * (O_DIRECT; F_NOCACHE on macOS, FILE_FLAG_NO_BUFFERING on Windows; buffered when the file
 * system refuses). Returns an fd >= 0 or -errno. */
int k3_open_read(const char *path, int direct);
int k3_close(int fd);
/* Size of the open file in bytes, or -errno. */
int64_t k3_file_size(int fd);
/* Reads exactly `nbytes` at `offset` into `dst`, retrying short reads. Returns nbytes,
 * or the count read before EOF (short), or -errno: -EFAULT when [dst, dst + nbytes) is not
 * inside one block of k3_alloc (nothing is read), -EINVAL for a negative offset or size.
 * Never reports success on a short read. */
int64_t k3_pread_full(int fd, void *dst, int64_t offset, int64_t nbytes);
/* Peak resident set size of the process so far, in bytes (VmHWM; on Windows the peak
 * working set), or -errno. */
int64_t k3_peak_rss_bytes(void);

/* ---- linear algebra (linear.c) ------------------------------------------------------ */

/* y[t][r] = sum_c w[r][c] * x[t][c] for r < rows, t < T; w is BF16 [rows][cols].
 * 8-lane order over c. */
void k3_matmul_bf16(float *y, const uint16_t *w, const float *x, int rows, int cols, int T);

/* The same product for a row block of a larger matrix: writes y[t*y_stride + r] for
 * r < rows, t < T (nothing else), so the caller passes y at its first row. Each output is
 * the same dot as in k3_matmul_bf16, so cutting a matrix into row blocks gives the same
 * bytes. Returns 0, or -1 (writing nothing) when y_stride < rows or a size is negative. */
int k3_matmul_bf16_rows(float *y, const uint16_t *w, const float *x, int rows, int cols, int T,
                        int y_stride);

/* y[t][r] = sum_c W[r][c] * x[t][c] with W in MXFP4: packed [rows][cols/2] (low nibble =
 * even column), scales [rows][cols/group] E8M0. `group` must be a multiple of 8 dividing
 * cols. Returns 0, or -1 when a scale byte is 255 (NaN: an integrity error; y is then
 * undefined), or -2 when group/cols are not supported. MXFP4 group order (see top). */
int k3_matmul_mxfp4(float *y, const uint8_t *packed, const uint8_t *scales, const float *x,
                    int rows, int cols, int group, int T);

/* ---- lossless BF16 coding (codec.c; layout in codec.h) --------------------------------
 * A BF16 matrix [rows][cols] coded by blocks of `block_rows` rows: per weight its sign and
 * mantissa as one raw byte and its exponent as a 3-bit code into the block's table of seven
 * exponents, or an escape with the exponent byte kept aside. Every one of the 65,536 BF16
 * patterns (NaN payloads, infinities, subnormals, signed zeros) decodes to itself. */

/* Error codes of the coded-matrix functions (all negative). */
#define K3_CODEC_ETRUNCATED (-10) /* buffer shorter than the header or than its size field */
#define K3_CODEC_EMAGIC (-11)     /* not a coded matrix */
#define K3_CODEC_ESHAPE (-12)     /* rows, cols, block rows or a size out of range */
#define K3_CODEC_ETABLE (-13)     /* a block table repeats an exponent or its last byte is set */
#define K3_CODEC_EINDEX (-14)     /* escape index not 0..escapes non-decreasing, <= cols a row */
#define K3_CODEC_EESCAPES (-15)   /* a row's escape codes do not match its index entries */

/* Largest coded size of a rows x cols matrix with the given block rows (every exponent an
 * escape), or -2 when a size is out of range (rows, cols, block_rows >= 1). */
int64_t k3_codec_bound(int rows, int cols, int block_rows);
/* Codes w (BF16 [rows][cols]) into dst (capacity bytes, at least k3_codec_bound). Returns the
 * coded size, -2 for a size out of range, -3 when capacity is below the bound. */
int64_t k3_codec_encode(uint8_t *dst, int64_t capacity, const uint16_t *w, int rows, int cols,
                        int block_rows);
/* Checks every field of a coded matrix of `size` bytes (header, sizes, tables, escape index)
 * without reading past `size`. Returns 0 or a K3_CODEC_E* code. */
int k3_codec_check(const uint8_t *src, int64_t size);
/* Decodes a coded matrix into w (BF16 [rows][cols] as its header says). Returns 0 or a
 * K3_CODEC_E* code (w then partly written). */
int k3_codec_decode(uint16_t *w, const uint8_t *src, int64_t size);
/* A sentence for a K3_CODEC_E* code (static storage). */
const char *k3_codec_strerror(int code);
/* k3_matmul_bf16 on the decoded weights, decoded in registers as the rows stream: the same
 * bytes as k3_matmul_bf16 on k3_codec_decode's output. y [T][rows]. Returns 0, or a
 * K3_CODEC_E* code (y then undefined): checks first, K3_CODEC_EESCAPES found while running.
 * Reads nothing outside [src, src + size). */
int k3_matmul_coded(float *y, const uint8_t *src, int64_t size, const float *x, int T);
/* The same product for a row block of a larger output (each row block of a matrix coded
 * alone): writes y[t*y_stride + r] for r < rows, t < T, nothing else. K3_CODEC_ESHAPE when
 * y_stride < rows. */
int k3_matmul_coded_rows(float *y, const uint8_t *src, int64_t size, const float *x, int T,
                         int y_stride);

/* ---- element-wise and norms (norm.c) ------------------------------------------------ */

/* y[t] = x[t] * (1/sqrt(mean(x[t]^2) + eps)) * w, per element as (x*r)*w. mean uses the
 * 8-lane dot of x with itself, divided by n. y may alias x. */
void k3_rmsnorm(float *y, const float *x, const float *w, int n, float eps, int T);
/* In place, per head of `dim` values: x = x / sqrt(sum(x^2) + eps) * scale. */
void k3_l2norm_heads(float *x, int heads, int dim, float eps, float scale, int T);
/* SiTU-GLU: out = b1*tanh(g/b1)*sigmoid(g) * b2*tanh(u/b2); out may alias gate or up. */
void k3_situ_glu(float *out, const float *gate, const float *up, int n, float b1, float b2,
                 int T);
/* y[i] += x[i]. */
void k3_add(float *y, const float *x, int n);
/* y[i] *= sigmoid(g[i]). */
void k3_mul_sigmoid(float *y, const float *g, int n);
/* y[i] = sigmoid(x[i]). */
void k3_sigmoid(float *y, const float *x, int n);
/* out[t] = widen(table[ids[t]]), table BF16 [vocab][H]. Returns -1 if an id is outside
 * [0, vocab). */
int k3_embed_bf16(float *out, const uint16_t *table, const int32_t *ids, int vocab, int H,
                  int T);

/* Block Attention Residual mix for T tokens. Rows are bank[t][0..nb-1] (bank is
 * [T][bank_stride][H]) followed by p[t] ([T][H]), in that order. For each row v:
 *   s_v = dot(v, sw) / sqrt(dot(v, v)/H + eps)   (both dots in 8-lane order)
 * p = softmax(s) (max-subtracted, exp, sequential sum over rows, divide),
 * out[t][i] = sequential fma over rows of p_v * v[i], from 0. out must not alias inputs.
 * sw is the folded score vector res_norm.weight * res_proj.weight. */
void k3_attn_res(float *out, const float *bank, int nb, int bank_stride, const float *p,
                 const float *sw, int H, float eps, int T);

/* ---- KDA (kda.c) -------------------------------------------------------------------- */

/* Short causal depthwise conv + SiLU. w is [C][K] (oldest tap first, w[c][K-1] multiplies
 * the current input); hist is [K-1][C], the previous K-1 inputs, oldest first, updated in
 * place so that a later call continues the sequence. For each t and c:
 *   y = sequential fma over j of w[c][j] * x(t-K+1+j);  out[t][c] = y * sigmoid(y). */
void k3_kda_conv(float *out, float *hist, const float *x, const float *w, int C, int K, int T);

/* Decay: alpha[t][h*dim+d] = exp(lb * sigmoid(exp(A_log[h]) * (g[t][h*dim+d] +
 * dt_bias[h*dim+d]))). A_log is indexed per head (its first `heads` entries). */
void k3_kda_gate(float *alpha, const float *g, const float *dt_bias, const float *A_log,
                 int heads, int dim, float lb, int T);

/* Delta-rule recurrence per head h with state S[h][k][v] (dim x dim, fp32, updated):
 *   S[k][:] *= alpha[k];  u[v] = sum_k S[k][v]*kk[k];  S[k][v] += kk[k]*beta*(v[v]-u[v]);
 *   o[v] = sum_k S[k][v]*q[k]
 * q, k already L2-normalised (q scaled). Sums over k are sequential fma from 0.
 * q, k, v, alpha, o are [T][heads*dim]; beta is [T][heads]. */
void k3_kda_recurrence(float *o, float *S, const float *q, const float *k, const float *v,
                       const float *alpha, const float *beta, int heads, int dim, int T);

/* Per head: y = (o / sqrt(mean(o^2) + eps)) * w * sigmoid(gate), w shared by all heads
 * ([dim]); mean uses the 8-lane dot. o, gate, y are [T][heads*dim]; y may alias o. */
void k3_gated_rmsnorm_heads(float *y, const float *o, const float *w, const float *gate,
                            int heads, int dim, float eps, int T);

/* ---- MLA over a latent cache (mla.c) ------------------------------------------------ */

/* Absorb the query. q is [T][nh][dn+dr]; kv_b is BF16 [nh*(dn+dv)][rkv] (per head dn
 * key rows then dv value rows). Writes q_abs [T][nh][rkv+dr]:
 *   q_abs[h][j] = sum_d kv_b[h*(dn+dv)+d][j] * q[h][d]   (j < rkv; sequential over d)
 *   q_abs[h][rkv+e] = q[h][dn+e]                          (the pe part, copied) */
void k3_mla_absorb_q(float *q_abs, const float *q, const uint16_t *kv_b, int nh, int dn,
                     int dr, int dv, int rkv, int T);

/* Attention of T new queries (absolute positions pos0..pos0+T-1) over the latent cache
 * rows 0..pos0+t (cache is [positions][rkv+dr]: normalised latent then k_pe, and must
 * already hold the new tokens' rows). score_s = dot(q_abs[h], cache[s]) * scale (8-lane
 * order over rkv+dr); softmax as in k3_attn_res; o_lat[t][h][j] = sequential fma over s
 * of p_s * cache[s][j] for j < rkv. Returns 0, or -1 when a scratch allocation failed
 * (o_lat is then incomplete). */
int k3_mla_attend(float *o_lat, const float *q_abs, const float *cache, int pos0, int T,
                  int nh, int rkv, int dr, float scale);

/* o[t][h][i] = sum_j kv_b[h*(dn+dv)+dn+i][j] * o_lat[t][h][j] (8-lane order over j). */
void k3_mla_expand_o(float *o, const float *o_lat, const uint16_t *kv_b, int nh, int dn,
                     int dv, int rkv, int T);

/* ---- MoE (moe.c) -------------------------------------------------------------------- */

/* Largest expert count the router takes (K3 has 896): its scratch lives on the stack. */
#define K3_MAX_EXPERTS 16384

/* Router for T tokens from fp32 logits [T][E]: s = sigmoid(logit); pick the k largest
 * s + bias (ties: lowest expert id); weights from the unbiased s, divided by
 * (sum + 1e-20) when renorm != 0 (sequential sum in selection order), times scale.
 * Writes ids [T][k] ascending by expert id and the matching weights [T][k].
 * Every id written is in [0, E), whatever the inputs. Returns 0; -1 when a logit or a
 * logit's s + bias is not finite (NaN or Inf: that token gets ids 0..k-1, weights 0, and
 * the run must stop); -2 unless 1 <= k <= E <= K3_MAX_EXPERTS and T >= 0 (nothing written). */
int k3_router_topk(int32_t *ids, float *weights, const float *logits, const float *bias,
                   int E, int k, int renorm, float scale, int T);

/* acc[i] = sequential fma over j < k of w[j] * y[j][i], from 0 (y is [k][n]). */
void k3_moe_combine(float *acc, const float *y, const float *w, int k, int n);

/* ---- background reads, fault hook, memory limits (stream.c, io.c) ------------------- */

/* A pool of reader threads with two queues: class 1 (urgent: expert misses) is served
 * before class 0 (prefetch: trunk layers). Reads are plain preads of the given fd; pass an
 * O_DIRECT fd only with a 4096-aligned dst, offset and nbytes. */
typedef struct k3_io_pool k3_io_pool;
/* Starts `workers` threads (1..16). NULL when the system refuses. */
k3_io_pool *k3_io_pool_new(int workers);
/* Drops queued reads, waits for running ones, joins the threads, frees the pool. */
void k3_io_pool_free(k3_io_pool *p);
/* Queues a read of up to `nbytes` at `offset` into `dst`. Returns a ticket >= 0, or
 * -EAGAIN when 8192 tickets are outstanding, -EFAULT when [dst, dst + nbytes) is not inside
 * one block of k3_alloc (nothing is queued), or -EINVAL. Every ticket must be waited. */
int64_t k3_io_submit(k3_io_pool *p, int klass, int fd, void *dst, int64_t offset,
                     int64_t nbytes);
/* Blocks until the ticket's read is done and frees the ticket. Returns the bytes read
 * (short only at EOF) or -errno; -EINVAL for a ticket that is not outstanding. */
int64_t k3_io_wait(k3_io_pool *p, int64_t ticket);
/* 1 when the ticket's read is done, 0 while queued or running, -EINVAL for a bad ticket. */
int k3_io_poll(k3_io_pool *p, int64_t ticket);
/* out[7]: busy ns of class 0, class 1, any class (time with >= 1 read running); bytes
 * of class 0, 1; reads of class 0, 1. */
void k3_io_stats(k3_io_pool *p, int64_t *out);

/* Test-only fault hook: with K3_FAULT_READ=N in the environment, the N-th read of the
 * process (k3_pread_full or a pool read, counted together) fails with EIO. Returns 1 when
 * the caller's read must fail. The only global state besides the ISA choice. */
int k3_fault_next_read(void);
/* The read loop under k3_pread_full and the pool: reads up to `nbytes` at `offset`, retrying
 * EINTR and partial reads, stopping at EOF; with stop_unaligned != 0 (O_DIRECT) a partial
 * read that leaves an unaligned position also ends it. Returns bytes read or -errno. */
int64_t k3_pread_loop(int fd, void *dst, int64_t offset, int64_t nbytes, int stop_unaligned);
/* Memory the system could give now without swapping, in bytes, or -1: MemAvailable on Linux,
 * free + inactive + purgeable pages on macOS, available physical memory on Windows. */
int64_t k3_mem_available_bytes(void);
/* The cgroup memory limit (v2 memory.max, else v1 limit_in_bytes) in bytes, or -1 (always
 * -1 outside Linux). */
int64_t k3_cgroup_memory_max_bytes(void);

/* ---- SHA-256 (sha256.c) ------------------------------------------------------------- */

/* SHA-256 (FIPS 180-4) with the eight state words in caller memory, so a caller can save
 * them and continue a hash in a later process. Same words from either compressor: SHA-NI
 * where CPUID reports it, else portable C (K3_ISA=scalar forces portable). */
/* "sha-ni" or "scalar": the compressor k3_sha256_blocks uses. */
const char *k3_sha256_impl(void);
/* Sets the initial hash value H(0). */
void k3_sha256_init(uint32_t state[8]);
/* Compresses `nbytes` of `data` (a multiple of 64) into `state`. Returns 0, or -1 (state
 * untouched) when nbytes is negative or not a multiple of 64. */
int k3_sha256_blocks(uint32_t state[8], const uint8_t *data, int64_t nbytes);
/* Finishes a message of `total_len` bytes whose last `tail_len` bytes are `tail` (all bytes
 * before it already compressed): compresses the tail, pads, writes the 32-byte digest to
 * `out`. Returns 0, or -1 (nothing written) when total_len - tail_len is negative or not a
 * multiple of 64. `state` is spent afterwards. */
int k3_sha256_final(uint32_t state[8], const uint8_t *tail, int64_t tail_len, int64_t total_len,
                    uint8_t out[32]);

#endif
