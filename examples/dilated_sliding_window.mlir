// Dilated sliding window: query q sees keys kv = q - j * dilation for
// j = 0 .. window - 1 (causal, every dilation-th key, window keys in all).

dflex.mask @dilated_sliding_window(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%window: index, %dilation: index) {
  %c0 = arith.constant 0 : index
  %causal = arith.cmpi uge, %q_idx, %kv_idx : index
  %distance = arith.subi %q_idx, %kv_idx : index
  %span = arith.muli %window, %dilation : index
  %near = arith.cmpi ult, %distance, %span : index
  %phase = arith.remui %distance, %dilation : index
  %on_grid = arith.cmpi eq, %phase, %c0 : index
  %in_window = arith.andi %near, %on_grid : i1
  %visible = arith.andi %causal, %in_window : i1
  dflex.yield %visible : i1
}

dflex.attention @dilated_attention mask @dilated_sliding_window heads(32, 8) head_dim(128, 128) : bf16
