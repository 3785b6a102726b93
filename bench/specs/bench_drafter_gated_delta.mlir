// The gated-delta drafter layer of bench/train_bench.py: its target's hidden
// size of 1024 gives 8 value heads of 128 (TrainingPlan's proportions), run
// as examples/dflash.mlir's drafter_gated_delta is.
dflex.gated_delta @drafter_gated_delta heads(8, 8) dims(128, 128) gate(scalar_log) delta_rule varlen : bf16
