// Chunked causal attention (chunked local attention, as in chunked prefill
// or Llama 4's local layers): a query sees the earlier keys of its own chunk
// of `chunk` tokens, the chunk size given at run time. The division by the
// captured size is fixed for a launch: dflex-compile proves the indices below
// 2^32 and runs it as a multiplication by a magic number the host computes
// (docs/language.md, "Division by launch-invariant values").

dflex.mask @chunked_causal(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%chunk: index) {
  %q_chunk = arith.divui %q_idx, %chunk : index
  %kv_chunk = arith.divui %kv_idx, %chunk : index
  %same = arith.cmpi eq, %q_chunk, %kv_chunk : index
  %causal = arith.cmpi uge, %q_idx, %kv_idx : index
  %visible = arith.andi %same, %causal : i1
  dflex.yield %visible : i1
}

dflex.attention @chunked_causal_attention mask @chunked_causal heads(8, 2) head_dim(128, 128) : bf16
