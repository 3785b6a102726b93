// The Gated DeltaNet layer of Qwen3.5: 16 key heads, 32 value heads (grouped
// 2:1), key and value dims 128, one log-space gate per head and token, delta
// rule, q/k L2-normalised in the kernel, initial and final state, packed
// variable-length sequences, and the gate computed in the kernel from the
// layer's projections: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).

dflex.gated_delta @qwen35_gated_deltanet heads(16, 32) dims(128, 128) gate(scalar_log)
    delta_rule qk_l2norm initial_state final_state varlen in_kernel_gate : bf16
