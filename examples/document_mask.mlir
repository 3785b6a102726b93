// Packed documents: several documents share one row; document_ids[b, t] names
// the document of token t. A query sees earlier keys of its own document only.
// Positions past the end of document_ids read -1 (no document) for the query
// and -2 for the key, so padding never matches anything.

dflex.mask @document(%b: index, %h: index, %q_idx: index, %kv_idx: index)
    captures(%document_ids: tensor<?x?xi32>) {
  %q_doc = dflex.read %document_ids[%b, %q_idx] padding -1 : tensor<?x?xi32>
  %kv_doc = dflex.read %document_ids[%b, %kv_idx] padding -2 : tensor<?x?xi32>
  %same = arith.cmpi eq, %q_doc, %kv_doc : i32
  %causal = arith.cmpi uge, %q_idx, %kv_idx : index
  %visible = arith.andi %same, %causal : i1
  dflex.yield %visible : i1
}

dflex.attention @document_attention mask @document heads(32, 8) head_dim(128, 128) : bf16
