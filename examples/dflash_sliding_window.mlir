// The sliding-window variant of the DFlash training mask, as a drafter's
// sliding-window layer sees its KV cache at inference: query j of block i
// sits at position p = anchors[b, i] + j and sees the keys at positions
// p - window < position <= p. Those are the context keys of its document
// before the anchor with context_start[b, i] <= kv and p - kv < window, and
// the keys of its own block at offsets j' <= j with j - j' < window (causal
// inside the block). Layout and padding as in dflash.mlir.

dflex.mask @dflash_sliding_window(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%anchors: tensor<?x?xi32>, %context_start: tensor<?x?xi32>, %ctx_len: index,
             %window: index)
    attributes {block_size = 16 : i64} {
  %c0 = arith.constant 0 : index
  %block_size = arith.constant 16 : index
  %block = arith.divui %q_idx, %block_size : index
  %offset = arith.remui %q_idx, %block_size : index
  %anchor32 = dflex.read %anchors[%b, %block] padding -1 : tensor<?x?xi32>
  %anchor = arith.index_cast %anchor32 : i32 to index
  %real_block = arith.cmpi sge, %anchor, %c0 : index
  %position = arith.addi %anchor, %offset : index
  // Context keys of the document, before the anchor, within the window.
  %start32 = dflex.read %context_start[%b, %block] : tensor<?x?xi32>
  %start = arith.index_cast %start32 : i32 to index
  %is_context = arith.cmpi ult, %kv_idx, %ctx_len : index
  %before_anchor = arith.cmpi slt, %kv_idx, %anchor : index
  %in_document = arith.cmpi sge, %kv_idx, %start : index
  %context_distance = arith.subi %position, %kv_idx : index
  %context_near = arith.cmpi slt, %context_distance, %window : index
  %in_range = arith.andi %before_anchor, %in_document : i1
  %near_context = arith.andi %in_range, %context_near : i1
  %sees_context = arith.andi %is_context, %near_context : i1
  // Keys of the own block, causally and within the window.
  %is_block = arith.cmpi uge, %kv_idx, %ctx_len : index
  %block_pos = arith.subi %kv_idx, %ctx_len : index
  %kv_block = arith.divui %block_pos, %block_size : index
  %own_block = arith.cmpi eq, %kv_block, %block : index
  %causal = arith.cmpi ule, %block_pos, %q_idx : index
  %block_distance = arith.subi %q_idx, %block_pos : index
  %block_near = arith.cmpi slt, %block_distance, %window : index
  %own_causal = arith.andi %own_block, %causal : i1
  %own_near = arith.andi %own_causal, %block_near : i1
  %sees_block = arith.andi %is_block, %own_near : i1
  %sees = arith.ori %sees_context, %sees_block : i1
  %visible = arith.andi %sees, %real_block : i1
  dflex.yield %visible : i1
}

// A sliding-window drafter layer.
dflex.attention @drafter_sliding_window_attention mask @dflash_sliding_window heads(32, 8) head_dim(128, 128) : bf16
