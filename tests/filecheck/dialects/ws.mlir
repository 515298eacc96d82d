// RUN: cgc opt %s | filecheck %s
// RUN: %cgc-generic %s > %t.generic.mlir
// RUN: filecheck %s --check-prefix=GENERIC --input-file %t.generic.mlir
// RUN: cgc opt %t.generic.mlir | filecheck %s

// The ws dialect (weight streaming) in its custom form, printed back the same way, also
// after a trip through the generic form.

builtin.module attributes {wse.target = #wse.target<"mesh4x4">} {
  func.func @main(%x: tensor<2x3xf32> loc("x")) -> tensor<2x4xf32> {
    %y = wse.layer "fc"(%x) {rect = #wse.rect<0, 0, 4x4>} : (tensor<2x3xf32>) -> tensor<2x4xf32> {
    ^bb0(%a: tensor<2x3xf32>):
      %w = ws.stream_weight "fc.weight" {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc")
      %b = ws.stream_weight "fc.bias" : tensor<4xf32> loc("fc")
      %m = wse.matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> loc("fc")
      %s = wse.add %m, %b : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32> loc("fc")
      ws.stream_gradient "fc.weight", %w {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc")
      ws.stream_gradient "fc.bias", %b : tensor<4xf32> loc("fc")
      wse.yield %s : tensor<2x4xf32>
    } loc("fc")
    ws.optimizer_step "sgd" {lr = 1.000000e-01 : f64, momentum = 9.000000e-01 : f64} loc("step")
    ws.optimizer_step "adam" {}
    ws.optimizer_step "adamw" {beta1 = 9.000000e-01 : f64, weight_decay = 1.000000e-02 : f64}
    func.return %y : tensor<2x4xf32>
  }
}

// CHECK:       builtin.module attributes {wse.target = #wse.target<"mesh4x4", rows = 4, cols = 4, {{.*}}>} {
// CHECK-LABEL: func.func @main(%x: tensor<2x3xf32> loc("x")) -> tensor<2x4xf32> {
// CHECK-NEXT:    %y = wse.layer "fc"(%x) {rect = #wse.rect<0, 0, 4x4>} : (tensor<2x3xf32>) -> tensor<2x4xf32> {
// CHECK-NEXT:    ^{{.*}}(%a: tensor<2x3xf32>):
// CHECK-NEXT:      %w = ws.stream_weight "fc.weight" {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc")
// CHECK-NEXT:      %b = ws.stream_weight "fc.bias" : tensor<4xf32> loc("fc")
// CHECK-NEXT:      %m = wse.matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> loc("fc")
// CHECK-NEXT:      %s = wse.add %m, %b : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32> loc("fc")
// CHECK-NEXT:      ws.stream_gradient "fc.weight", %w {perm = array<i64: 1, 0>} : tensor<3x4xf32> loc("fc")
// CHECK-NEXT:      ws.stream_gradient "fc.bias", %b : tensor<4xf32> loc("fc")
// CHECK-NEXT:      wse.yield %s : tensor<2x4xf32>
// CHECK-NEXT:    } loc("fc")
// CHECK-NEXT:    ws.optimizer_step "sgd" {lr = 1.000000e-01 : f64, momentum = 9.000000e-01 : f64} loc("step")
// CHECK-NEXT:    ws.optimizer_step "adam" {}
// CHECK-NEXT:    ws.optimizer_step "adamw" {beta1 = 9.000000e-01 : f64, weight_decay = 1.000000e-02 : f64}
// CHECK-NEXT:    func.return %y : tensor<2x4xf32>
// CHECK-NEXT:  }
// CHECK-NEXT: }

// GENERIC:      %w = "ws.stream_weight"() <{name = "fc.weight", perm = array<i64: 1, 0>}> : () -> tensor<3x4xf32> loc("fc")
// GENERIC-NEXT: %b = "ws.stream_weight"() <{name = "fc.bias"}> : () -> tensor<4xf32> loc("fc")
// GENERIC:      "ws.stream_gradient"(%w) <{name = "fc.weight", perm = array<i64: 1, 0>}> : (tensor<3x4xf32>) -> () loc("fc")
// GENERIC-NEXT: "ws.stream_gradient"(%b) <{name = "fc.bias"}> : (tensor<4xf32>) -> () loc("fc")
// GENERIC:      "ws.optimizer_step"() <{optimizer = "sgd", config = {lr = 1.000000e-01 : f64, momentum = 9.000000e-01 : f64}}> : () -> () loc("step")
// GENERIC-NEXT: "ws.optimizer_step"() <{optimizer = "adam", config = {}}> : () -> ()
// GENERIC-NEXT: "ws.optimizer_step"() <{optimizer = "adamw", config = {beta1 = 9.000000e-01 : f64, weight_decay = 1.000000e-02 : f64}}> : () -> ()
