// The hybrid target of bench/recipe_bench.py --target hybrid (Qwen3.5 layers
// with 27B-class shapes): the document-causal attention of its gated
// attention layers (24 query and 4 key/value heads of 256) and the gated
// delta rule of its linear-attention layers (16 key and 48 value heads of
// 128), as attentionHook and gatedDeltaHook take them over packed rows.

dflex.mask @recipe_document(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%document_ids: tensor<?x?xi32>) {
  %q_doc = dflex.read %document_ids[%b, %q_idx] padding -1 : tensor<?x?xi32>
  %kv_doc = dflex.read %document_ids[%b, %kv_idx] padding -2 : tensor<?x?xi32>
  %same = arith.cmpi eq, %q_doc, %kv_doc : i32
  %causal = arith.cmpi uge, %q_idx, %kv_idx : index
  %visible = arith.andi %same, %causal : i1
  dflex.yield %visible : i1
}

dflex.attention @recipe_hybrid_attention mask @recipe_document heads(24, 4) head_dim(256, 256) : bf16
dflex.gated_delta @recipe_hybrid_gated_delta heads(16, 48) dims(128, 128) gate(scalar_log)
    delta_rule qk_l2norm varlen : bf16
