// Causal attention with head_dim 256 (16 query heads, 2 key/value heads), for the benchmarks.
dflex.mask @causal(%b: index, %h: index, %q_idx: index, %kv_idx: index) {
  %visible = arith.cmpi uge, %q_idx, %kv_idx : index
  dflex.yield %visible : i1
}
dflex.attention @causal_d256 mask @causal heads(16, 2) head_dim(256, 256) : bf16
