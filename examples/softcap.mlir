// Tanh soft-capping of the scores (Gemma-2 style): score -> cap * tanh(score / cap).

dflex.mask @causal(%b: index, %h: index, %q_idx: index, %kv_idx: index) {
  %visible = arith.cmpi uge, %q_idx, %kv_idx : index
  dflex.yield %visible : i1
}

dflex.score_mod @softcap(%score: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index) {
  %cap = arith.constant 5.000000e+01 : f32
  %scaled = arith.divf %score, %cap : f32
  %squashed = math.tanh %scaled : f32
  %capped = arith.mulf %squashed, %cap : f32
  dflex.yield %capped : f32
}

dflex.attention @softcap_attention mask @causal score_mod @softcap heads(16, 8) head_dim(256, 256) : bf16
