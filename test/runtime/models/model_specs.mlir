// The kernels of the tiny models that the model tests run through the dflex
// ops: of the targets (python/target_reference.py --model qwen3_gpu /
// qwen3_5_gpu) the attention of their full and sliding-window layers and the
// gated delta rule of Qwen3.5's linear-attention layers, as attentionHook and
// gatedDeltaHook take them, and the gated delta rule of a drafter's
// gated-delta layer, as drafterGatedDeltaHook takes it (docs/models.md). CPU
// tests run them through the ops' float64 paths; test/gpu/runtime/models.sh
// through the CUDA kernels.
//
// Attention masks are document-causal over packed rows: document_ids[b, t]
// names the sequence of token t (the hook passes the TokenLayout's segments),
// and a query sees the earlier keys of its own sequence, in a sliding-window
// layer only those with q - kv < window.

dflex.mask @document_causal(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%document_ids: tensor<?x?xi32>) {
  %q_doc = dflex.read %document_ids[%b, %q_idx] padding -1 : tensor<?x?xi32>
  %kv_doc = dflex.read %document_ids[%b, %kv_idx] padding -2 : tensor<?x?xi32>
  %same = arith.cmpi eq, %q_doc, %kv_doc : i32
  %causal = arith.cmpi uge, %q_idx, %kv_idx : index
  %visible = arith.andi %same, %causal : i1
  dflex.yield %visible : i1
}

dflex.mask @document_sliding_window(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%document_ids: tensor<?x?xi32>, %window: index) {
  %in_document = dflex.call @document_causal(%b, %h, %q_idx, %kv_idx, %document_ids)
      : (index, index, index, index, tensor<?x?xi32>) -> i1
  %distance = arith.subi %q_idx, %kv_idx : index
  %near = arith.cmpi ult, %distance, %window : index
  %visible = arith.andi %in_document, %near : i1
  dflex.yield %visible : i1
}

// qwen3_gpu: 4 query and 2 key/value heads of 128; layers 2 and 3 slide.
dflex.attention @qwen3_attention mask @document_causal heads(4, 2) head_dim(128, 128) : bf16
dflex.attention @qwen3_sliding_attention mask @document_sliding_window heads(4, 2) head_dim(128, 128) : bf16

// qwen3_5_gpu: gated full attention with 4 query and 2 key/value heads of 64,
// and gated-delta layers with 2 key heads and 4 value heads of 128.
dflex.attention @qwen3_5_attention mask @document_causal heads(4, 2) head_dim(64, 64) : bf16
dflex.gated_delta @qwen3_5_gated_delta heads(2, 4) dims(128, 128) gate(scalar_log)
    delta_rule qk_l2norm varlen : bf16

// The drafter's gated-delta layer of DrafterTest.cpp: 1 key head, 2 value
// heads of 64; its hook repeats the key heads (heads(2, 2)) and normalises q
// and k itself.
dflex.gated_delta @drafter_gated_delta heads(2, 2) dims(64, 64) gate(scalar_log) delta_rule varlen : bf16

// A window one key too wide (q - kv <= window), for the test that the hook
// refuses a mask other than the model's.
dflex.mask @document_window_too_wide(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%document_ids: tensor<?x?xi32>, %window: index) {
  %in_document = dflex.call @document_causal(%b, %h, %q_idx, %kv_idx, %document_ids)
      : (index, index, index, index, tensor<?x?xi32>) -> i1
  %distance = arith.subi %q_idx, %kv_idx : index
  %near = arith.cmpi ule, %distance, %window : index
  %visible = arith.andi %in_document, %near : i1
  dflex.yield %visible : i1
}
dflex.attention @window_too_wide mask @document_window_too_wide heads(4, 2) head_dim(128, 128) : bf16
