// Sliding-window causal attention: query q sees keys kv with q - window < kv <= q.
// The window is a run-time capture: changing it needs no recompilation.

dflex.mask @sliding_window(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%window: index) {
  %causal = arith.cmpi uge, %q_idx, %kv_idx : index
  %distance = arith.subi %q_idx, %kv_idx : index
  %near = arith.cmpi ult, %distance, %window : index
  %visible = arith.andi %causal, %near : i1
  dflex.yield %visible : i1
}

dflex.attention @sliding_window_attention mask @sliding_window heads(32, 8) head_dim(128, 128) : bf16
