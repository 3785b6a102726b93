// Prefix-LM: the first prefix_len[b] tokens of sequence b attend to each other
// bidirectionally; every later token is causal (and sees the whole prefix).

dflex.mask @prefix_lm(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%prefix_len: tensor<?xi32>) {
  %len32 = dflex.read %prefix_len[%b] : tensor<?xi32>
  %len = arith.index_cast %len32 : i32 to index
  %in_prefix = arith.cmpi slt, %kv_idx, %len : index
  %causal = arith.cmpi uge, %q_idx, %kv_idx : index
  %visible = arith.ori %in_prefix, %causal : i1
  dflex.yield %visible : i1
}

dflex.attention @prefix_lm_attention mask @prefix_lm heads(16, 16) head_dim(64, 64) : bf16
