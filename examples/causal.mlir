// Causal attention: query q sees every key kv <= q.
// Target-style layer: 32 query heads, 8 key/value heads, head_dim 128.

dflex.mask @causal(%b: index, %h: index, %q_idx: index, %kv_idx: index) {
  %visible = arith.cmpi uge, %q_idx, %kv_idx : index
  dflex.yield %visible : i1
}

dflex.attention @causal_attention mask @causal heads(32, 8) head_dim(128, 128) : bf16
