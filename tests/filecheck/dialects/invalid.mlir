// RUN: cgc opt %s --split-input-file --verify-diagnostics 2>&1 | filecheck %s

// One broken verifier rule per case; `cgc opt` names the file and the rule in one line
// (exit status 2; with --verify-diagnostics the line is the output, exit status 0).

func.func @main(%a: tensor<4x3xf32>, %b: tensor<4x3xf32>) {
  %r = wse.matmul %a, %b : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.matmul: matmul contraction mismatch: (4, 3) x (4, 3)
// CHECK-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3xf32>, %b: tensor<4xf32>) {
  %r = wse.add %a, %b : (tensor<2x3xf32>, tensor<4xf32>) -> tensor<2x3xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.add: shapes [(2, 3), (4,)] do not broadcast
// CHECK-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3x4xf32>) {
  %r = wse.reduce_sum %a {axes = array<i64: 2, 0>} : tensor<2x3x4xf32> -> tensor<3xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.reduce_sum: axes must be sorted, got (2, 0)
// CHECK-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3xf32>) {
  %r = wse.transpose %a {perm = array<i64: 0, 0>} : tensor<2x3xf32> -> tensor<2x2xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.transpose: (0, 0) is not a permutation of 2 axes
// CHECK-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3xf32>) {
  %r = wse.reshape %a : tensor<2x3xf32> -> tensor<4x2xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.reshape: cannot reshape (2, 3) into (4, 2)
// CHECK-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) {
  %r = wse.concat %a, %b {axis = 0 : i64} : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<5x3xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.concat: cannot concatenate [(2, 3), (3, 2)] on axis 0
// CHECK-NOT: Traceback

// -----

func.func @main(%a: tensor<4xf32>) {
  %r = wse.slice %a {starts = array<i64: 1>, limits = array<i64: 6>, strides = array<i64: 1>} : tensor<4xf32> -> tensor<5xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.slice: bad slice [1:6:1] of an axis of size 4
// CHECK-NOT: Traceback

// -----

func.func @main(%a: tensor<4xf32>) {
  %r = wse.pad %a {low = array<i64: -1>, high = array<i64: 2>} : tensor<4xf32> -> tensor<5xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.pad: pad amounts must be non-negative
// CHECK-NOT: Traceback

// -----

func.func @main(%a: tensor<4xf32>) {
  %r = wse.one_hot %a : tensor<4xf32> -> tensor<4x3xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.one_hot: indices must be integers
// CHECK-NOT: Traceback

// -----

func.func @main(%x: tensor<1x3x5x5xf32>, %w: tensor<2x4x3x3xf32>) {
  %r = wse.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x3x5x5xf32>, tensor<2x4x3x3xf32>) -> tensor<1x2x3x3xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.conv: conv channels do not match: input 3, filter (2, 4, 3, 3), group 1
// CHECK-NOT: Traceback

// -----

func.func @main(%x: tensor<2xf32>) {
  %r = wse.layer "bad"(%x) : (tensor<2xf32>) -> tensor<3xf32> {
  ^bb0(%a: tensor<3xf32>):
    wse.yield %a : tensor<3xf32>
  }
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.layer: layer 'bad': block arguments do not match its inputs
// CHECK-NOT: Traceback

// -----

func.func @main(%x: tensor<2xf32>) {
  wse.yield %x : tensor<2xf32>
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.yield: 'wse.yield' expects parent op to be one of 'wse.layer', 'wse.fused_matmul'
// CHECK-NOT: Traceback

// -----

func.func @main() {
  ws.optimizer_step "rmsprop" {lr = 1.000000e-01 : f64}
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: ws.optimizer_step: unknown optimizer 'rmsprop' (expected one of ('sgd', 'adam', 'adamw'))
// CHECK-NOT: Traceback

// -----

func.func @main() {
  %w = wse.weight "w" {perm = array<i64: 1, 0, 2>} : tensor<2x3xf32>
  func.return
}

// CHECK: error: {{.*}}invalid.mlir: invalid IR: wse.weight: (1, 0, 2) is not a permutation of 2 axes
// CHECK-NOT: Traceback

// -----

// A syntax error names its line and column (of the whole file, as tests/test_passes.py checks).
func.func @main(%a: tensor<2xf32>) {
  %r = wse.relu %a tensor<2xf32>
}

// CHECK: error: {{.*}}invalid.mlir:{{[0-9]+}}:{{[0-9]+}}: Expected ':'
