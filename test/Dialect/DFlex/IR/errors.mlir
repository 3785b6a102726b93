// RUN: dflex-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

// expected-error@+1 {{'dflex.mask' takes 4 arguments (b, h, q_idx, kv_idx), got 3}}
dflex.mask @too_few(%b: index, %h: index, %q: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}

// -----

// expected-error@+1 {{'dflex.score_mod' takes 5 arguments (score, b, h, q_idx, kv_idx), got 4}}
dflex.score_mod @no_score(%b: index, %h: index, %q: index, %kv: index) {
  %c = arith.constant 0.0 : f32
  dflex.yield %c : f32
}

// -----

// expected-error@+1 {{argument #2 ('q_idx') of 'dflex.mask' must be 'index', got 'i32'}}
dflex.mask @wrong_index_type(%b: index, %h: index, %q: i32, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}

// -----

// expected-error@+1 {{argument #0 ('score') of 'dflex.score_mod' must be 'f32', got 'f16'}}
dflex.score_mod @wrong_score_type(%s: f16, %b: index, %h: index, %q: index, %kv: index) {
  %c = arith.constant 0.0 : f32
  dflex.yield %c : f32
}

// -----

dflex.mask @yields_f32(%b: index, %h: index, %q: index, %kv: index) {
  %c = arith.constant 0.0 : f32
  // expected-error@+1 {{yields 'f32' but 'dflex.mask' must yield 'i1'}}
  dflex.yield %c : f32
}

// -----

dflex.score_mod @yields_i1(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  // expected-error@+1 {{yields 'i1' but 'dflex.score_mod' must yield 'f32'}}
  dflex.yield %t : i1
}

// -----

dflex.mask @no_yield(%b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{block with no terminator}}
  %t = arith.constant true
}

// -----

dflex.mask @side_effect(%b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{has side effects; 'dflex.mask' bodies must be pure}}
  %m = "test.unknown_alloc"() : () -> i32
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

dflex.mask @other_dialect(%b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{'builtin.unrealized_conversion_cast' op is not allowed in a 'dflex.mask' body: only arith, math and dflex ops may appear}}
  %p = builtin.unrealized_conversion_cast %q : index to i1
  dflex.yield %p : i1
}

// -----

dflex.score_mod @unsupported_op(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{'math.atan' op is not supported in a 'dflex.score_mod' body}}
  %a = math.atan %s : f32
  dflex.yield %a : f32
}

// -----

dflex.score_mod @f64_value(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{produces a value of type 'f64', which dflex bodies do not support}}
  %d = arith.extf %s : f32 to f64
  %r = arith.truncf %d : f64 to f32
  dflex.yield %r : f32
}

// -----

// expected-error@+1 {{capture 't' has type 'tensor<4xi32>'; a capture must be a tensor with dynamic dimensions}}
dflex.mask @static_capture(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<4xi32>) {
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

// expected-error@+1 {{capture 't' has type 'tensor<?xf64>'}}
dflex.mask @f64_capture(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xf64>) {
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

// expected-error@+2 {{region entry argument '%w' is already in use}}
// expected-note@+1 {{previously referenced here}}
dflex.mask @duplicate_capture(%b: index, %h: index, %q: index, %kv: index) captures(%w: index, %w: index) {
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

// expected-error@+1 {{capture name 'q_idx' is reserved for a leading argument (score, b, h, q_idx, kv_idx)}}
dflex.mask @reserved_capture_name(%b: index, %h: index, %q: index, %kv: index) captures(%q_idx: index) {
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

// expected-error@+1 {{capture name '0' must start with a letter or '_'}}
dflex.mask @numeric_capture_name(%b: index, %h: index, %q: index, %kv: index) captures(%0: index) {
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

dflex.mask @wrong_rank(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?x?xi32>) {
  // expected-error@+1 {{reads a rank-2 tensor with 1 index}}
  %v = dflex.read %t[%q] : tensor<?x?xi32>
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

// expected-note@+1 {{prior use here}}
dflex.mask @wrong_capture_type(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xi32>) {
  // expected-error@+1 {{use of value '%t' expects different type than prior uses: 'tensor<?xi64>' vs 'tensor<?xi32>'}}
  %v = dflex.read %t[%q] : tensor<?xi64>
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

dflex.mask @float_padding_for_ints(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xi32>) {
  // expected-error@+1 {{padding for a tensor of 'i32' must be an integer literal}}
  %v = dflex.read %t[%q] padding 1.5 : tensor<?xi32>
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

dflex.mask @padding_too_wide(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xi32>) {
  // expected-error@+1 {{padding 8589934592 does not fit in 'i32'}}
  %v = dflex.read %t[%q] padding 8589934592 : tensor<?xi32>
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

dflex.mask @tensor_misuse(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xi32>) {
  // expected-error@+1 {{uses captured tensor 't'; a captured tensor can only be read with dflex.read}}
  %s = arith.addi %t, %t : tensor<?xi32>
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

dflex.mask @dim_out_of_range(%b: index, %h: index, %q: index, %kv: index) captures(%t: tensor<?xi32>) {
  // expected-error@+1 {{dimension 1 is out of range for a rank-1 tensor}}
  %n = dflex.dim %t, 1 : tensor<?xi32>
  %c = arith.constant true
  dflex.yield %c : i1
}

// -----

dflex.mask @calls_missing(%b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{'@nowhere' does not name a symbol}}
  %r = dflex.call @nowhere(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  dflex.yield %r : i1
}

// -----

dflex.attention @spec mask @m heads(1, 1) head_dim(64, 64) : bf16
dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{'@spec' is a 'dflex.attention', expected a dflex.mask or dflex.score_mod}}
  %r = dflex.call @spec(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  dflex.yield %r : i1
}

// -----

dflex.mask @callee(%b: index, %h: index, %q: index, %kv: index) captures(%w: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}
dflex.mask @missing_capture_operand(%b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{passes 4 arguments but '@callee' takes 5 (4 leading arguments and 1 captures)}}
  %r = dflex.call @callee(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  dflex.yield %r : i1
}

// -----

dflex.score_mod @mod(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
  dflex.yield %s : f32
}
dflex.mask @wrong_call_result(%b: index, %h: index, %q: index, %kv: index) {
  %z = arith.constant 0.0 : f32
  // expected-error@+1 {{result type 'i1' does not match '@mod', which yields 'f32'}}
  %r = dflex.call @mod(%z, %b, %h, %q, %kv) : (f32, index, index, index, index) -> i1
  dflex.yield %r : i1
}

// -----

dflex.mask @wrong_call_argument(%b: index, %h: index, %q: index, %kv: index) {
  %z = arith.constant 0.0 : f32
  // expected-error@+1 {{argument #2 has type 'f32' but '@wrong_call_argument' expects 'index'}}
  %r = dflex.call @wrong_call_argument(%b, %h, %z, %kv) : (index, index, f32, index) -> i1
  dflex.yield %r : i1
}

// -----

dflex.mask @self(%b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{makes a recursive call: @self -> @self}}
  %r = dflex.call @self(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  dflex.yield %r : i1
}

// -----

dflex.mask @ping(%b: index, %h: index, %q: index, %kv: index) {
  %r = dflex.call @pong(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  dflex.yield %r : i1
}
dflex.mask @pong(%b: index, %h: index, %q: index, %kv: index) {
  // expected-error@+1 {{makes a recursive call: @pong -> @ping -> @pong}}
  %r = dflex.call @ping(%b, %h, %q, %kv) : (index, index, index, index) -> i1
  dflex.yield %r : i1
}

// -----

// expected-error@+1 {{mask '@absent' does not name a symbol}}
dflex.attention @missing_mask mask @absent heads(8, 8) head_dim(128, 128) : bf16

// -----

dflex.score_mod @mod(%s: f32, %b: index, %h: index, %q: index, %kv: index) {
  dflex.yield %s : f32
}
// expected-error@+1 {{mask '@mod' is a 'dflex.score_mod', expected a 'dflex.mask'}}
dflex.attention @mask_is_score_mod mask @mod heads(8, 8) head_dim(128, 128) : bf16

// -----

dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}
// expected-error@+1 {{score_mod '@m' is a 'dflex.mask', expected a 'dflex.score_mod'}}
dflex.attention @score_mod_is_mask mask @m score_mod @m heads(8, 8) head_dim(128, 128) : bf16

// -----

dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) captures(%x: tensor<?xi32>) {
  %t = arith.constant true
  dflex.yield %t : i1
}
dflex.score_mod @s(%s: f32, %b: index, %h: index, %q: index, %kv: index) captures(%x: tensor<?xf32>) {
  dflex.yield %s : f32
}
// expected-error@+1 {{capture 'x' is 'tensor<?xi32>' in mask '@m' but 'tensor<?xf32>' in score_mod '@s'}}
dflex.attention @capture_clash mask @m score_mod @s heads(8, 8) head_dim(128, 128) : bf16

// -----

dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}
// expected-error@+1 {{query heads (32) must be a multiple of key/value heads (12)}}
dflex.attention @bad_gqa mask @m heads(32, 12) head_dim(128, 128) : bf16

// -----

dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}
// expected-error@+1 {{qk_head_dim 96 is not supported: use 64, 128, 256}}
dflex.attention @bad_head_dim mask @m heads(8, 8) head_dim(96, 128) : bf16

// -----

dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}
// expected-error@+1 {{v_head_dim 512 is not supported: use 64, 128, 256}}
dflex.attention @bad_v_head_dim mask @m heads(8, 8) head_dim(128, 512) : bf16

// -----

dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}
// expected-error@+1 {{failed to satisfy constraint: 64-bit signless integer attribute whose value is positive}}
dflex.attention @zero_heads mask @m heads(0, 8) head_dim(128, 128) : bf16

// -----

dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}
// expected-error@+1 {{scale must be positive and finite, got -1}}
dflex.attention @bad_scale mask @m heads(8, 8) head_dim(128, 128) scale -1.0 : bf16

// -----

dflex.mask @m(%b: index, %h: index, %q: index, %kv: index) {
  %t = arith.constant true
  dflex.yield %t : i1
}
// expected-error@+1 {{attribute 'element_type' failed to satisfy constraint}}
dflex.attention @f32_attention mask @m heads(8, 8) head_dim(128, 128) : f32

// -----

// expected-error@+1 {{value heads (24) must be a multiple of key heads (16)}}
dflex.gated_delta @bad_groups heads(16, 24) dims(128, 128) gate(scalar_log) delta_rule : bf16

// -----

// expected-error@+1 {{key_dim 256 is not supported: use 64, 128}}
dflex.gated_delta @bad_key_dim heads(16, 32) dims(256, 128) gate(scalar_log) delta_rule : bf16

// -----

// expected-error@+1 {{in_kernel_gate computes a scalar log-space gate and requires gate(scalar_log), got gate(none)}}
dflex.gated_delta @bad_gate_combo heads(16, 32) dims(128, 128) gate(none) in_kernel_gate : bf16

// -----

// expected-error@+1 {{gate(channel_log) is not supported: the chunked kernels implement gate(scalar_log) and gate(none)}}
dflex.gated_delta @channel_gate heads(16, 16) dims(128, 128) gate(channel_log) delta_rule : bf16

// -----

// expected-error@+1 {{expected string or keyword containing one of the following enum values for attribute 'gate' [none, scalar_log, channel_log]}}
dflex.gated_delta @unknown_gate heads(16, 32) dims(128, 128) gate(vector) : bf16
