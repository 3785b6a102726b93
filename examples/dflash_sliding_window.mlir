// The sliding-window variant of the DFlash training mask: block i sees the
// `window` context positions just before its anchor (anchor - window <= kv <
// anchor) and its own block causally (block token j sees block tokens <= j).
// Layout and padding as in dflash.mlir.

dflex.mask @dflash_sliding_window(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%anchors: tensor<?x?xi32>, %ctx_len: index, %window: index)
    attributes {block_size = 16 : i64} {
  %c0 = arith.constant 0 : index
  %block_size = arith.constant 16 : index
  %block = arith.divui %q_idx, %block_size : index
  %anchor32 = dflex.read %anchors[%b, %block] padding -1 : tensor<?x?xi32>
  %anchor = arith.index_cast %anchor32 : i32 to index
  %real_block = arith.cmpi sge, %anchor, %c0 : index
  // Context keys in [anchor - window, anchor).
  %is_context = arith.cmpi ult, %kv_idx, %ctx_len : index
  %before_anchor = arith.cmpi slt, %kv_idx, %anchor : index
  %window_start = arith.subi %anchor, %window : index
  %in_window = arith.cmpi sge, %kv_idx, %window_start : index
  %near_anchor = arith.andi %before_anchor, %in_window : i1
  %sees_context = arith.andi %is_context, %near_anchor : i1
  // Block keys of the own block, causally.
  %is_block = arith.cmpi uge, %kv_idx, %ctx_len : index
  %block_pos = arith.subi %kv_idx, %ctx_len : index
  %kv_block = arith.divui %block_pos, %block_size : index
  %own_block = arith.cmpi eq, %kv_block, %block : index
  %causal = arith.cmpi ule, %block_pos, %q_idx : index
  %own_causal = arith.andi %own_block, %causal : i1
  %sees_block = arith.andi %is_block, %own_causal : i1
  %sees = arith.ori %sees_context, %sees_block : i1
  %visible = arith.andi %sees, %real_block : i1
  dflex.yield %visible : i1
}

// A sliding-window drafter layer.
dflex.attention @drafter_sliding_window_attention mask @dflash_sliding_window heads(32, 8) head_dim(128, 128) : bf16
