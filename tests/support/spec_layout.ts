/**
 * The released tensor layout, written from MODEL.md §3.3 (independent of lib/synth): every tensor a
 * checkpoint with text config `c` must hold, with its dtype and shape. Used by the tests of the
 * small generator (tests/synth/synth.test.ts) and of the full-size one (tests/memory/full.test.ts).
 */
import assert from "node:assert/strict";

export type Layout = Map<string, { dtype: string; shape: number[] }>;

/** Expected tensors of a checkpoint whose text config is `c`, with the given name prefixes. */
export function expectedLayout(c: any, model: string, head: string): Layout {
  const out: Layout = new Map();
  const put = (name: string, dtype: string, shape: number[]) => out.set(name, { dtype, shape });
  const H = c.hidden_size, V = c.vocab_size, la = c.linear_attn_config;
  const g = c.quantization_config.config_groups.group_0.weights.group_size;
  put(`${model}embed_tokens.weight`, "BF16", [V, H]);
  put(`${model}norm.weight`, "BF16", [H]);
  put(`${model}output_attn_res_norm.weight`, "BF16", [H]);
  put(`${model}output_attn_res_proj.weight`, "BF16", [1, H]);
  put(head, "BF16", [V, H]);
  for (let i = 0; i < c.num_hidden_layers; i++) {
    const P = `${model}layers.${i}.`;
    const mla = la.full_attn_layers.includes(i + 1);
    const width = mla ? c.num_attention_heads * c.v_head_dim : la.num_heads * la.head_dim;
    for (const n of ["input_layernorm", "post_attention_layernorm"]) {
      put(`${P}${n}.weight`, "BF16", [H]);
    }
    for (const n of ["self_attention", "mlp"]) {
      put(`${P}${n}_res_norm.weight`, "BF16", [H]);
      put(`${P}${n}_res_proj.weight`, "BF16", [1, H]);
    }
    put(`${P}self_attn.g_proj.weight`, "BF16", [width, H]);
    put(`${P}self_attn.o_proj.weight`, "BF16", [H, width]);
    const A = `${P}self_attn.`;
    if (mla) {
      const qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
      put(`${A}q_a_proj.weight`, "BF16", [c.q_lora_rank, H]);
      put(`${A}q_a_layernorm.weight`, "BF16", [c.q_lora_rank]);
      put(`${A}q_b_proj.weight`, "BF16", [c.num_attention_heads * qk, c.q_lora_rank]);
      put(`${A}kv_a_proj_with_mqa.weight`, "BF16", [c.kv_lora_rank + c.qk_rope_head_dim, H]);
      put(`${A}kv_a_layernorm.weight`, "BF16", [c.kv_lora_rank]);
      put(`${A}kv_b_proj.weight`, "BF16", [
        c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim),
        c.kv_lora_rank,
      ]);
    } else {
      const dp = la.num_heads * la.head_dim;
      for (const n of ["q", "k", "v"]) {
        put(`${A}${n}_proj.weight`, "BF16", [dp, H]);
        put(`${A}${n}_conv1d.weight`, "F32", [dp, 1, la.short_conv_kernel_size]);
      }
      put(`${A}f_a_proj.weight`, "BF16", [la.head_dim, H]);
      put(`${A}f_b_proj.weight`, "BF16", [dp, la.head_dim]);
      put(`${A}b_proj.weight`, "BF16", [la.num_heads, H]);
      put(`${A}A_log`, "F32", [la.head_dim]);
      put(`${A}dt_bias`, "F32", [dp]);
      put(`${A}o_norm.weight`, "F32", [la.head_dim]);
    }
    if (i < c.first_k_dense_replace) {
      put(`${P}mlp.gate_proj.weight`, "BF16", [c.intermediate_size, H]);
      put(`${P}mlp.up_proj.weight`, "BF16", [c.intermediate_size, H]);
      put(`${P}mlp.down_proj.weight`, "BF16", [H, c.intermediate_size]);
      continue;
    }
    const M = `${P}block_sparse_moe.`, E = c.num_experts, L = c.routed_expert_hidden_size;
    const I = c.moe_intermediate_size, S = c.num_shared_experts * I;
    put(`${M}gate.weight`, "BF16", [E, H]);
    put(`${M}gate.e_score_correction_bias`, "F32", [E]);
    put(`${M}routed_expert_down_proj.weight`, "BF16", [L, H]);
    put(`${M}routed_expert_norm.weight`, "BF16", [L]);
    put(`${M}routed_expert_up_proj.weight`, "BF16", [H, L]);
    put(`${M}shared_experts.gate_proj.weight`, "BF16", [S, H]);
    put(`${M}shared_experts.up_proj.weight`, "BF16", [S, H]);
    put(`${M}shared_experts.down_proj.weight`, "BF16", [H, S]);
    for (let e = 0; e < E; e++) {
      for (const [w, rows, cols] of [["w1", I, L], ["w3", I, L], ["w2", L, I]] as const) {
        put(`${M}experts.${e}.${w}.weight_packed`, "U8", [rows, cols / 2]);
        put(`${M}experts.${e}.${w}.weight_scale`, "U8", [rows, cols / g]);
      }
    }
  }
  return out;
}

export function assertLayout(
  actual: Map<string, { dtype: string; shape: number[] }>,
  expected: Layout,
) {
  const missing = [...expected.keys()].filter((n) => !actual.has(n));
  const extra = [...actual.keys()].filter((n) => !expected.has(n));
  assert.deepEqual(missing, [], "tensors missing from the checkpoint");
  assert.deepEqual(extra, [], "unexpected tensors in the checkpoint");
  for (const [name, want] of expected) {
    const got = actual.get(name)!;
    assert.deepEqual({ dtype: got.dtype, shape: got.shape }, want, name);
  }
}
