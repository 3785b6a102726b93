// ALiBi: causal attention whose scores are biased by -slope[h] * (q - kv),
// with one slope per query head captured as a tensor.

dflex.mask @causal(%b: index, %h: index, %q_idx: index, %kv_idx: index) {
  %visible = arith.cmpi uge, %q_idx, %kv_idx : index
  dflex.yield %visible : i1
}

dflex.score_mod @alibi(%score: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%slopes: tensor<?xf32>) {
  %slope = dflex.read %slopes[%h] : tensor<?xf32>
  %q = arith.index_cast %q_idx : index to i64
  %kv = arith.index_cast %kv_idx : index to i64
  %distance = arith.subi %q, %kv : i64
  %distance_f = arith.sitofp %distance : i64 to f32
  %bias = arith.mulf %slope, %distance_f : f32
  %biased = arith.subf %score, %bias : f32
  dflex.yield %biased : f32
}

dflex.attention @alibi_attention mask @causal score_mod @alibi heads(16, 16) head_dim(128, 128) : bf16
