// RUN: cgc opt %s -p channels-last | filecheck %s

// channels-last carries a convolution's channels-last result (the input of the transpose to
// (N, C, H, W)) forward: the weight is permuted to match, the elementwise ops, the pooling,
// the keepdims reduction and the next convolution's im2col take (N, H, W, C) directly, and a
// consumer that needs (N, C, H, W) (the flatten) gets one transpose of the twin; a
// transpose that only moves unit axes becomes a reshape, and a per-channel operand loses its
// unit leading axes (a bias along the rows of a folded layout).
func.func @block(%y: tensor<1x4x4x8xf32>, %s: tensor<8xf32>) -> (tensor<1x8x9xf32>, tensor<1x128xf32>) {
  %w = wse.weight "bn.scale" : tensor<8x1x1xf32> loc("bn")
  %t = wse.transpose %y {perm = array<i64: 0, 3, 1, 2>} : tensor<1x4x4x8xf32> -> tensor<1x8x4x4xf32> loc("conv1")
  %m = wse.mul %t, %w : (tensor<1x8x4x4xf32>, tensor<8x1x1xf32>) -> tensor<1x8x4x4xf32> loc("bn")
  %r = wse.relu %m : tensor<1x8x4x4xf32> loc("relu")
  %p = wse.max_pool %r {kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : tensor<1x8x4x4xf32> -> tensor<1x8x2x2xf32> loc("pool")
  %c = wse.im2col %p {kernel = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 1 : i64} : tensor<1x8x2x2xf32> -> tensor<1x4x72xf32> loc("conv2")
  %f = wse.reshape %r : tensor<1x8x4x4xf32> -> tensor<1x128xf32> loc("flatten")
  %q = wse.reshape %c : tensor<1x4x72xf32> -> tensor<1x8x36xf32> loc("q")
  %g = wse.reduce_mean %r {axes = array<i64: 2, 3>, keepdims = true} : tensor<1x8x4x4xf32> -> tensor<1x8x1x1xf32> loc("gap")
  %h = wse.reshape %g : tensor<1x8x1x1xf32> -> tensor<1x8x1xf32> loc("squeeze")
  %o = wse.concat %q, %h {axis = 2 : i64} : (tensor<1x8x36xf32>, tensor<1x8x1xf32>) -> tensor<1x8x37xf32> loc("cat")
  %z = wse.slice %o {starts = array<i64: 0, 0, 0>, limits = array<i64: 1, 8, 9>, strides = array<i64: 1, 1, 1>} : tensor<1x8x37xf32> -> tensor<1x8x9xf32> loc("z")
  func.return %z, %f : tensor<1x8x9xf32>, tensor<1x128xf32>
}

// CHECK-LABEL: func.func @block
// CHECK-NEXT:    %w = wse.weight "bn.scale" : tensor<8x1x1xf32> loc("bn")
// CHECK-NEXT:    %[[WL:.*]] = wse.reshape %w : tensor<8x1x1xf32> -> tensor<8xf32> loc("bn")
// CHECK-NEXT:    %[[M:.*]] = wse.mul %y, %[[WL]] : (tensor<1x4x4x8xf32>, tensor<8xf32>) -> tensor<1x4x4x8xf32> loc("bn")
// CHECK-NEXT:    %[[R:.*]] = wse.relu %[[M]] : tensor<1x4x4x8xf32> loc("relu")
// CHECK-NEXT:    %[[P:.*]] = wse.max_pool %[[R]] {{{.*}}, channels_last = true} : tensor<1x4x4x8xf32> -> tensor<1x2x2x8xf32> loc("pool")
// CHECK-NEXT:    %c = wse.im2col %[[P]] {{{.*}}, channels_last = true} : tensor<1x2x2x8xf32> -> tensor<1x4x72xf32> loc("conv2")
// CHECK-NEXT:    %[[B:.*]] = wse.transpose %[[R]] {perm = array<i64: 0, 3, 1, 2>} : tensor<1x4x4x8xf32> -> tensor<1x8x4x4xf32> loc("flatten")
// CHECK-NEXT:    %f = wse.reshape %[[B]] : tensor<1x8x4x4xf32> -> tensor<1x128xf32> loc("flatten")
// CHECK-NEXT:    %q = wse.reshape %c : tensor<1x4x72xf32> -> tensor<1x8x36xf32> loc("q")
// CHECK-NEXT:    %[[G:.*]] = wse.reduce_mean %[[R]] {axes = array<i64: 1, 2>, keepdims = true} : tensor<1x4x4x8xf32> -> tensor<1x1x1x8xf32> loc("gap")
// CHECK-NEXT:    %[[GB:.*]] = wse.reshape %[[G]] : tensor<1x1x1x8xf32> -> tensor<1x8x1x1xf32> loc("squeeze")
// CHECK-NEXT:    %h = wse.reshape %[[GB]] : tensor<1x8x1x1xf32> -> tensor<1x8x1xf32> loc("squeeze")
// CHECK-NOT:     wse.transpose
// CHECK:         func.return %z, %f

func.func @kept(%y: tensor<1x2x2x3xf32>, %a: tensor<1x3x2x2xf32>) -> tensor<1x3x2x2xf32> {
  %t = wse.transpose %y {perm = array<i64: 0, 3, 1, 2>} : tensor<1x2x2x3xf32> -> tensor<1x3x2x2xf32> loc("conv")
  %s = wse.add %t, %a : (tensor<1x3x2x2xf32>, tensor<1x3x2x2xf32>) -> tensor<1x3x2x2xf32> loc("add")
  func.return %s : tensor<1x3x2x2xf32>
}

// An activation in (N, C, H, W) order would need a real transpose to join: nothing changes.
// CHECK-LABEL: func.func @kept
// CHECK-NEXT:    %t = wse.transpose %y {perm = array<i64: 0, 3, 1, 2>}
// CHECK-NEXT:    %s = wse.add %t, %a
// CHECK-NEXT:    func.return %s

func.func @broadcast_up(%y: tensor<1x4x4x8xf32>) -> tensor<2x1x8x4x4xf32> {
  %w = wse.weight "w" : tensor<2x1x8x4x4xf32> loc("w")
  %t = wse.transpose %y {perm = array<i64: 0, 3, 1, 2>} : tensor<1x4x4x8xf32> -> tensor<1x8x4x4xf32> loc("conv")
  %m = wse.mul %t, %w : (tensor<1x8x4x4xf32>, tensor<2x1x8x4x4xf32>) -> tensor<2x1x8x4x4xf32> loc("mul")
  func.return %m : tensor<2x1x8x4x4xf32>
}

// An elementwise op whose result has more axes than the channels-last value broadcasts it
// under a different layout: nothing changes.
// CHECK-LABEL: func.func @broadcast_up
// CHECK:         %t = wse.transpose %y {perm = array<i64: 0, 3, 1, 2>}
// CHECK-NEXT:    %m = wse.mul %t, %w
// CHECK-NEXT:    func.return %m
