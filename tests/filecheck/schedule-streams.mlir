// RUN: cgc opt %s --split-input-file --target mesh8x8 -p 'schedule-streams{optimizer="sgd" lr=0.1}' | filecheck %s
// RUN: cgc opt %s --split-input-file -p schedule-streams | filecheck %s --check-prefix=NOOPT
// RUN: cgc opt %s --split-input-file -p 'schedule-streams{optimizer="sgd"}' | filecheck %s --check-prefix=INFER
// RUN: cgc opt %s --split-input-file --verify-diagnostics -p 'schedule-streams{optimizer="lamb"}' | filecheck %s --check-prefix=BADOPT
// RUN: cgc opt %s --split-input-file -p 'schedule-streams{optimizer="adamw" weight_decay=0.01 amsgrad=true}' | filecheck %s --check-prefix=ADAMW
// RUN: cgc opt %s --split-input-file -p 'schedule-streams{optimizer="adamw"}' | filecheck %s --check-prefix=ADAMW-DEFAULTS

// Weight streaming: every layer runs on the whole mesh, every wse.weight (frozen ones too)
// becomes a ws.stream_weight with the same view, and a step that streams gradients ends
// with the optimizer that MemoryX runs.

builtin.module attributes {wse.target = #wse.target<"mesh4x8">} {
  func.func @main(%x: tensor<2x3xf32> loc("x")) -> tensor<f32> {
    %h, %saved = wse.layer "fc1"(%x) : (tensor<2x3xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
    ^bb0(%a: tensor<2x3xf32>):
      %w = wse.weight "fc1.weight" {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc1")
      %c = wse.weight "table" {frozen} : tensor<2x4xf32> loc("table")
      %m = wse.matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> loc("fc1")
      %s = wse.add %m, %c : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32> loc("fc1")
      wse.yield %s, %s : tensor<2x4xf32>, tensor<2x4xf32>
    } loc("fc1")
    %l = wse.layer "loss"(%h) : (tensor<2x4xf32>) -> tensor<f32> {
    ^bb0(%a: tensor<2x4xf32>):
      %s = wse.reduce_sum %a {axes = array<i64: 0, 1>} : tensor<2x4xf32> -> tensor<f32> loc("loss")
      wse.yield %s : tensor<f32>
    } loc("loss")
    wse.layer "fc1.grad"(%x) : (tensor<2x3xf32>) -> () {
    ^bb0(%a: tensor<2x3xf32>):
      %w = wse.weight "fc1.weight" {perm = array<i64: 0, 1>} : tensor<4x3xf32> loc("fc1")
      %one = wse.constant dense<1.0> : tensor<2x4xf32> loc("loss")
      %g = wse.transpose %a {perm = array<i64: 1, 0>} : tensor<2x3xf32> -> tensor<3x2xf32> loc("fc1")
      %gw = wse.matmul %g, %one : (tensor<3x2xf32>, tensor<2x4xf32>) -> tensor<3x4xf32> loc("fc1")
      ws.stream_gradient "fc1.weight", %gw {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc1")
      wse.yield
    } loc("fc1")
    func.return %l : tensor<f32>
  }
}

// CHECK:       builtin.module attributes {wse.target = #wse.target<"mesh8x8", rows = 8, cols = 8, {{.*}}>} {
// CHECK:         wse.layer "fc1"(%x) {rect = #wse.rect<0, 0, 8x8>}
// CHECK-NEXT:    ^{{.*}}(%[[A:.*]]: tensor<2x3xf32>):
// CHECK-NEXT:      %[[W:.*]] = ws.stream_weight "fc1.weight" {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc1")
// CHECK-NEXT:      %[[C:.*]] = ws.stream_weight "table" : tensor<2x4xf32> loc("table")
// CHECK-NEXT:      %[[M:.*]] = wse.matmul %[[A]], %[[W]]
// CHECK-NEXT:      wse.add %[[M]], %[[C]]
// CHECK:         wse.layer "loss"(%{{.*}}) {rect = #wse.rect<0, 0, 8x8>}
// CHECK:         wse.layer "fc1.grad"(%x) {rect = #wse.rect<0, 0, 8x8>}
// CHECK-NEXT:    ^{{.*}}(%{{.*}}: tensor<2x3xf32>):
// CHECK-NEXT:      ws.stream_weight "fc1.weight" {perm = array<i64: 0, 1>} : tensor<4x3xf32> loc("fc1")
// CHECK:           ws.stream_gradient "fc1.weight", %{{.*}} {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc1")
// CHECK:         ws.optimizer_step "sgd" {dampening = 0.000000e+00 : f64, lr = 1.000000e-01 : f64, momentum = 0.000000e+00 : f64, nesterov = 0.000000e+00 : f64, weight_decay = 0.000000e+00 : f64}
// CHECK-NEXT:    func.return
// CHECK-NOT:     wse.weight
// CHECK:       // -----
// CHECK:         wse.layer "fc"(%x) {rect = #wse.rect<0, 0, 8x8>}
// CHECK-NOT:     ws.optimizer_step

// Without an optimizer: no step; the mesh is the module's target.
// NOOPT:       wse.layer "fc1"(%x) {rect = #wse.rect<0, 0, 8x4>}
// NOOPT-NOT:   wse.weight
// NOOPT:       wse.layer "loss"(%{{.*}}) {rect = #wse.rect<0, 0, 8x4>}
// NOOPT:       wse.layer "fc1.grad"(%x) {rect = #wse.rect<0, 0, 8x4>}
// NOOPT-NOT:   ws.optimizer_step
// NOOPT:       func.return

// BADOPT:      error: schedule-streams: unknown optimizer 'lamb'
// BADOPT-NEXT: // -----
// BADOPT-NEXT: builtin.module

// Only the optimizer's own hyper-parameters go into the step; those not given take its
// defaults, torch.optim's (AdamW's weight decay is 0.01).
// ADAMW-DEFAULTS: ws.optimizer_step "adamw" {amsgrad = 0.000000e+00 : f64, beta1 = 9.000000e-01 : f64, beta2 = 9.990000e-01 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 1.000000e-02 : f64}
// ADAMW:       ws.optimizer_step "adamw" {amsgrad = 1.000000e+00 : f64, beta1 = 9.000000e-01 : f64, beta2 = 9.990000e-01 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 1.000000e-02 : f64}

// -----

builtin.module attributes {wse.target = #wse.target<"wse2@3x5">} {
  func.func @main(%x: tensor<2x3xf32> loc("x")) -> tensor<2x4xf32> {
    %y = wse.layer "fc"(%x) : (tensor<2x3xf32>) -> tensor<2x4xf32> {
    ^bb0(%a: tensor<2x3xf32>):
      %w = wse.weight "fc.weight" : tensor<3x4xf32> loc("fc")
      %m = wse.matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> loc("fc")
      wse.yield %m : tensor<2x4xf32>
    } loc("fc")
    func.return %y : tensor<2x4xf32>
  }
}

// Inference streams no gradient, so there is no optimizer step even with an optimizer.
// INFER:       // -----
// INFER:       %[[Y:.*]] = wse.layer "fc"(%x) {rect = #wse.rect<0, 0, 5x3>}
// INFER-NEXT:  ^{{.*}}(%[[A:.*]]: tensor<2x3xf32>):
// INFER-NEXT:    %[[W:.*]] = ws.stream_weight "fc.weight" : tensor<3x4xf32> loc("fc")
// INFER-NEXT:    %[[M:.*]] = wse.matmul %[[A]], %[[W]] : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> loc("fc")
// INFER-NEXT:    wse.yield %[[M]] : tensor<2x4xf32>
// INFER-NEXT:  } loc("fc")
// INFER-NEXT:  func.return %[[Y]] : tensor<2x4xf32>
