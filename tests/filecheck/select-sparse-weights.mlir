// RUN: cgc opt %s --split-input-file -p 'select-sparse-weights{density=0.25}' | filecheck %s
// RUN: cgc opt %s --split-input-file --verify-diagnostics -p 'select-sparse-weights{density=0.5 patterns="fc[.]bias","pos"}' | filecheck %s --check-prefix=PATTERNS
// RUN: cgc opt %s --split-input-file --verify-diagnostics -p 'select-sparse-weights{density=0.5 patterns="none"}' | filecheck %s --check-prefix=NONE
// RUN: cgc opt %s --split-input-file --verify-diagnostics -p 'select-sparse-weights{density=1.5}' | filecheck %s --check-prefix=DENSITY

// By default a sparsity makes sparse the matrices a matmul multiplies: not the embedding
// table a gather reads rows of, nor the position table added to the activations, nor the
// bias. A weight of N values keeps round(density * N) of them (at least one); a weight that
// keeps them all stays dense (tiny.weight, of one value). A training's candidates are the
// weights it streams gradients of: the frozen head is read, not trained.

func.func @main(%ids: tensor<2x8xi64> loc("ids"), %s: tensor<2x1xf32> loc("s")) -> tensor<2x8x4xf32> {
  %e = wse.weight "embed.weight" : tensor<100x32xf32> loc("embed")
  %x = wse.gather %e, %ids {axis = 0 : i64} : (tensor<100x32xf32>, tensor<2x8xi64>) -> tensor<2x8x32xf32> loc("embed")
  %p = wse.weight "pos" : tensor<8x32xf32> loc("pos")
  %h = wse.add %x, %p : (tensor<2x8x32xf32>, tensor<8x32xf32>) -> tensor<2x8x32xf32> loc("pos")
  %w = wse.weight "fc.weight" {perm = array<i64: 1, 0>} : tensor<32x4xf32> loc("fc")
  %m = wse.matmul %h, %w : (tensor<2x8x32xf32>, tensor<32x4xf32>) -> tensor<2x8x4xf32> loc("fc")
  %b = wse.weight "fc.bias" : tensor<4xf32> loc("fc")
  %y = wse.add %m, %b : (tensor<2x8x4xf32>, tensor<4xf32>) -> tensor<2x8x4xf32> loc("fc")
  %t = wse.weight "tiny.weight" : tensor<1x1xf32> loc("tiny")
  %z = wse.matmul %s, %t : (tensor<2x1xf32>, tensor<1x1xf32>) -> tensor<2x1xf32> loc("tiny")
  func.return %y : tensor<2x8x4xf32>
}

// CHECK:      builtin.module attributes {wse.sparse_weights = {fc.weight = 32 : i64}} {
// CHECK-NEXT:   func.func @main

// PATTERNS:   builtin.module attributes {wse.sparse_weights = {fc.bias = 2 : i64, pos = 128 : i64}} {

// NONE:       error: --sparse-params: no weight is sparse (patterns ['none'])

// DENSITY:    error: sparsity density 1.5: must be in (0, 1]

// -----

builtin.module attributes {wse.target = #wse.target<"mesh4x4">} {
  func.func @main(%x: tensor<2x3xf32> loc("x")) -> tensor<2x2xf32> {
    %y = wse.layer "fc"(%x) : (tensor<2x3xf32>) -> tensor<2x4xf32> {
    ^bb0(%a: tensor<2x3xf32>):
      %w = ws.stream_weight "fc.weight" : tensor<3x4xf32> loc("fc")
      %m = wse.matmul %a, %w : (tensor<2x3xf32>, tensor<3x4xf32>) -> tensor<2x4xf32> loc("fc")
      ws.stream_gradient "fc.weight", %w : tensor<3x4xf32> loc("fc")
      wse.yield %m : tensor<2x4xf32>
    } loc("fc")
    %z = wse.layer "head"(%y) : (tensor<2x4xf32>) -> tensor<2x2xf32> {
    ^bb0(%a: tensor<2x4xf32>):
      %w = ws.stream_weight "head.weight" : tensor<4x2xf32> loc("head")
      %m = wse.matmul %a, %w : (tensor<2x4xf32>, tensor<4x2xf32>) -> tensor<2x2xf32> loc("head")
      wse.yield %m : tensor<2x2xf32>
    } loc("head")
    func.return %z : tensor<2x2xf32>
  }
}

// CHECK:      builtin.module attributes {wse.target = {{.*}}, wse.sparse_weights = {fc.weight = 3 : i64}} {

// PATTERNS:   error: --sparse-params: no trained weight is sparse (patterns ['fc[.]bias', 'pos'])
