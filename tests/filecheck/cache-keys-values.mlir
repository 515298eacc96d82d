// RUN: cgc opt %s -p 'cache-keys-values{capacity=16}' | filecheck %s
// RUN: cgc opt %s -p 'cache-keys-values{capacity=16 windows=4}' | filecheck %s --check-prefix=WINDOWS

// A decoder's causal self-attention over the 4 tokens given of 2 sequences reads and writes
// caches of 16 tokens a sequence at the positions (the argument marked wse.every_layer).
func.func @causal(%q: tensor<8x32xf32>, %k: tensor<8x16xf32>, %v: tensor<8x16xf32>, %pos: tensor<2x4xi64> {wse.every_layer}) -> tensor<8x32xf32> {
  %a = wse.attention %q, %k, %v {sequence = 4 : i64, heads = 4 : i64, kv_heads = 2 : i64, causal = true, scale = 0.35 : f64} : (tensor<8x32xf32>, tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x32xf32> loc("h.0.attn")
  func.return %a : tensor<8x32xf32>
}

// CHECK-LABEL: func.func @causal
// CHECK-NEXT:    %[[KC:.*]] = wse.kv_cache "h.0.attn#0.key_cache" {capacity = 16 : i64} : tensor<32x16xf32> loc("h.0.attn")
// CHECK-NEXT:    %[[VC:.*]] = wse.kv_cache "h.0.attn#0.value_cache" {capacity = 16 : i64} : tensor<32x16xf32> loc("h.0.attn")
// CHECK-NEXT:    %[[A:.*]] = wse.cached_attention %q, %k, %v, %[[KC]], %[[VC]], %pos {heads = 4 : i64, kv_heads = 2 : i64, scale = 3.500000e-01 : f64} : (tensor<8x32xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<32x16xf32>, tensor<32x16xf32>, tensor<2x4xi64>) -> tensor<8x32xf32> loc("h.0.attn")
// CHECK-NEXT:    func.return %[[A]] : tensor<8x32xf32>

// A sliding window shorter than the caches stays.
func.func @window(%q: tensor<8x32xf32>, %k: tensor<8x32xf32>, %v: tensor<8x32xf32>, %pos: tensor<2x4xi64> {wse.every_layer}) -> tensor<8x32xf32> {
  %a = wse.attention %q, %k, %v {sequence = 4 : i64, heads = 4 : i64, kv_heads = 4 : i64, causal = true, scale = 0.35 : f64, window = 3 : i64} : (tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32> loc("h.0.attn")
  func.return %a : tensor<8x32xf32>
}

// CHECK-LABEL: func.func @window
// CHECK:         wse.cached_attention {{.*}} {heads = 4 : i64, kv_heads = 4 : i64, scale = 3.500000e-01 : f64, window = 3 : i64}

// A mask the graph computes from the positions (a key's position at most the query's, as
// transformers' mask builders compare them) is causal at positions 0..3: it goes, and so do
// the ops that computed it.
func.func @positions_mask(%q: tensor<8x32xf32>, %k: tensor<8x32xf32>, %v: tensor<8x32xf32>, %pos: tensor<2x4xi64> {wse.every_layer}) -> tensor<8x32xf32> {
  %rows = wse.reshape %pos : tensor<2x4xi64> -> tensor<2x4x1xi64>
  %cols = wse.reshape %pos : tensor<2x4xi64> -> tensor<2x1x4xi64>
  %seen = wse.greater_equal %rows, %cols : (tensor<2x4x1xi64>, tensor<2x1x4xi64>) -> tensor<2x4x4xi1>
  %zero = wse.constant dense<0.0> : tensor<f32>
  %low = wse.constant dense<-3.0e+38> : tensor<f32>
  %mask = wse.select %seen, %zero, %low : (tensor<2x4x4xi1>, tensor<f32>, tensor<f32>) -> tensor<2x4x4xf32>
  %bias = wse.reshape %mask : tensor<2x4x4xf32> -> tensor<2x1x4x4xf32>
  %a = wse.attention %q, %k, %v, %bias {sequence = 4 : i64, heads = 4 : i64, kv_heads = 4 : i64, causal = false, scale = 0.35 : f64} : (tensor<8x32xf32>, tensor<8x32xf32>, tensor<8x32xf32>, tensor<2x1x4x4xf32>) -> tensor<8x32xf32> loc("h.0.attn")
  func.return %a : tensor<8x32xf32>
}

// CHECK-LABEL: func.func @positions_mask
// CHECK-NEXT:    wse.kv_cache "h.0.attn#0.key_cache"
// CHECK-NEXT:    wse.kv_cache "h.0.attn#0.value_cache"
// CHECK-NEXT:    %[[A:.*]] = wse.cached_attention %q, %k, %v, {{.*}}, %pos {heads = 4 : i64, kv_heads = 4 : i64, scale = 3.500000e-01 : f64}
// CHECK-NEXT:    func.return %[[A]] : tensor<8x32xf32>

// One token attending to itself has no mask to say: it is cached as well (a decode step).
func.func @one_token(%q: tensor<2x32xf32>, %k: tensor<2x32xf32>, %v: tensor<2x32xf32>, %pos: tensor<2x1xi64> {wse.every_layer}) -> tensor<2x32xf32> {
  %a = wse.attention %q, %k, %v {sequence = 1 : i64, heads = 4 : i64, kv_heads = 4 : i64, causal = false, scale = 0.35 : f64} : (tensor<2x32xf32>, tensor<2x32xf32>, tensor<2x32xf32>) -> tensor<2x32xf32> loc("h.0.attn")
  func.return %a : tensor<2x32xf32>
}

// CHECK-LABEL: func.func @one_token
// CHECK:         wse.kv_cache "h.0.attn#0.key_cache" {capacity = 16 : i64} : tensor<32x32xf32>
// CHECK:         wse.cached_attention %q, %k, %v, {{.*}}, %pos

// Windows found on a longer program of the same model (one a function here) take the place
// of what each attention's mask says over the tokens given.
// WINDOWS-LABEL: func.func @causal
// WINDOWS:         wse.cached_attention {{.*}} {heads = 4 : i64, kv_heads = 2 : i64, scale = 3.500000e-01 : f64, window = 4 : i64}
// WINDOWS-LABEL: func.func @window
// WINDOWS:         wse.cached_attention {{.*}} window = 4 : i64}
