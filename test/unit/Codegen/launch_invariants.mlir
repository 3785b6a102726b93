// Values fixed for a launch that the per-element code reads: the window is a
// product of two captures, the score_mod's scale a log of a size over a
// captured float, its bias column a remainder by a size (a divisor slot).
// The emitted variants compute the first two on the host (packVariant).

dflex.mask @scaled_window(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%span: index, %stride: index) {
  %window = arith.muli %span, %stride : index
  %causal = arith.cmpi uge, %q_idx, %kv_idx : index
  %distance = arith.subi %q_idx, %kv_idx : index
  %near = arith.cmpi ult, %distance, %window : index
  %visible = arith.andi %causal, %near : i1
  dflex.yield %visible : i1
}

dflex.score_mod @log_scaled(%score: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%temperature: f32, %table: tensor<?x?xf32>) {
  %rows = dflex.dim %table, 0 : tensor<?x?xf32>
  %columns = dflex.dim %table, 1 : tensor<?x?xf32>
  %cells = arith.muli %rows, %columns : index
  %cells_i = arith.index_cast %cells : index to i64
  %cells_f = arith.sitofp %cells_i : i64 to f32
  %log_cells = math.log %cells_f : f32
  %scale = arith.divf %log_cells, %temperature : f32
  %scaled = arith.mulf %score, %scale : f32
  %row = arith.remui %h, %rows : index
  %column = arith.remui %kv_idx, %columns : index
  %bias = dflex.read %table[%row, %column] : tensor<?x?xf32>
  %biased = arith.addf %scaled, %bias : f32
  dflex.yield %biased : f32
}

dflex.attention @launch_invariants_attention mask @scaled_window score_mod @log_scaled heads(4, 2) head_dim(64, 64) : bf16
