// RUN: cgc opt %s -p fuse-rotary | filecheck %s
// RUN: cgc opt %s -p 'fuse-rotary{tables="cos","sin"}' | filecheck %s --check-prefix=WEIGHT

// transformers' apply_rotary_pos_emb as the exporters write it, on heads [B, H, S, D]:
// x * cos + concat(-x[..., D/2:], x[..., :D/2]) * sin, with tables whose halves repeat.
func.func @rotary(%x: tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32> {
  %cos = wse.constant dense<[[[[1.0, 0.5, 1.0, 0.5], [0.25, 0.75, 0.25, 0.75], [0.0, 1.0, 0.0, 1.0]]]]> : tensor<1x1x3x4xf32>
  %sin = wse.constant dense<[[[[0.0, 0.5, 0.0, 0.5], [0.5, 0.25, 0.5, 0.25], [1.0, 0.0, 1.0, 0.0]]]]> : tensor<1x1x3x4xf32>
  %a = wse.mul %x, %cos : (tensor<1x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<1x2x3x4xf32>
  %lo = wse.slice %x {starts = array<i64: 0, 0, 0, 0>, limits = array<i64: 1, 2, 3, 2>, strides = array<i64: 1, 1, 1, 1>} : tensor<1x2x3x4xf32> -> tensor<1x2x3x2xf32>
  %hi = wse.slice %x {starts = array<i64: 0, 0, 0, 2>, limits = array<i64: 1, 2, 3, 4>, strides = array<i64: 1, 1, 1, 1>} : tensor<1x2x3x4xf32> -> tensor<1x2x3x2xf32>
  %neg = wse.neg %hi : tensor<1x2x3x2xf32>
  %r = wse.concat %neg, %lo {axis = 3 : i64} : (tensor<1x2x3x2xf32>, tensor<1x2x3x2xf32>) -> tensor<1x2x3x4xf32>
  %b = wse.mul %r, %sin : (tensor<1x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y = wse.add %a, %b : (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32> loc("rope")
  func.return %y : tensor<1x2x3x4xf32>
}

// CHECK-LABEL: func.func @rotary
// CHECK:         %[[T:.*]] = wse.transpose %x {perm = array<i64: 0, 2, 1, 3>} : tensor<1x2x3x4xf32> -> tensor<1x3x2x4xf32> loc("rope")
// CHECK-NEXT:    %[[F:.*]] = wse.reshape %[[T]] : tensor<1x3x2x4xf32> -> tensor<3x8xf32> loc("rope")
// CHECK-NEXT:    %[[C:.*]] = wse.reshape %cos : tensor<1x1x3x4xf32> -> tensor<3x4xf32> loc("rope")
// CHECK-NEXT:    %[[S:.*]] = wse.reshape %sin : tensor<1x1x3x4xf32> -> tensor<3x4xf32> loc("rope")
// CHECK-NEXT:    %[[R:.*]] = wse.rotary %[[F]], %[[C]], %[[S]] {heads = 2 : i64} : (tensor<3x8xf32>, tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<3x8xf32> loc("rope")
// CHECK-NEXT:    %[[H:.*]] = wse.reshape %[[R]] : tensor<3x8xf32> -> tensor<1x3x2x4xf32> loc("rope")
// CHECK-NEXT:    %[[Y:.*]] = wse.transpose %[[H]] {perm = array<i64: 0, 2, 1, 3>} : tensor<1x3x2x4xf32> -> tensor<1x2x3x4xf32> loc("rope")
// CHECK-NEXT:    func.return %[[Y]] : tensor<1x2x3x4xf32>

// Tables that are weights count only when the pass is told they repeat their halves; tables
// that do not (a gradient's transpose would not be the inverse rotation) are left alone.
func.func @weights(%x: tensor<1x2x3x4xf32>) -> (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) {
  %cos = wse.weight "cos" : tensor<1x1x3x4xf32>
  %sin = wse.weight "sin" : tensor<1x1x3x4xf32>
  %a = wse.mul %x, %cos : (tensor<1x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<1x2x3x4xf32>
  %lo = wse.slice %x {starts = array<i64: 0, 0, 0, 0>, limits = array<i64: 1, 2, 3, 2>, strides = array<i64: 1, 1, 1, 1>} : tensor<1x2x3x4xf32> -> tensor<1x2x3x2xf32>
  %hi = wse.slice %x {starts = array<i64: 0, 0, 0, 2>, limits = array<i64: 1, 2, 3, 4>, strides = array<i64: 1, 1, 1, 1>} : tensor<1x2x3x4xf32> -> tensor<1x2x3x2xf32>
  %neg = wse.neg %hi : tensor<1x2x3x2xf32>
  %r = wse.concat %neg, %lo {axis = 3 : i64} : (tensor<1x2x3x2xf32>, tensor<1x2x3x2xf32>) -> tensor<1x2x3x4xf32>
  %b = wse.mul %r, %sin : (tensor<1x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y = wse.add %a, %b : (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  %odd = wse.constant dense<[[[[1.0, 0.5, 0.5, 1.0], [0.25, 0.75, 0.25, 0.75], [0.0, 1.0, 0.0, 1.0]]]]> : tensor<1x1x3x4xf32>
  %a2 = wse.mul %x, %odd : (tensor<1x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<1x2x3x4xf32>
  %b2 = wse.mul %r, %odd : (tensor<1x2x3x4xf32>, tensor<1x1x3x4xf32>) -> tensor<1x2x3x4xf32>
  %y2 = wse.add %a2, %b2 : (tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>) -> tensor<1x2x3x4xf32>
  func.return %y, %y2 : tensor<1x2x3x4xf32>, tensor<1x2x3x4xf32>
}

// CHECK-LABEL: func.func @weights
// CHECK-NOT:     wse.rotary
// CHECK:         func.return
// WEIGHT-LABEL:  func.func @weights
// WEIGHT:        wse.rotary %{{.*}}, %{{.*}}, %{{.*}} {heads = 2 : i64}
// WEIGHT-NOT:    wse.rotary
// WEIGHT:        func.return
