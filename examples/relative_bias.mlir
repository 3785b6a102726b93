// A learned relative-position bias: bias_table[h, d] is added to the score of
// a pair at relative distance q - kv = d - max_distance, with the distance
// clamped to [-max_distance, max_distance] and max_distance =
// (size(bias_table, 1) - 1) / 2. Causal.

dflex.mask @causal(%b: index, %h: index, %q_idx: index, %kv_idx: index) {
  %visible = arith.cmpi uge, %q_idx, %kv_idx : index
  dflex.yield %visible : i1
}

dflex.score_mod @relative_bias(%score: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%bias_table: tensor<?x?xf32>) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %c2 = arith.constant 2 : index
  %buckets = dflex.dim %bias_table, 1 : tensor<?x?xf32>
  %span = arith.subi %buckets, %c1 : index
  %max_distance = arith.divui %span, %c2 : index
  %distance = arith.subi %q_idx, %kv_idx : index
  %shifted = arith.addi %distance, %max_distance : index
  %low_clamped = arith.maxsi %shifted, %c0 : index
  %bucket = arith.minsi %low_clamped, %span : index
  %bias = dflex.read %bias_table[%h, %bucket] : tensor<?x?xf32>
  %biased = arith.addf %score, %bias : f32
  dflex.yield %biased : f32
}

dflex.attention @relative_bias_attention mask @causal score_mod @relative_bias heads(16, 4) head_dim(64, 64) : bf16
