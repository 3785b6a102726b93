// RUN: not dflex-compile %s --arch sm_9000x -o %t 2>&1 | FileCheck %s
// CHECK: dflex-compile: error: unknown --arch 'sm_9000x'
// RUN: not dflex-compile %s --portable-configs-of sm_80 -o %t 2>&1 | FileCheck %s --check-prefix=CONFIGS
// CONFIGS: dflex-compile: error: --portable-configs-of 'sm_80': expected an arch with its own portable configs (sm_90 or sm_120)
// RUN: dflex-compile %s --portable-configs-of sm_120 --emit-cuda | FileCheck %s --check-prefix=SM120
// SM120: // The configs of compute capability 120, in every binary.
// SM120-NEXT: using Configs = ::dflex::kernels::DefaultAttentionConfigs<__nv_bfloat16, 64, 120>;

dflex.mask @causal(%b: index, %h: index, %q: index, %kv: index) {
  %r = arith.cmpi uge, %q, %kv : index
  dflex.yield %r : i1
}
dflex.attention @layer mask @causal heads(8, 8) head_dim(64, 64) : bf16
