// RUN: cgc opt %s -p 'autodiff,recompute-activations{segments="b[.][0-9]+[.]"}' | filecheck %s
// RUN: cgc opt %s -p 'autodiff,recompute-activations' | filecheck %s --check-prefix=NONE
// RUN: cgc opt %s -p 'autodiff,recompute-activations{segments="h[.]"}' | filecheck %s --check-prefix=NONE

// Layers 'b.0.fc1' and 'b.0.fc2' form segment 'b.0.'; 'head' is in none. Right before the
// segment's first backward layer, copies of its forward layers compute its activations again
// from what entered the segment (%x); the segment's backward layers read the copies' results.
// 'head.grad' keeps reading the original %g: a value that leaves the segment is a checkpoint.

func.func @main(%x: tensor<2x4xf32> loc("x")) -> tensor<f32> {
  %h = wse.layer "b.0.fc1"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    %w = wse.weight "b.0.fc1.weight" : tensor<4x4xf32> loc("b.0.fc1")
    %m = wse.matmul %a, %w : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32> loc("b.0.fc1")
    %t = wse.tanh %m : tensor<2x4xf32> loc("b.0.act")
    wse.yield %t : tensor<2x4xf32>
  } loc("b.0.fc1")
  %g = wse.layer "b.0.fc2"(%h) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x4xf32>):
    %w = wse.weight "b.0.fc2.weight" : tensor<4x4xf32> loc("b.0.fc2")
    %m = wse.matmul %a, %w : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32> loc("b.0.fc2")
    %t = wse.tanh %m : tensor<2x4xf32> loc("b.0.act2")
    wse.yield %t : tensor<2x4xf32>
  } loc("b.0.fc2")
  %l = wse.layer "head"(%g) : (tensor<2x4xf32>) -> tensor<f32> {
  ^bb0(%a: tensor<2x4xf32>):
    %v = wse.weight "head.weight" : tensor<4x1xf32> loc("head")
    %m = wse.matmul %a, %v : (tensor<2x4xf32>, tensor<4x1xf32>) -> tensor<2x1xf32> loc("head")
    %s = wse.reduce_mean %m {axes = array<i64: 0, 1>} : tensor<2x1xf32> -> tensor<f32> loc("loss")
    wse.yield %s : tensor<f32>
  } loc("head")
  func.return %l : tensor<f32>
}

// CHECK-LABEL: func.func @main
// CHECK:         %[[H:.*]] = wse.layer "b.0.fc1"(%x)
// CHECK:         %[[G:.*]] = wse.layer "b.0.fc2"(%[[H]])
// CHECK:         %[[L:.*]] = wse.layer "head"(%[[G]])
// CHECK:         %[[D:.*]] = wse.layer "head.grad"(%[[G]])
// CHECK:         %[[H2:.*]] = wse.layer "b.0.fc1.recompute"(%x)
// CHECK:           wse.weight "b.0.fc1.weight"
// CHECK:         } loc("b.0.fc1")
// CHECK-NEXT:    %[[G2:.*]] = wse.layer "b.0.fc2.recompute"(%[[H2]])
// CHECK:           wse.weight "b.0.fc2.weight"
// CHECK:         } loc("b.0.fc2")
// CHECK-NEXT:    %[[D2:.*]] = wse.layer "b.0.fc2.grad"(%[[D]], %[[G2]], %[[H2]])
// CHECK:         wse.layer "b.0.fc1.grad"(%[[D2]], %[[H2]], %x)
// CHECK:         func.return %[[L]]

// Without segments, or when no layer name starts with a match, nothing is copied.
// NONE-NOT:      recompute
// NONE:          wse.layer "b.0.fc2.grad"
