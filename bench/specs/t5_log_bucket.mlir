// A T5-style relative-position bias with log-spaced buckets, causal: a pair
// at distance d = q - kv falls in bucket d while d < 16, and beyond that in
// one of the remaining buckets spaced logarithmically up to max_distance
// (the last bucket holds every farther pair); bias_table[h, bucket] is added
// to its score. The number of buckets is the table's second size.

dflex.mask @causal(%b: index, %h: index, %q_idx: index, %kv_idx: index) {
  %visible = arith.cmpi uge, %q_idx, %kv_idx : index
  dflex.yield %visible : i1
}

dflex.score_mod @log_bucket_bias(%score: f32, %b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%bias_table: tensor<?x?xf32>, %max_distance: f32) {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %exact = arith.constant 16 : index
  %exact_f = arith.constant 16.0 : f32
  %buckets = dflex.dim %bias_table, 1 : tensor<?x?xf32>
  %last = arith.subi %buckets, %c1 : index
  %log_buckets = arith.subi %buckets, %exact : index
  %log_buckets_i = arith.index_cast %log_buckets : index to i64
  %log_buckets_f = arith.sitofp %log_buckets_i : i64 to f32
  %raw = arith.subi %q_idx, %kv_idx : index
  %distance = arith.maxsi %raw, %c0 : index
  %distance_i = arith.index_cast %distance : index to i64
  %distance_f = arith.sitofp %distance_i : i64 to f32
  // log(d / 16) / log(max_distance / 16) of the log-spaced buckets.
  %ratio = arith.divf %distance_f, %exact_f : f32
  %log_ratio = math.log %ratio : f32
  %max_ratio = arith.divf %max_distance, %exact_f : f32
  %log_max_ratio = math.log %max_ratio : f32
  %fraction = arith.divf %log_ratio, %log_max_ratio : f32
  %scaled = arith.mulf %fraction, %log_buckets_f : f32
  %offset_i = arith.fptosi %scaled : f32 to i64
  %offset = arith.index_cast %offset_i : i64 to index
  %far = arith.addi %exact, %offset : index
  %far_clamped = arith.minsi %far, %last : index
  %is_exact = arith.cmpi slt, %distance, %exact : index
  %bucket = arith.select %is_exact, %distance, %far_clamped : index
  %bias = dflex.read %bias_table[%h, %bucket] : tensor<?x?xf32>
  %biased = arith.addf %score, %bias : f32
  dflex.yield %biased : f32
}

dflex.attention @t5_log_bucket_attention mask @causal score_mod @log_bucket_bias heads(16, 4) head_dim(128, 128) : bf16
