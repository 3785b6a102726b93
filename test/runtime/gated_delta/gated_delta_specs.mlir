// dflex.gated_delta specs for the gated-delta op's tests: on the CPU
// (test/runtime/gated_delta) and on a GPU (test/gpu/runtime), beside the
// Qwen3.5 example. Together they cover both head dims, Dk != Dv, grouped
// heads, varlen, gate none, no delta rule, no L2 norm, the in-kernel gate,
// and initial / final states; @gdn_h16_d128 is the timing shape's spec.
dflex.gated_delta @gdn_h16_d128 heads(16, 16) dims(128, 128) gate(scalar_log) delta_rule qk_l2norm : bf16
dflex.gated_delta @gdn_grouped_varlen heads(2, 4) dims(64, 64) gate(scalar_log)
    delta_rule qk_l2norm initial_state final_state varlen : bf16
dflex.gated_delta @gdn_plain heads(2, 2) dims(64, 128) gate(none) delta_rule : bf16
dflex.gated_delta @gdn_no_delta heads(1, 2) dims(128, 64) gate(scalar_log) qk_l2norm
    initial_state final_state : bf16
dflex.gated_delta @gdn_in_kernel_gate heads(2, 2) dims(64, 128) gate(scalar_log) delta_rule qk_l2norm
    in_kernel_gate : bf16
