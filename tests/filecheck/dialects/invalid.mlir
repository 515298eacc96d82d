// RUN: %cgc-split %s %t
// RUN: not cgc opt %t/0.mlir 2>&1 | filecheck %s --check-prefix=MATMUL
// RUN: not cgc opt %t/1.mlir 2>&1 | filecheck %s --check-prefix=BROADCAST
// RUN: not cgc opt %t/2.mlir 2>&1 | filecheck %s --check-prefix=AXES
// RUN: not cgc opt %t/3.mlir 2>&1 | filecheck %s --check-prefix=PERM
// RUN: not cgc opt %t/4.mlir 2>&1 | filecheck %s --check-prefix=RESHAPE
// RUN: not cgc opt %t/5.mlir 2>&1 | filecheck %s --check-prefix=CONCAT
// RUN: not cgc opt %t/6.mlir 2>&1 | filecheck %s --check-prefix=SLICE
// RUN: not cgc opt %t/7.mlir 2>&1 | filecheck %s --check-prefix=PAD
// RUN: not cgc opt %t/8.mlir 2>&1 | filecheck %s --check-prefix=ONEHOT
// RUN: not cgc opt %t/9.mlir 2>&1 | filecheck %s --check-prefix=CONV
// RUN: not cgc opt %t/10.mlir 2>&1 | filecheck %s --check-prefix=BLOCKARGS
// RUN: not cgc opt %t/11.mlir 2>&1 | filecheck %s --check-prefix=YIELD
// RUN: not cgc opt %t/12.mlir 2>&1 | filecheck %s --check-prefix=OPTIMIZER
// RUN: not cgc opt %t/13.mlir 2>&1 | filecheck %s --check-prefix=WEIGHTPERM

// One broken verifier rule per case; `cgc opt` names the file and the rule in one line
// and exits with status 2 (`not` checks only that it fails).

func.func @main(%a: tensor<4x3xf32>, %b: tensor<4x3xf32>) {
  %r = wse.matmul %a, %b : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32>
  func.return
}

// MATMUL: error: {{.*}}/0.mlir: invalid IR: wse.matmul: matmul contraction mismatch: (4, 3) x (4, 3)
// MATMUL-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3xf32>, %b: tensor<4xf32>) {
  %r = wse.add %a, %b : (tensor<2x3xf32>, tensor<4xf32>) -> tensor<2x3xf32>
  func.return
}

// BROADCAST: error: {{.*}}/1.mlir: invalid IR: wse.add: shapes [(2, 3), (4,)] do not broadcast
// BROADCAST-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3x4xf32>) {
  %r = wse.reduce_sum %a {axes = array<i64: 2, 0>} : tensor<2x3x4xf32> -> tensor<3xf32>
  func.return
}

// AXES: error: {{.*}}/2.mlir: invalid IR: wse.reduce_sum: axes must be sorted, got (2, 0)
// AXES-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3xf32>) {
  %r = wse.transpose %a {perm = array<i64: 0, 0>} : tensor<2x3xf32> -> tensor<2x2xf32>
  func.return
}

// PERM: error: {{.*}}/3.mlir: invalid IR: wse.transpose: (0, 0) is not a permutation of 2 axes
// PERM-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3xf32>) {
  %r = wse.reshape %a : tensor<2x3xf32> -> tensor<4x2xf32>
  func.return
}

// RESHAPE: error: {{.*}}/4.mlir: invalid IR: wse.reshape: cannot reshape (2, 3) into (4, 2)
// RESHAPE-NOT: Traceback

// -----

func.func @main(%a: tensor<2x3xf32>, %b: tensor<3x2xf32>) {
  %r = wse.concat %a, %b {axis = 0 : i64} : (tensor<2x3xf32>, tensor<3x2xf32>) -> tensor<5x3xf32>
  func.return
}

// CONCAT: error: {{.*}}/5.mlir: invalid IR: wse.concat: cannot concatenate [(2, 3), (3, 2)] on axis 0
// CONCAT-NOT: Traceback

// -----

func.func @main(%a: tensor<4xf32>) {
  %r = wse.slice %a {starts = array<i64: 1>, limits = array<i64: 6>, strides = array<i64: 1>} : tensor<4xf32> -> tensor<5xf32>
  func.return
}

// SLICE: error: {{.*}}/6.mlir: invalid IR: wse.slice: bad slice [1:6:1] of an axis of size 4
// SLICE-NOT: Traceback

// -----

func.func @main(%a: tensor<4xf32>) {
  %r = wse.pad %a {low = array<i64: -1>, high = array<i64: 2>} : tensor<4xf32> -> tensor<5xf32>
  func.return
}

// PAD: error: {{.*}}/7.mlir: invalid IR: wse.pad: pad amounts must be non-negative
// PAD-NOT: Traceback

// -----

func.func @main(%a: tensor<4xf32>) {
  %r = wse.one_hot %a : tensor<4xf32> -> tensor<4x3xf32>
  func.return
}

// ONEHOT: error: {{.*}}/8.mlir: invalid IR: wse.one_hot: indices must be integers
// ONEHOT-NOT: Traceback

// -----

func.func @main(%x: tensor<1x3x5x5xf32>, %w: tensor<2x4x3x3xf32>) {
  %r = wse.conv %x, %w {strides = array<i64: 1, 1>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : (tensor<1x3x5x5xf32>, tensor<2x4x3x3xf32>) -> tensor<1x2x3x3xf32>
  func.return
}

// CONV: error: {{.*}}/9.mlir: invalid IR: wse.conv: conv channels do not match: input 3, filter (2, 4, 3, 3), group 1
// CONV-NOT: Traceback

// -----

func.func @main(%x: tensor<2xf32>) {
  %r = wse.layer "bad"(%x) : (tensor<2xf32>) -> tensor<3xf32> {
  ^bb0(%a: tensor<3xf32>):
    wse.yield %a : tensor<3xf32>
  }
  func.return
}

// BLOCKARGS: error: {{.*}}/10.mlir: invalid IR: wse.layer: layer 'bad': block arguments do not match its inputs
// BLOCKARGS-NOT: Traceback

// -----

func.func @main(%x: tensor<2xf32>) {
  wse.yield %x : tensor<2xf32>
}

// YIELD: error: {{.*}}/11.mlir: invalid IR: wse.yield: 'wse.yield' expects parent op 'wse.layer'
// YIELD-NOT: Traceback

// -----

func.func @main() {
  ws.optimizer_step "rmsprop" {lr = 1.000000e-01 : f64}
  func.return
}

// OPTIMIZER: error: {{.*}}/12.mlir: invalid IR: ws.optimizer_step: unknown optimizer 'rmsprop' (expected one of ('sgd', 'adam', 'adamw'))
// OPTIMIZER-NOT: Traceback

// -----

func.func @main() {
  %w = wse.weight "w" {perm = array<i64: 1, 0, 2>} : tensor<2x3xf32>
  func.return
}

// WEIGHTPERM: error: {{.*}}/13.mlir: invalid IR: wse.weight: (1, 0, 2) is not a permutation of 2 axes
// WEIGHTPERM-NOT: Traceback
