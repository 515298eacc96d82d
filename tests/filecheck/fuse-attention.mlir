// RUN: cgc opt %s -p fuse-attention | filecheck %s
// RUN: cgc opt %s -p 'fuse-attention{causal_masks="causal"}' | filecheck %s --check-prefix=WEIGHT

// As ONNX exporters write it: heads split by a reshape and a transpose, the key transposed
// again, the scores divided by a scalar, a causal additive mask, a softmax, the heads merged.
func.func @onnx(%q: tensor<1x4x16xf32>, %k: tensor<1x4x16xf32>, %v: tensor<1x4x16xf32>) -> tensor<1x4x16xf32> {
  %q4 = wse.reshape %q : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32> loc("q.heads")
  %qt = wse.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32> loc("q.t")
  %k4 = wse.reshape %k : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32> loc("k.heads")
  %kt = wse.transpose %k4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32> loc("k.t")
  %ktt = wse.transpose %kt {perm = array<i64: 0, 1, 3, 2>} : tensor<1x2x4x8xf32> -> tensor<1x2x8x4xf32> loc("kt")
  %v4 = wse.reshape %v : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32> loc("v.heads")
  %vt = wse.transpose %v4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32> loc("v.t")
  %s = wse.matmul %qt, %ktt : (tensor<1x2x4x8xf32>, tensor<1x2x8x4xf32>) -> tensor<1x2x4x4xf32> loc("qk")
  %c = wse.constant dense<2.0> : tensor<f32> loc("scale")
  %scaled = wse.div %s, %c : (tensor<1x2x4x4xf32>, tensor<f32>) -> tensor<1x2x4x4xf32> loc("scaled")
  %mask = wse.constant dense<[[0.0, -1.0e9, -1.0e9, -1.0e9], [0.0, 0.0, -1.0e9, -1.0e9], [0.0, 0.0, 0.0, -1.0e9], [0.0, 0.0, 0.0, 0.0]]> : tensor<4x4xf32> loc("mask")
  %masked = wse.add %scaled, %mask : (tensor<1x2x4x4xf32>, tensor<4x4xf32>) -> tensor<1x2x4x4xf32> loc("masked")
  %p = wse.softmax %masked {axis = 3 : i64} : tensor<1x2x4x4xf32> loc("softmax")
  %o = wse.matmul %p, %vt : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32> loc("av")
  %ot = wse.transpose %o {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32> loc("merge.t")
  %y = wse.reshape %ot : tensor<1x4x2x8xf32> -> tensor<1x4x16xf32> loc("merge")
  func.return %y : tensor<1x4x16xf32>
}

// CHECK-LABEL: func.func @onnx
// CHECK-NEXT:    %[[Q:.*]] = wse.reshape %q : tensor<1x4x16xf32> -> tensor<4x16xf32> loc("qk")
// CHECK-NEXT:    %[[K:.*]] = wse.reshape %k : tensor<1x4x16xf32> -> tensor<4x16xf32> loc("qk")
// CHECK-NEXT:    %[[V:.*]] = wse.reshape %v : tensor<1x4x16xf32> -> tensor<4x16xf32> loc("qk")
// CHECK-NEXT:    %[[A:.*]] = wse.attention %[[Q]], %[[K]], %[[V]] {sequence = 4 : i64, heads = 2 : i64, kv_heads = 2 : i64, causal = true, scale = 5.000000e-01 : f64} : (tensor<4x16xf32>, tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32> loc("qk")
// CHECK-NEXT:    %[[Y:.*]] = wse.reshape %[[A]] : tensor<4x16xf32> -> tensor<1x4x16xf32> loc("merge")
// CHECK-NEXT:    func.return %[[Y]] : tensor<1x4x16xf32>

// As PyTorch writes it: the batch and the heads merged for the matmuls, the scale a product,
// the mask a select with the lowest float on a (weight) boolean mask, then an open mask.
func.func @torch(%q: tensor<2x4x16xf32>, %k: tensor<2x4x16xf32>, %v: tensor<2x4x16xf32>) -> tensor<2x4x16xf32> {
  %q4 = wse.reshape %q : tensor<2x4x16xf32> -> tensor<2x4x2x8xf32>
  %qt = wse.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : tensor<2x4x2x8xf32> -> tensor<2x2x4x8xf32>
  %q3 = wse.reshape %qt : tensor<2x2x4x8xf32> -> tensor<4x4x8xf32>
  %k4 = wse.reshape %k : tensor<2x4x16xf32> -> tensor<2x4x2x8xf32>
  %kt = wse.transpose %k4 {perm = array<i64: 0, 2, 3, 1>} : tensor<2x4x2x8xf32> -> tensor<2x2x8x4xf32>
  %k3 = wse.reshape %kt : tensor<2x2x8x4xf32> -> tensor<4x8x4xf32>
  %v4 = wse.reshape %v : tensor<2x4x16xf32> -> tensor<2x4x2x8xf32>
  %vt = wse.transpose %v4 {perm = array<i64: 0, 2, 1, 3>} : tensor<2x4x2x8xf32> -> tensor<2x2x4x8xf32>
  %v3 = wse.reshape %vt : tensor<2x2x4x8xf32> -> tensor<4x4x8xf32>
  %s3 = wse.matmul %q3, %k3 : (tensor<4x4x8xf32>, tensor<4x8x4xf32>) -> tensor<4x4x4xf32>
  %s = wse.reshape %s3 : tensor<4x4x4xf32> -> tensor<2x2x4x4xf32>
  %c = wse.constant dense<0.25> : tensor<f32>
  %scaled = wse.mul %c, %s : (tensor<f32>, tensor<2x2x4x4xf32>) -> tensor<2x2x4x4xf32>
  %keep = wse.constant dense<[[[[true, false, false, false], [true, true, false, false], [true, true, true, false], [true, true, true, true]]]]> : tensor<1x1x4x4xi1>
  %lowest = wse.constant dense<-3.40282347e+38> : tensor<f32>
  %masked = wse.select %keep, %scaled, %lowest : (tensor<1x1x4x4xi1>, tensor<2x2x4x4xf32>, tensor<f32>) -> tensor<2x2x4x4xf32>
  %zero = wse.constant dense<0.0> : tensor<2x1x4x4xf32>
  %biased = wse.add %masked, %zero : (tensor<2x2x4x4xf32>, tensor<2x1x4x4xf32>) -> tensor<2x2x4x4xf32>
  %p = wse.softmax %biased {axis = 3 : i64} : tensor<2x2x4x4xf32>
  %p3 = wse.reshape %p : tensor<2x2x4x4xf32> -> tensor<4x4x4xf32>
  %o3 = wse.matmul %p3, %v3 : (tensor<4x4x4xf32>, tensor<4x4x8xf32>) -> tensor<4x4x8xf32>
  %o = wse.reshape %o3 : tensor<4x4x8xf32> -> tensor<2x2x4x8xf32>
  %ot = wse.transpose %o {perm = array<i64: 0, 2, 1, 3>} : tensor<2x2x4x8xf32> -> tensor<2x4x2x8xf32>
  %y = wse.reshape %ot : tensor<2x4x2x8xf32> -> tensor<2x4x16xf32>
  func.return %y : tensor<2x4x16xf32>
}

// CHECK-LABEL: func.func @torch
// CHECK:         %[[A:.*]] = wse.attention %{{.*}}, %{{.*}}, %{{.*}} {sequence = 4 : i64, heads = 2 : i64, kv_heads = 2 : i64, causal = true, scale = 2.500000e-01 : f64} : (tensor<8x16xf32>, tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
// CHECK-NEXT:    %[[Y:.*]] = wse.reshape %[[A]] : tensor<8x16xf32> -> tensor<2x4x16xf32>
// CHECK-NEXT:    func.return %[[Y]] : tensor<2x4x16xf32>

// A mask that is a weight counts as causal only when the pass is told its kind; else it is
// a bias the fused op adds to the scores as it is.
func.func @weight_mask(%q: tensor<1x4x16xf32>) -> tensor<1x4x16xf32> {
  %q4 = wse.reshape %q : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32>
  %qt = wse.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32>
  %kt = wse.transpose %q4 {perm = array<i64: 0, 2, 3, 1>} : tensor<1x4x2x8xf32> -> tensor<1x2x8x4xf32>
  %s = wse.matmul %qt, %kt : (tensor<1x2x4x8xf32>, tensor<1x2x8x4xf32>) -> tensor<1x2x4x4xf32>
  %mask = wse.weight "causal" : tensor<4x4xf32>
  %masked = wse.add %s, %mask : (tensor<1x2x4x4xf32>, tensor<4x4xf32>) -> tensor<1x2x4x4xf32>
  %p = wse.softmax %masked {axis = 3 : i64} : tensor<1x2x4x4xf32>
  %o = wse.matmul %p, %qt : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  %ot = wse.transpose %o {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32>
  %y = wse.reshape %ot : tensor<1x4x2x8xf32> -> tensor<1x4x16xf32>
  func.return %y : tensor<1x4x16xf32>
}

// CHECK-LABEL: func.func @weight_mask
// CHECK:         %[[B:.*]] = wse.reshape %mask : tensor<4x4xf32> -> tensor<1x1x4x4xf32>
// CHECK-NEXT:    wse.attention %{{.*}}, %{{.*}}, %{{.*}}, %[[B]] {sequence = 4 : i64, heads = 2 : i64, kv_heads = 2 : i64, causal = false, scale = 1.000000e+00 : f64}
// CHECK-NOT:     wse.softmax
// WEIGHT-LABEL:  func.func @weight_mask
// WEIGHT:        wse.attention %{{.*}}, %{{.*}}, %{{.*}} {sequence = 4 : i64, heads = 2 : i64, kv_heads = 2 : i64, causal = true, scale = 1.000000e+00 : f64}
// WEIGHT-NOT:    wse.softmax

// A mask that is neither causal, open nor a window is a bias; a softmax over the queries is
// left alone.
func.func @other_mask(%q: tensor<1x4x16xf32>) -> tensor<1x4x16xf32> {
  %q4 = wse.reshape %q : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32>
  %qt = wse.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32>
  %kt = wse.transpose %q4 {perm = array<i64: 0, 2, 3, 1>} : tensor<1x4x2x8xf32> -> tensor<1x2x8x4xf32>
  %s = wse.matmul %qt, %kt : (tensor<1x2x4x8xf32>, tensor<1x2x8x4xf32>) -> tensor<1x2x4x4xf32>
  %mask = wse.constant dense<[[0.0, 0.0, -1.0e9, -1.0e9], [0.0, 0.0, -1.0e9, -1.0e9], [0.0, 0.0, 0.0, -1.0e9], [0.0, 0.0, 0.0, 0.0]]> : tensor<4x4xf32>
  %masked = wse.add %s, %mask : (tensor<1x2x4x4xf32>, tensor<4x4xf32>) -> tensor<1x2x4x4xf32>
  %p = wse.softmax %masked {axis = 3 : i64} : tensor<1x2x4x4xf32>
  %o = wse.matmul %p, %qt : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  %ot = wse.transpose %o {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32>
  %y = wse.reshape %ot : tensor<1x4x2x8xf32> -> tensor<1x4x16xf32>
  %s2 = wse.matmul %qt, %kt : (tensor<1x2x4x8xf32>, tensor<1x2x8x4xf32>) -> tensor<1x2x4x4xf32>
  %p2 = wse.softmax %s2 {axis = 2 : i64} : tensor<1x2x4x4xf32>
  %o2 = wse.matmul %p2, %qt : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  %ot2 = wse.transpose %o2 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32>
  %y2 = wse.reshape %ot2 : tensor<1x4x2x8xf32> -> tensor<1x4x16xf32>
  %sum = wse.add %y, %y2 : (tensor<1x4x16xf32>, tensor<1x4x16xf32>) -> tensor<1x4x16xf32>
  func.return %sum : tensor<1x4x16xf32>
}

// CHECK-LABEL: func.func @other_mask
// WEIGHT-LABEL: func.func @other_mask
// CHECK:         %[[B:.*]] = wse.reshape %mask : tensor<4x4xf32> -> tensor<1x1x4x4xf32>
// CHECK-NEXT:    wse.attention %{{.*}}, %{{.*}}, %{{.*}}, %[[B]] {sequence = 4 : i64, heads = 2 : i64, kv_heads = 2 : i64, causal = false, scale = 1.000000e+00 : f64}
// CHECK:         wse.softmax %{{.*}} {axis = 2 : i64}
// CHECK-NOT:     wse.attention
// CHECK:         func.return

// A factor below one after the mask would shrink its blocking values (-1e9 * 1e-9 blocks
// nothing): left alone. Doubled after the mask, it still blocks: fused, the scale doubled.
func.func @scaled_after_mask(%q: tensor<1x4x16xf32>) -> (tensor<1x4x16xf32>, tensor<1x4x16xf32>) {
  %q4 = wse.reshape %q : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32>
  %qt = wse.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32>
  %kt = wse.transpose %q4 {perm = array<i64: 0, 2, 3, 1>} : tensor<1x4x2x8xf32> -> tensor<1x2x8x4xf32>
  %s = wse.matmul %qt, %kt : (tensor<1x2x4x8xf32>, tensor<1x2x8x4xf32>) -> tensor<1x2x4x4xf32>
  %mask = wse.constant dense<[[0.0, -1.0e9, -1.0e9, -1.0e9], [0.0, 0.0, -1.0e9, -1.0e9], [0.0, 0.0, 0.0, -1.0e9], [0.0, 0.0, 0.0, 0.0]]> : tensor<4x4xf32>
  %masked = wse.add %s, %mask : (tensor<1x2x4x4xf32>, tensor<4x4xf32>) -> tensor<1x2x4x4xf32>
  %tiny = wse.constant dense<1.0e-9> : tensor<f32>
  %shrunk = wse.mul %masked, %tiny : (tensor<1x2x4x4xf32>, tensor<f32>) -> tensor<1x2x4x4xf32>
  %p = wse.softmax %shrunk {axis = 3 : i64} : tensor<1x2x4x4xf32>
  %o = wse.matmul %p, %qt : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  %ot = wse.transpose %o {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32>
  %y = wse.reshape %ot : tensor<1x4x2x8xf32> -> tensor<1x4x16xf32>
  %half = wse.constant dense<0.5> : tensor<f32>
  %grown = wse.div %masked, %half : (tensor<1x2x4x4xf32>, tensor<f32>) -> tensor<1x2x4x4xf32>
  %p2 = wse.softmax %grown {axis = 3 : i64} : tensor<1x2x4x4xf32>
  %o2 = wse.matmul %p2, %qt : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  %ot2 = wse.transpose %o2 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32>
  %y2 = wse.reshape %ot2 : tensor<1x4x2x8xf32> -> tensor<1x4x16xf32>
  func.return %y, %y2 : tensor<1x4x16xf32>, tensor<1x4x16xf32>
}

// CHECK-LABEL: func.func @scaled_after_mask
// CHECK:         wse.softmax %{{.*}} {axis = 3 : i64}
// CHECK:         wse.attention %{{.*}}, %{{.*}}, %{{.*}} {sequence = 4 : i64, heads = 2 : i64, kv_heads = 2 : i64, causal = true, scale = 2.000000e+00 : f64}
// CHECK-NOT:     wse.softmax
// CHECK:         func.return

// As the SDPA lowerings write it (Llama, dynamo exporter): q and k^T each scaled by
// sqrt(1/sqrt(d)) before the scores, q changed after the head split (as rotary embeddings do),
// the two key and value heads repeated for four query heads, and the softmax guarded by
// where(isnan(p), 0, p). The changed q is read through a transpose back to token-major order.
func.func @sdpa(%q: tensor<1x4x32xf32>, %k: tensor<1x4x16xf32>, %v: tensor<1x4x16xf32>) -> tensor<1x4x32xf32> {
  %q4 = wse.reshape %q : tensor<1x4x32xf32> -> tensor<1x4x4x8xf32>
  %qt = wse.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>
  %qr = wse.neg %qt : tensor<1x4x4x8xf32>
  %k4 = wse.reshape %k : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32>
  %kt = wse.transpose %k4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32>
  %k5 = wse.reshape %kt : tensor<1x2x4x8xf32> -> tensor<1x2x1x4x8xf32>
  %kb = wse.broadcast_to %k5 : tensor<1x2x1x4x8xf32> -> tensor<1x2x2x4x8xf32>
  %kg = wse.reshape %kb : tensor<1x2x2x4x8xf32> -> tensor<1x4x4x8xf32>
  %v4 = wse.reshape %v : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32>
  %vt = wse.transpose %v4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32>
  %v5 = wse.reshape %vt : tensor<1x2x4x8xf32> -> tensor<1x2x1x4x8xf32>
  %vb = wse.broadcast_to %v5 : tensor<1x2x1x4x8xf32> -> tensor<1x2x2x4x8xf32>
  %vg = wse.reshape %vb : tensor<1x2x2x4x8xf32> -> tensor<1x4x4x8xf32>
  %root = wse.constant dense<0.5> : tensor<f32>
  %qs = wse.mul %qr, %root : (tensor<1x4x4x8xf32>, tensor<f32>) -> tensor<1x4x4x8xf32>
  %kT = wse.transpose %kg {perm = array<i64: 0, 1, 3, 2>} : tensor<1x4x4x8xf32> -> tensor<1x4x8x4xf32>
  %ks = wse.mul %kT, %root : (tensor<1x4x8x4xf32>, tensor<f32>) -> tensor<1x4x8x4xf32>
  %s = wse.matmul %qs, %ks : (tensor<1x4x4x8xf32>, tensor<1x4x8x4xf32>) -> tensor<1x4x4x4xf32>
  %mask = wse.constant dense<[[0.0, -3.0e38, -3.0e38, -3.0e38], [0.0, 0.0, -3.0e38, -3.0e38], [0.0, 0.0, 0.0, -3.0e38], [0.0, 0.0, 0.0, 0.0]]> : tensor<4x4xf32>
  %masked = wse.add %s, %mask : (tensor<1x4x4x4xf32>, tensor<4x4xf32>) -> tensor<1x4x4x4xf32>
  %p = wse.softmax %masked {axis = 3 : i64} : tensor<1x4x4x4xf32>
  %nan = wse.is_nan %p : tensor<1x4x4x4xf32> -> tensor<1x4x4x4xi1>
  %zero = wse.constant dense<0.0> : tensor<f32>
  %guarded = wse.select %nan, %zero, %p : (tensor<1x4x4x4xi1>, tensor<f32>, tensor<1x4x4x4xf32>) -> tensor<1x4x4x4xf32>
  %o = wse.matmul %guarded, %vg : (tensor<1x4x4x4xf32>, tensor<1x4x4x8xf32>) -> tensor<1x4x4x8xf32>
  %ot = wse.transpose %o {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>
  %y = wse.reshape %ot : tensor<1x4x4x8xf32> -> tensor<1x4x32xf32>
  func.return %y : tensor<1x4x32xf32>
}

// CHECK-LABEL: func.func @sdpa
// CHECK:         %[[R:.*]] = wse.neg
// CHECK-NEXT:    %[[T:.*]] = wse.transpose %[[R]] {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>
// CHECK-NEXT:    %[[Q:.*]] = wse.reshape %[[T]] : tensor<1x4x4x8xf32> -> tensor<4x32xf32>
// CHECK-NEXT:    %[[K:.*]] = wse.reshape %k : tensor<1x4x16xf32> -> tensor<4x16xf32>
// CHECK-NEXT:    %[[V:.*]] = wse.reshape %v : tensor<1x4x16xf32> -> tensor<4x16xf32>
// CHECK-NEXT:    %[[A:.*]] = wse.attention %[[Q]], %[[K]], %[[V]] {sequence = 4 : i64, heads = 4 : i64, kv_heads = 2 : i64, causal = true, scale = 2.500000e-01 : f64} : (tensor<4x32xf32>, tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x32xf32>
// CHECK-NEXT:    %[[Y:.*]] = wse.reshape %[[A]] : tensor<4x32xf32> -> tensor<1x4x32xf32>
// CHECK-NEXT:    func.return %[[Y]] : tensor<1x4x32xf32>

// A sliding window of two keys, over more keys than the window.
func.func @window(%q: tensor<1x4x16xf32>) -> tensor<1x4x16xf32> {
  %q4 = wse.reshape %q : tensor<1x4x16xf32> -> tensor<1x4x2x8xf32>
  %qt = wse.transpose %q4 {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x2x8xf32> -> tensor<1x2x4x8xf32>
  %kt = wse.transpose %q4 {perm = array<i64: 0, 2, 3, 1>} : tensor<1x4x2x8xf32> -> tensor<1x2x8x4xf32>
  %s = wse.matmul %qt, %kt : (tensor<1x2x4x8xf32>, tensor<1x2x8x4xf32>) -> tensor<1x2x4x4xf32>
  %keep = wse.constant dense<[[true, false, false, false], [true, true, false, false], [false, true, true, false], [false, false, true, true]]> : tensor<4x4xi1>
  %lowest = wse.constant dense<-3.40282347e+38> : tensor<f32>
  %masked = wse.select %keep, %s, %lowest : (tensor<4x4xi1>, tensor<1x2x4x4xf32>, tensor<f32>) -> tensor<1x2x4x4xf32>
  %p = wse.softmax %masked {axis = 3 : i64} : tensor<1x2x4x4xf32>
  %o = wse.matmul %p, %qt : (tensor<1x2x4x4xf32>, tensor<1x2x4x8xf32>) -> tensor<1x2x4x8xf32>
  %ot = wse.transpose %o {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32>
  %y = wse.reshape %ot : tensor<1x4x2x8xf32> -> tensor<1x4x16xf32>
  func.return %y : tensor<1x4x16xf32>
}

// CHECK-LABEL: func.func @window
// CHECK:         wse.attention %{{.*}}, %{{.*}}, %{{.*}} {sequence = 4 : i64, heads = 2 : i64, kv_heads = 2 : i64, causal = true, scale = 1.000000e+00 : f64, window = 2 : i64}
// CHECK-NOT:     wse.softmax

// An attention that reads repeated key and value heads (PyTorch's attention lowered after
// transformers' repeat_kv) reads the heads before the repeat, as its kv_heads.
func.func @ungrouped(%q: tensor<4x32xf32>, %k: tensor<1x2x4x8xf32>) -> tensor<4x32xf32> {
  %k5 = wse.reshape %k : tensor<1x2x4x8xf32> -> tensor<1x2x1x4x8xf32>
  %kb = wse.broadcast_to %k5 : tensor<1x2x1x4x8xf32> -> tensor<1x2x2x4x8xf32>
  %kg = wse.reshape %kb : tensor<1x2x2x4x8xf32> -> tensor<1x4x4x8xf32>
  %kt = wse.transpose %kg {perm = array<i64: 0, 2, 1, 3>} : tensor<1x4x4x8xf32> -> tensor<1x4x4x8xf32>
  %kf = wse.reshape %kt : tensor<1x4x4x8xf32> -> tensor<4x32xf32>
  %a = wse.attention %q, %kf, %kf {sequence = 4 : i64, heads = 4 : i64, kv_heads = 4 : i64, causal = true, scale = 1.0 : f64} : (tensor<4x32xf32>, tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32>
  func.return %a : tensor<4x32xf32>
}

// CHECK-LABEL: func.func @ungrouped
// CHECK:         %[[K:.*]] = wse.transpose %k {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x4x8xf32> -> tensor<1x4x2x8xf32>
// CHECK-NEXT:    %[[KF:.*]] = wse.reshape %[[K]] : tensor<1x4x2x8xf32> -> tensor<4x16xf32>
// CHECK:         wse.attention %q, %[[KF]], %{{.*}} {sequence = 4 : i64, heads = 4 : i64, kv_heads = 2 : i64, causal = true, scale = 1.000000e+00 : f64} : (tensor<4x32xf32>, tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x32xf32>
