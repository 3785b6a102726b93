// The DFlash training mask and the attention of a DFlash drafter layer.
//
// Queries are the drafter's blocks: block i holds queries [16 i, 16 i + 16)
// (the token at anchor i followed by 15 mask tokens). Keys are the context
// followed by the blocks: kv < ctx_len is context position kv, kv >= ctx_len
// is block token kv - ctx_len. Block i sees the context of its own document
// strictly before its anchor, context_start[b, i] <= kv < anchors[b, i], and
// its own block (bidirectionally), nothing else. context_start is where the
// anchor's document begins in a packed row (0 for a row of one document).
// anchors[b, i] is -1 for a padded block; a padded block, and a block past
// the end of anchors, sees nothing.

dflex.mask @dflash(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%anchors: tensor<?x?xi32>, %context_start: tensor<?x?xi32>, %ctx_len: index)
    attributes {block_size = 16 : i64} {
  %c0 = arith.constant 0 : index
  %block_size = arith.constant 16 : index
  %block = arith.divui %q_idx, %block_size : index
  %anchor32 = dflex.read %anchors[%b, %block] padding -1 : tensor<?x?xi32>
  %anchor = arith.index_cast %anchor32 : i32 to index
  %real_block = arith.cmpi sge, %anchor, %c0 : index
  // Context keys of the anchor's document, strictly before the anchor.
  %start32 = dflex.read %context_start[%b, %block] : tensor<?x?xi32>
  %start = arith.index_cast %start32 : i32 to index
  %is_context = arith.cmpi ult, %kv_idx, %ctx_len : index
  %before_anchor = arith.cmpi slt, %kv_idx, %anchor : index
  %in_document = arith.cmpi sge, %kv_idx, %start : index
  %in_range = arith.andi %before_anchor, %in_document : i1
  %sees_context = arith.andi %is_context, %in_range : i1
  // Block keys of the query's own block.
  %is_block = arith.cmpi uge, %kv_idx, %ctx_len : index
  %block_pos = arith.subi %kv_idx, %ctx_len : index
  %kv_block = arith.divui %block_pos, %block_size : index
  %own_block = arith.cmpi eq, %kv_block, %block : index
  %sees_block = arith.andi %is_block, %own_block : i1
  %sees = arith.ori %sees_context, %sees_block : i1
  %visible = arith.andi %sees, %real_block : i1
  dflex.yield %visible : i1
}

// A drafter layer: 32 query heads, 8 key/value heads, head_dim 128, bf16.
dflex.attention @drafter_attention mask @dflash heads(32, 8) head_dim(128, 128) : bf16

// The drafter of the embedded default (examples/default, scripts/run.sh on a
// GPU): 3 query heads and 1 key/value head of 64, as its small target has.
dflex.attention @default_drafter_attention mask @dflash heads(3, 1) head_dim(64, 64) : bf16

// A drafter's gated-delta (linear_attention) layer with Qwen3.5's shapes for
// a hidden size of 4096: 32 value heads, key and value dims 128. The
// drafter's hook (drafterGatedDeltaHook) runs the layer's context runs and
// blocks as varlen sequences, with q and k normalised before the op and the
// key heads repeated to the value heads (heads(32, 32)).
dflex.gated_delta @drafter_gated_delta heads(32, 32) dims(128, 128) gate(scalar_log) delta_rule varlen : bf16
