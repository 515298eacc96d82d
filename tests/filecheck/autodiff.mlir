// RUN: cgc opt %s -p autodiff | filecheck %s
// RUN: cgc opt %s -p 'autodiff{trainable="fc1[.]weight" loss_scale=0.25}' | filecheck %s --check-prefix=SUBSET

// The first result of @main is the loss. Each forward layer gets a backward layer
// '<layer>.grad', appended in reverse order; a forward layer also yields the activations
// its backward layer needs (here fc1's only result, which it yields already); weight
// gradients stream out with the weight's view (perm).

func.func @main(%x: tensor<2x3xf32> loc("x")) -> (tensor<f32>, tensor<2x4xf32>) {
  %h = wse.layer "fc1"(%x) : (tensor<2x3xf32>) -> tensor<2x4xf32> {
  ^bb0(%a: tensor<2x3xf32>):
    %w = wse.weight "fc1.weight" {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc1")
    %m = wse.matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> loc("fc1")
    %t = wse.tanh %m : tensor<2x4xf32> loc("act")
    wse.yield %t : tensor<2x4xf32>
  } loc("fc1")
  %l = wse.layer "fc2"(%h) : (tensor<2x4xf32>) -> tensor<f32> {
  ^bb0(%a: tensor<2x4xf32>):
    %v = wse.weight "fc2.weight" : tensor<4x1xf32> loc("fc2")
    %m = wse.matmul %a, %v : (tensor<2x4xf32>, tensor<4x1xf32>) -> tensor<2x1xf32> loc("fc2")
    %s = wse.reduce_mean %m {axes = array<i64: 0, 1>} : tensor<2x1xf32> -> tensor<f32> loc("loss")
    wse.yield %s : tensor<f32>
  } loc("fc2")
  func.return %l, %h : tensor<f32>, tensor<2x4xf32>
}

// CHECK-LABEL: func.func @main
// CHECK-NEXT:    %[[H:.*]] = wse.layer "fc1"(%x) : (tensor<2x3xf32>) -> tensor<2x4xf32> {
// CHECK:           %[[T:.*]] = wse.tanh %{{.*}} : tensor<2x4xf32> loc("act")
// CHECK-NEXT:      wse.yield %[[T]] : tensor<2x4xf32>
// CHECK-NEXT:    } loc("fc1")
// CHECK-NEXT:    %[[L:.*]] = wse.layer "fc2"(%[[H]]) : (tensor<2x4xf32>) -> tensor<f32> {
// CHECK:           wse.yield %{{.*}} : tensor<f32>
// CHECK-NEXT:    } loc("fc2")

// The loss is a mean over 2 elements: the seed 1 is spread and scaled by 1/2.
// CHECK-NEXT:    %[[G2:.*]] = wse.layer "fc2.grad"(%[[H]]) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
// CHECK-NEXT:    ^{{.*}}(%[[A:.*]]: tensor<2x4xf32>):
// CHECK-NEXT:      %[[V:.*]] = wse.weight "fc2.weight" : tensor<4x1xf32> loc("fc2")
// CHECK-NEXT:      %[[SEED:.*]] = wse.constant dense<1.000000e+00> : tensor<f32> loc("loss")
// CHECK-NEXT:      %[[R:.*]] = wse.reshape %[[SEED]] : tensor<f32> -> tensor<1x1xf32> loc("loss")
// CHECK-NEXT:      %[[B:.*]] = wse.broadcast_to %[[R]] : tensor<1x1xf32> -> tensor<2x1xf32> loc("loss")
// CHECK-NEXT:      %[[HALF:.*]] = wse.constant dense<5.000000e-01> : tensor<f32> loc("loss")
// CHECK-NEXT:      %[[GM:.*]] = wse.mul %[[B]], %[[HALF]] : (tensor<2x1xf32>, tensor<f32>) -> tensor<2x1xf32> loc("loss")
// CHECK-NEXT:      %[[VT:.*]] = wse.transpose %[[V]] {perm = array<i64: 1, 0>} : tensor<4x1xf32> -> tensor<1x4xf32> loc("fc2")
// CHECK-NEXT:      %[[GA:.*]] = wse.matmul %[[GM]], %[[VT]] : (tensor<2x1xf32>, tensor<1x4xf32>) -> tensor<2x4xf32> loc("fc2")
// CHECK-NEXT:      %[[GV:.*]] = wse.matmul_transpose_a %[[A]], %[[GM]] : (tensor<2x4xf32>, tensor<2x1xf32>) -> tensor<4x1xf32> loc("fc2")
// CHECK-NEXT:      ws.stream_gradient "fc2.weight", %[[GV]] : tensor<4x1xf32> loc("fc2")
// CHECK-NEXT:      wse.yield %[[GA]] : tensor<2x4xf32>
// CHECK-NEXT:    } loc("fc2")

// tanh' = 1 - tanh^2 from the saved activation; the gradient of a permuted view is
// streamed with its perm.
// CHECK-NEXT:    wse.layer "fc1.grad"(%[[G2]], %[[H]], %x) : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x3xf32>) -> () {
// CHECK-NEXT:    ^{{.*}}(%[[G:.*]]: tensor<2x4xf32>, %[[Y:.*]]: tensor<2x4xf32>, %[[X:.*]]: tensor<2x3xf32>):
// CHECK-NEXT:      %[[W:.*]] = wse.weight "fc1.weight" {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc1")
// CHECK:           %[[ONE:.*]] = wse.constant dense<1.000000e+00> : tensor<f32> loc("act")
// CHECK-NEXT:      %[[YY:.*]] = wse.mul %[[Y]], %[[Y]] : {{.*}} loc("act")
// CHECK-NEXT:      %[[D:.*]] = wse.sub %[[ONE]], %[[YY]] : {{.*}} loc("act")
// CHECK-NEXT:      %[[GT:.*]] = wse.mul %[[G]], %[[D]] : {{.*}} loc("act")
// CHECK:           %[[GW:.*]] = wse.matmul_transpose_a %[[X]], %[[GT]] : (tensor<2x3xf32>, tensor<2x4xf32>) -> tensor<3x4xf32> loc("fc1")
// CHECK-NEXT:      ws.stream_gradient "fc1.weight", %[[GW]] {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc1")
// CHECK-NEXT:      wse.yield
// CHECK-NEXT:    } loc("fc1")
// CHECK-NEXT:    func.return %[[L]], %[[H]] : tensor<f32>, tensor<2x4xf32>

// Only fc1.weight is trained: fc2.grad streams nothing but still passes the gradient on;
// the seed is the loss scale.
// SUBSET-LABEL: wse.layer "fc2.grad"
// SUBSET:         wse.constant dense<2.500000e-01> : tensor<f32>
// SUBSET-NOT:     ws.stream_gradient
// SUBSET:         wse.layer "fc1.grad"
// SUBSET:         ws.stream_gradient "fc1.weight", %{{.*}} {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc1")
// SUBSET-NOT:     ws.stream_gradient
// SUBSET:         func.return
