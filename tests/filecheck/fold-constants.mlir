// RUN: cgc opt %s -p fold-constants | filecheck %s

// fold-constants folds constant-only primitives, turns reshapes and transposes of weights
// into weight views, drops identities and dead pure ops, moves last-axis slices above
// reshapes, and never folds to inf or nan.

func.func @chain() -> tensor<f32> {
  %a = wse.constant dense<[1.0, 2.0, -4.0]> : tensor<3xf32> loc("a")
  %h = wse.constant dense<0.5> : tensor<f32> loc("h")
  %m = wse.mul %a, %h : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32> loc("scaled")
  %s = wse.reduce_sum %m {axes = array<i64: 0>} : tensor<3xf32> -> tensor<f32> loc("total")
  func.return %s : tensor<f32>
}

// sum([1, 2, -4] * 0.5) = -0.5, with the location of the last folded op.
// CHECK-LABEL: func.func @chain() -> tensor<f32> {
// CHECK-NEXT:    %[[C:.*]] = wse.constant dense<-5.000000e-01> : tensor<f32> loc("total")
// CHECK-NEXT:    func.return %[[C]] : tensor<f32>

func.func @compare() -> tensor<2xi1> {
  %a = wse.constant dense<[1, 5]> : tensor<2xi64>
  %b = wse.constant dense<3> : tensor<i64>
  %g = wse.greater %a, %b : (tensor<2xi64>, tensor<i64>) -> tensor<2xi1> loc("gt")
  func.return %g : tensor<2xi1>
}

// CHECK-LABEL: func.func @compare
// CHECK-NEXT:    %[[C:.*]] = wse.constant dense<[false, true]> : tensor<2xi1> loc("gt")
// CHECK-NEXT:    func.return %[[C]] : tensor<2xi1>

func.func @partial(%x: tensor<3xf32>) -> tensor<3xf32> {
  %one = wse.constant dense<1.0> : tensor<f32>
  %y = wse.add %x, %one : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32> loc("inc")
  func.return %y : tensor<3xf32>
}

// CHECK-LABEL: func.func @partial
// CHECK-NEXT:    %[[ONE:.*]] = wse.constant dense<1.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[Y:.*]] = wse.add %x, %[[ONE]] : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32> loc("inc")
// CHECK-NEXT:    func.return %[[Y]]

func.func @non_finite() -> (tensor<2xf32>, tensor<f32>) {
  %z = wse.constant dense<[0.0, 1.0]> : tensor<2xf32>
  %l = wse.log %z : tensor<2xf32> loc("log0")
  %one = wse.constant dense<1.0> : tensor<f32>
  %zero = wse.constant dense<0.0> : tensor<f32>
  %d = wse.div %one, %zero : (tensor<f32>, tensor<f32>) -> tensor<f32> loc("div0")
  func.return %l, %d : tensor<2xf32>, tensor<f32>
}

// CHECK-LABEL: func.func @non_finite
// CHECK:         %[[L:.*]] = wse.log %{{.*}} : tensor<2xf32> loc("log0")
// CHECK:         %[[D:.*]] = wse.reciprocal %{{.*}} : tensor<f32> loc("div0")
// CHECK-NEXT:    func.return %[[L]], %[[D]]

func.func @too_big() -> tensor<5x13xf32> {
  %c = wse.constant dense<2.0> : tensor<f32>
  %b = wse.broadcast_to %c : tensor<f32> -> tensor<5x13xf32> loc("big")
  func.return %b : tensor<5x13xf32>
}

// More than 64 elements stay a broadcast.
// CHECK-LABEL: func.func @too_big
// CHECK-NEXT:    %[[C:.*]] = wse.constant dense<2.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[B:.*]] = wse.broadcast_to %[[C]] : tensor<f32> -> tensor<5x13xf32> loc("big")
// CHECK-NEXT:    func.return %[[B]]

func.func @weight_views() -> (tensor<4x2x3xf32>, tensor<4x3x2xf32>, tensor<2x3x4xf32>) {
  %w = wse.weight "w" : tensor<6x4xf32> loc("w")
  %r = wse.reshape %w : tensor<6x4xf32> -> tensor<2x3x4xf32> loc("r")
  %t = wse.transpose %r {perm = array<i64: 2, 0, 1>} : tensor<2x3x4xf32> -> tensor<4x2x3xf32> loc("t")
  %tt = wse.transpose %t {perm = array<i64: 0, 2, 1>} : tensor<4x2x3xf32> -> tensor<4x3x2xf32> loc("tt")
  func.return %t, %tt, %r : tensor<4x2x3xf32>, tensor<4x3x2xf32>, tensor<2x3x4xf32>
}

// A transpose of a transposed weight composes the permutations: [2, 0, 1] then [0, 2, 1].
// CHECK-LABEL: func.func @weight_views
// CHECK-NEXT:    %[[R:.*]] = wse.weight "w" : tensor<2x3x4xf32> loc("w")
// CHECK-NEXT:    %[[T:.*]] = wse.weight "w" {perm = array<i64: 2, 0, 1>} : tensor<4x2x3xf32> loc("w")
// CHECK-NEXT:    %[[TT:.*]] = wse.weight "w" {perm = array<i64: 2, 1, 0>} : tensor<4x3x2xf32> loc("w")
// CHECK-NEXT:    func.return %[[T]], %[[TT]], %[[R]]

func.func @frozen_view() -> tensor<3x2xf32> {
  %c = wse.weight "table" {frozen} : tensor<2x3xf32> loc("table")
  %t = wse.transpose %c {perm = array<i64: 1, 0>} : tensor<2x3xf32> -> tensor<3x2xf32> loc("tt")
  func.return %t : tensor<3x2xf32>
}

// CHECK-LABEL: func.func @frozen_view
// CHECK-NEXT:    %[[T:.*]] = wse.weight "table" {frozen, perm = array<i64: 1, 0>} : tensor<3x2xf32> loc("table")
// CHECK-NEXT:    func.return %[[T]]

func.func @permuted_reshape() -> tensor<6xf32> {
  %w = wse.weight "w" : tensor<2x3xf32>
  %t = wse.transpose %w {perm = array<i64: 1, 0>} : tensor<2x3xf32> -> tensor<3x2xf32>
  %r = wse.reshape %t : tensor<3x2xf32> -> tensor<6xf32> loc("flat")
  func.return %r : tensor<6xf32>
}

// A reshape of a permuted view is not a view: it stays.
// CHECK-LABEL: func.func @permuted_reshape
// CHECK-NEXT:    %[[T:.*]] = wse.weight "w" {perm = array<i64: 1, 0>} : tensor<3x2xf32>
// CHECK-NEXT:    %[[R:.*]] = wse.reshape %[[T]] : tensor<3x2xf32> -> tensor<6xf32> loc("flat")
// CHECK-NEXT:    func.return %[[R]]

func.func @identities(%x: tensor<2x3xf32>, %sq: tensor<3x3xf32>) -> (tensor<2x3xf32>, tensor<3x3xf32>) {
  %a = wse.reshape %x : tensor<2x3xf32> -> tensor<2x3xf32>
  %b = wse.broadcast_to %a : tensor<2x3xf32> -> tensor<2x3xf32>
  %c = wse.cast %b : tensor<2x3xf32> -> tensor<2x3xf32>
  %d = wse.transpose %c {perm = array<i64: 0, 1>} : tensor<2x3xf32> -> tensor<2x3xf32>
  %e = wse.transpose %sq {perm = array<i64: 1, 0>} : tensor<3x3xf32> -> tensor<3x3xf32> loc("swap")
  func.return %d, %e : tensor<2x3xf32>, tensor<3x3xf32>
}

// A transpose to the same type is no identity unless its permutation is.
// CHECK-LABEL: func.func @identities
// CHECK-NEXT:    %[[E:.*]] = wse.transpose %sq {perm = array<i64: 1, 0>} : tensor<3x3xf32> -> tensor<3x3xf32> loc("swap")
// CHECK-NEXT:    func.return %x, %[[E]] : tensor<2x3xf32>, tensor<3x3xf32>

func.func @reshapes(%x: tensor<2x1x1x3xf32>) -> (tensor<2x3xf32>, tensor<2x3x1x1xf32>) {
  %a = wse.reshape %x : tensor<2x1x1x3xf32> -> tensor<2x3x1x1xf32> loc("to_nchw")
  %b = wse.reshape %a : tensor<2x3x1x1xf32> -> tensor<2x3xf32> loc("flatten")
  %c = wse.reshape %b : tensor<2x3xf32> -> tensor<6xf32> loc("vector")
  %d = wse.reshape %c : tensor<6xf32> -> tensor<2x3xf32> loc("back")
  func.return %d, %a : tensor<2x3xf32>, tensor<2x3x1x1xf32>
}

// A chain of reshapes is one reshape; a reshape others read stays for them.
// CHECK-LABEL: func.func @reshapes
// CHECK-NEXT:    %[[A:.*]] = wse.reshape %x : tensor<2x1x1x3xf32> -> tensor<2x3x1x1xf32> loc("to_nchw")
// CHECK-NEXT:    %[[B:.*]] = wse.reshape %x : tensor<2x1x1x3xf32> -> tensor<2x3xf32> loc("back")
// CHECK-NEXT:    func.return %[[B]], %[[A]] : tensor<2x3xf32>, tensor<2x3x1x1xf32>

func.func @dead(%x: tensor<2xf32>) -> tensor<2xf32> {
  %e = wse.exp %x : tensor<2xf32>
  %w = wse.weight "unused" : tensor<2xf32>
  ws.stream_gradient "g", %x : tensor<2xf32> loc("grad")
  %n = wse.neg %x : tensor<2xf32> loc("neg")
  func.return %n : tensor<2xf32>
}

// Dead pure ops go; streams have effects and stay.
// CHECK-LABEL: func.func @dead
// CHECK-NEXT:    ws.stream_gradient "g", %x : tensor<2xf32> loc("grad")
// CHECK-NEXT:    %[[N:.*]] = wse.neg %x : tensor<2xf32> loc("neg")
// CHECK-NEXT:    func.return %[[N]] : tensor<2xf32>

func.func @strength(%x: tensor<4x3xf32>, %n: tensor<4x3xi32>, %d: tensor<4x1xf32>) -> (tensor<4x3xf32>, tensor<4x3xf32>, tensor<4x3xf32>, tensor<5x4x3xf32>, tensor<4x3xi32>, tensor<4x3xf32>) {
  %two = wse.constant dense<2.0> : tensor<f32>
  %one = wse.constant dense<1.0> : tensor<f32>
  %three = wse.constant dense<3.0> : tensor<f32>
  %ones = wse.constant dense<1.0> : tensor<5x4x3xf32>
  %sq = wse.pow %x, %two : (tensor<4x3xf32>, tensor<f32>) -> tensor<4x3xf32> loc("square")
  %inv = wse.div %one, %x : (tensor<f32>, tensor<4x3xf32>) -> tensor<4x3xf32> loc("inverse")
  %cube = wse.pow %x, %three : (tensor<4x3xf32>, tensor<f32>) -> tensor<4x3xf32> loc("cube")
  %wide = wse.div %ones, %x : (tensor<5x4x3xf32>, tensor<4x3xf32>) -> tensor<5x4x3xf32> loc("wide")
  %itwo = wse.constant dense<2> : tensor<i32>
  %isq = wse.pow %n, %itwo : (tensor<4x3xi32>, tensor<i32>) -> tensor<4x3xi32> loc("int")
  %normed = wse.div %x, %d : (tensor<4x3xf32>, tensor<4x1xf32>) -> tensor<4x3xf32> loc("norm")
  func.return %sq, %inv, %cube, %wide, %isq, %normed : tensor<4x3xf32>, tensor<4x3xf32>, tensor<4x3xf32>, tensor<5x4x3xf32>, tensor<4x3xi32>, tensor<4x3xf32>
}

// x ** 2 is x * x, x ** 3 is x * x * x and 1 / x a reciprocal; a division of ones that
// broadcasts x, another division (its kernel multiplies by the divisor's reciprocals where
// the divisor is the smaller: plans.elementwise) and integers stay as they are.
// CHECK-LABEL: func.func @strength
// CHECK:         %[[SQ:.*]] = wse.mul %x, %x : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32> loc("square")
// CHECK-NEXT:    %[[INV:.*]] = wse.reciprocal %x : tensor<4x3xf32> loc("inverse")
// CHECK-NEXT:    %[[X2:.*]] = wse.mul %x, %x : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32> loc("cube")
// CHECK-NEXT:    %[[CUBE:.*]] = wse.mul %[[X2]], %x : (tensor<4x3xf32>, tensor<4x3xf32>) -> tensor<4x3xf32> loc("cube")
// CHECK-NEXT:    %[[WIDE:.*]] = wse.div %{{.*}}, %x : (tensor<5x4x3xf32>, tensor<4x3xf32>) -> tensor<5x4x3xf32> loc("wide")
// CHECK:         %[[INT:.*]] = wse.pow %n, %{{.*}} : (tensor<4x3xi32>, tensor<i32>) -> tensor<4x3xi32> loc("int")
// CHECK-NEXT:    %[[NORMED:.*]] = wse.div %x, %d : (tensor<4x3xf32>, tensor<4x1xf32>) -> tensor<4x3xf32> loc("norm")
// CHECK-NEXT:    func.return %[[SQ]], %[[INV]], %[[CUBE]], %[[WIDE]], %[[INT]], %[[NORMED]]

// A transpose of a transpose is one transpose; two that undo each other are none (the views of
// heads the PyTorch frontend takes around fused attention).
func.func @transposes(%x: tensor<2x3x4x5xf32>) -> (tensor<2x3x4x5xf32>, tensor<4x5x3x2xf32>) {
  %a = wse.transpose %x {perm = array<i64: 0, 2, 1, 3>} : tensor<2x3x4x5xf32> -> tensor<2x4x3x5xf32>
  %b = wse.transpose %a {perm = array<i64: 0, 2, 1, 3>} : tensor<2x4x3x5xf32> -> tensor<2x3x4x5xf32>
  %c = wse.transpose %x {perm = array<i64: 3, 2, 1, 0>} : tensor<2x3x4x5xf32> -> tensor<5x4x3x2xf32>
  %d = wse.transpose %c {perm = array<i64: 1, 0, 2, 3>} : tensor<5x4x3x2xf32> -> tensor<4x5x3x2xf32>
  func.return %b, %d : tensor<2x3x4x5xf32>, tensor<4x5x3x2xf32>
}

// CHECK-LABEL: func.func @transposes
// CHECK-NEXT:    %[[D:.*]] = wse.transpose %x {perm = array<i64: 2, 3, 1, 0>} : tensor<2x3x4x5xf32> -> tensor<4x5x3x2xf32>
// CHECK-NEXT:    func.return %x, %[[D]] : tensor<2x3x4x5xf32>, tensor<4x5x3x2xf32>

// A fused projection's product, split into [B, S, 3H] and its parts merged back to [B*S, H]:
// the slices move above the split, and the split and merge cancel. A slice that takes part of
// another axis, or a reshape that changes the last axis, stays as it is.
func.func @slices(%x: tensor<8x6xf32>) -> (tensor<8x2xf32>, tensor<8x2xf32>, tensor<2x2x2xf32>, tensor<4x2x3xf32>, tensor<2x8xf32>) {
  %split = wse.reshape %x : tensor<8x6xf32> -> tensor<2x4x6xf32> loc("split")
  %q = wse.slice %split {starts = array<i64: 0, 0, 0>, limits = array<i64: 2, 4, 2>, strides = array<i64: 1, 1, 1>} : tensor<2x4x6xf32> -> tensor<2x4x2xf32> loc("q")
  %k = wse.slice %split {starts = array<i64: 0, 0, 2>, limits = array<i64: 2, 4, 6>, strides = array<i64: 1, 1, 2>} : tensor<2x4x6xf32> -> tensor<2x4x2xf32> loc("k")
  %qm = wse.reshape %q : tensor<2x4x2xf32> -> tensor<8x2xf32> loc("q_merged")
  %km = wse.reshape %k : tensor<2x4x2xf32> -> tensor<8x2xf32> loc("k_merged")
  %rows = wse.slice %split {starts = array<i64: 0, 1, 0>, limits = array<i64: 2, 3, 2>, strides = array<i64: 1, 1, 1>} : tensor<2x4x6xf32> -> tensor<2x2x2xf32> loc("rows")
  %narrow = wse.reshape %x : tensor<8x6xf32> -> tensor<4x2x6xf32> loc("narrow")
  %part = wse.slice %narrow {starts = array<i64: 0, 0, 3>, limits = array<i64: 4, 2, 6>, strides = array<i64: 1, 1, 1>} : tensor<4x2x6xf32> -> tensor<4x2x3xf32> loc("part")
  %wide = wse.reshape %x : tensor<8x6xf32> -> tensor<4x12xf32> loc("wide")
  %cut = wse.slice %wide {starts = array<i64: 0, 0>, limits = array<i64: 2, 8>, strides = array<i64: 1, 1>} : tensor<4x12xf32> -> tensor<2x8xf32> loc("cut")
  func.return %qm, %km, %rows, %part, %cut : tensor<8x2xf32>, tensor<8x2xf32>, tensor<2x2x2xf32>, tensor<4x2x3xf32>, tensor<2x8xf32>
}

// CHECK-LABEL: func.func @slices
// CHECK-NEXT:    %[[SPLIT:.*]] = wse.reshape %x : tensor<8x6xf32> -> tensor<2x4x6xf32> loc("split")
// CHECK-NEXT:    %[[Q:.*]] = wse.slice %x {starts = array<i64: 0, 0>, limits = array<i64: 8, 2>, strides = array<i64: 1, 1>} : tensor<8x6xf32> -> tensor<8x2xf32> loc("q")
// CHECK-NEXT:    %[[K:.*]] = wse.slice %x {starts = array<i64: 0, 2>, limits = array<i64: 8, 6>, strides = array<i64: 1, 2>} : tensor<8x6xf32> -> tensor<8x2xf32> loc("k")
// CHECK-NEXT:    %[[ROWS:.*]] = wse.slice %[[SPLIT]] {starts = array<i64: 0, 1, 0>, limits = array<i64: 2, 3, 2>, strides = array<i64: 1, 1, 1>} : tensor<2x4x6xf32> -> tensor<2x2x2xf32> loc("rows")
// CHECK-NEXT:    %[[PART:.*]] = wse.slice %x {starts = array<i64: 0, 3>, limits = array<i64: 8, 6>, strides = array<i64: 1, 1>} : tensor<8x6xf32> -> tensor<8x3xf32> loc("part")
// CHECK-NEXT:    %[[NARROW:.*]] = wse.reshape %[[PART]] : tensor<8x3xf32> -> tensor<4x2x3xf32> loc("narrow")
// CHECK-NEXT:    %[[WIDE:.*]] = wse.reshape %x : tensor<8x6xf32> -> tensor<4x12xf32> loc("wide")
// CHECK-NEXT:    %[[CUT:.*]] = wse.slice %[[WIDE]] {{.*}} loc("cut")
// CHECK-NEXT:    func.return %[[Q]], %[[K]], %[[ROWS]], %[[NARROW]], %[[CUT]]
