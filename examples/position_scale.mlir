// Per-position score terms: each query's score is multiplied by a captured
// temperature of its row, temperature[b, q], and each key adds a captured
// bias of its column, key_bias[b, kv] (attention sinks, learned key
// priors). Causal.

dflex.mask @causal(%b: index, %h: index, %q_idx: index, %kv_idx: index) {
  %visible = arith.cmpi uge, %q_idx, %kv_idx : index
  dflex.yield %visible : i1
}

dflex.score_mod @position_scale(%score: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%temperature: tensor<?x?xf32>, %key_bias: tensor<?x?xf32>) {
  %t = dflex.read %temperature[%b, %q_idx] : tensor<?x?xf32>
  %bias = dflex.read %key_bias[%b, %kv_idx] : tensor<?x?xf32>
  %scaled = arith.mulf %score, %t : f32
  %biased = arith.addf %scaled, %bias : f32
  dflex.yield %biased : f32
}

dflex.attention @position_scale_attention mask @causal score_mod @position_scale heads(16, 4) head_dim(128, 128) : bf16
