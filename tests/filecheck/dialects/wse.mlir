// RUN: cgc opt %s | filecheck %s
// RUN: %cgc-generic %s > %t.generic.mlir
// RUN: filecheck %s --check-prefix=GENERIC --input-file %t.generic.mlir
// RUN: cgc opt %t.generic.mlir | filecheck %s

// Every op of the wse dialect in its custom form, printed back the same way, also after a
// trip through the generic form (custom -> generic -> custom). Locations survive.

func.func @sources() -> (tensor<3x2xf32>, tensor<4x2x3xf32>, tensor<2x3xf32>, tensor<2xi64>, tensor<2xi1>) {
  %w = wse.weight "fc.weight" : tensor<3x2xf32> loc("fc")
  %v = wse.weight "emb" {frozen, perm = array<i64: 2, 0, 1>} : tensor<4x2x3xf32> loc("emb")
  %c = wse.constant dense<[[0.0, 1.5, -2.0], [3.25, 4.0, 5.0]]> : tensor<2x3xf32> loc("c")
  %i = wse.constant dense<[3, -1]> : tensor<2xi64>
  %b = wse.constant dense<[true, false]> : tensor<2xi1>
  func.return %w, %v, %c, %i, %b : tensor<3x2xf32>, tensor<4x2x3xf32>, tensor<2x3xf32>, tensor<2xi64>, tensor<2xi1>
}
func.func @elementwise(%x: tensor<2x3xf32>, %y: tensor<3xf32>, %c: tensor<2x1xi1>) -> tensor<2x3xf32> {
  %v0 = wse.neg %x : tensor<2x3xf32> loc("n0")
  %v1 = wse.exp %v0 : tensor<2x3xf32> loc("n1")
  %v2 = wse.log %v1 : tensor<2x3xf32> loc("n2")
  %v3 = wse.sqrt %v2 : tensor<2x3xf32> loc("n3")
  %v4 = wse.reciprocal %v3 : tensor<2x3xf32> loc("n4")
  %v5 = wse.abs %v4 : tensor<2x3xf32> loc("n5")
  %v6 = wse.relu %v5 : tensor<2x3xf32> loc("n6")
  %v7 = wse.sigmoid %v6 : tensor<2x3xf32> loc("n7")
  %v8 = wse.tanh %v7 : tensor<2x3xf32> loc("n8")
  %v9 = wse.erf %v8 : tensor<2x3xf32> loc("n9")
  %v10 = wse.add %v9, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b0")
  %v11 = wse.sub %v10, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b1")
  %v12 = wse.mul %v11, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b2")
  %v13 = wse.div %v12, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b3")
  %v14 = wse.pow %v13, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b4")
  %v15 = wse.max %v14, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b5")
  %v16 = wse.min %v15, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b6")
  %v17 = wse.greater %v16, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xi1> loc("b7")
  %v18 = wse.equal %v16, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xi1> loc("b8")
  %v19 = wse.select %c, %y, %v16 : (tensor<2x1xi1>, tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32> loc("sel")
  %v20 = wse.cast %v17 : tensor<2x3xi1> -> tensor<2x3xf32> loc("cast")
  func.return %v19 : tensor<2x3xf32>
}
func.func @reductions(%x: tensor<2x3x4xf32>) -> (tensor<1x3x1xf32>, tensor<2x4xf32>, tensor<f32>, tensor<2x3xf32>) {
  %s = wse.reduce_sum %x {axes = array<i64: 0, 2>, keepdims = true} : tensor<2x3x4xf32> -> tensor<1x3x1xf32> loc("sum")
  %m = wse.reduce_mean %x {axes = array<i64: 1>} : tensor<2x3x4xf32> -> tensor<2x4xf32> loc("mean")
  %hi = wse.reduce_max %x {axes = array<i64: 0, 1, 2>} : tensor<2x3x4xf32> -> tensor<f32> loc("max")
  %lo = wse.reduce_min %x {axes = array<i64: 2>, keepdims = false} : tensor<2x3x4xf32> -> tensor<2x3xf32> loc("min")
  func.return %s, %m, %hi, %lo : tensor<1x3x1xf32>, tensor<2x4xf32>, tensor<f32>, tensor<2x3xf32>
}
func.func @compute(%a: tensor<5x2x3xf32>, %b: tensor<3x4xf32>, %x: tensor<1x4x7x7xf32>, %k: tensor<6x2x3x3xf32>) -> (tensor<5x2x4xf32>, tensor<1x6x4x3xf32>, tensor<1x4x3x4xf32>, tensor<1x4x7x3xf32>, tensor<2x49x18xf32>) {
  %mm = wse.matmul %a, %b : (tensor<5x2x3xf32>, tensor<3x4xf32>) -> tensor<5x2x4xf32> loc("mm")
  %cv = wse.conv %x, %k {strides = array<i64: 2, 1>, pads = array<i64: 1, 0, 1, 0>, dilations = array<i64: 1, 2>, group = 2 : i64} : (tensor<1x4x7x7xf32>, tensor<6x2x3x3xf32>) -> tensor<1x6x4x3xf32> loc("conv")
  %mp = wse.max_pool %x {kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 1>, dilations = array<i64: 1, 1>} : tensor<1x4x7x7xf32> -> tensor<1x4x3x4xf32> loc("maxpool")
  %ap = wse.avg_pool %x {kernel = array<i64: 3, 2>, strides = array<i64: 1, 2>, pads = array<i64: 1, 0, 1, 0>, dilations = array<i64: 1, 1>, count_include_pad = true} : tensor<1x4x7x7xf32> -> tensor<1x4x7x3xf32> loc("avgpool")
  %ic = wse.im2col %x {kernel = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 2 : i64} : tensor<1x4x7x7xf32> -> tensor<2x49x18xf32> loc("im2col")
  func.return %mm, %cv, %mp, %ap, %ic : tensor<5x2x4xf32>, tensor<1x6x4x3xf32>, tensor<1x4x3x4xf32>, tensor<1x4x7x3xf32>, tensor<2x49x18xf32>
}
func.func @shapes(%x: tensor<2x3x4xf32>, %y: tensor<3x1xf32>, %i: tensor<4xi64>) -> (tensor<6x4xf32>, tensor<2x3x5xf32>, tensor<4x2x3xf32>, tensor<2x6x4xf32>, tensor<1x2x2xf32>, tensor<3x4x5xf32>, tensor<4x5xf32>) {
  %r = wse.reshape %x : tensor<2x3x4xf32> -> tensor<6x4xf32> loc("reshape")
  %b = wse.broadcast_to %y : tensor<3x1xf32> -> tensor<2x3x5xf32> loc("bcast")
  %t = wse.transpose %x {perm = array<i64: 2, 0, 1>} : tensor<2x3x4xf32> -> tensor<4x2x3xf32> loc("transpose")
  %c = wse.concat %x, %x {axis = 1 : i64} : (tensor<2x3x4xf32>, tensor<2x3x4xf32>) -> tensor<2x6x4xf32> loc("concat")
  %s = wse.slice %x {starts = array<i64: 1, 0, 1>, limits = array<i64: 2, 3, 4>, strides = array<i64: 1, 2, 2>} : tensor<2x3x4xf32> -> tensor<1x2x2xf32> loc("slice")
  %p = wse.pad %x {low = array<i64: 1, 0, 0>, high = array<i64: 0, 1, 1>, value = -1.500000e+00 : f64} : tensor<2x3x4xf32> -> tensor<3x4x5xf32> loc("pad")
  %h = wse.one_hot %i : tensor<4xi64> -> tensor<4x5xf32> loc("onehot")
  func.return %r, %b, %t, %c, %s, %p, %h : tensor<6x4xf32>, tensor<2x3x5xf32>, tensor<4x2x3xf32>, tensor<2x6x4xf32>, tensor<1x2x2xf32>, tensor<3x4x5xf32>, tensor<4x5xf32>
}
func.func @composites(%x: tensor<2x3x4xf32>, %s: tensor<3x4xf32>, %b: tensor<4xf32>, %img: tensor<2x3x4x4xf32>, %p: tensor<3xf32>, %scores: tensor<3x5xf32>, %labels: tensor<3xi64>, %w: tensor<5xf32>) -> (tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4x4xf32>, tensor<f32>, tensor<3xf32>) {
  %sm = wse.softmax %x {axis = 1 : i64} : tensor<2x3x4xf32> loc("softmax")
  %lsm = wse.log_softmax %x {axis = 2 : i64} : tensor<2x3x4xf32> loc("log_softmax")
  %ln = wse.layer_norm %x, %s, %b {axis = 1 : i64, epsilon = 1.000000e-05 : f64} : (tensor<2x3x4xf32>, tensor<3x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32> loc("ln")
  %ln2 = wse.layer_norm %x, %b {axis = 2 : i64, epsilon = 1.000000e-03 : f64} : (tensor<2x3x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32> loc("ln_no_bias")
  %bn = wse.batch_norm %img, %p, %p, %p, %p {epsilon = 1.000000e-05 : f64} : (tensor<2x3x4x4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<2x3x4x4xf32> loc("bn")
  %ce = wse.softmax_cross_entropy %scores, %labels, %w {reduction = "mean", ignore_index = -100 : i64} : (tensor<3x5xf32>, tensor<3xi64>, tensor<5xf32>) -> tensor<f32> loc("loss")
  %ce2 = wse.softmax_cross_entropy %scores, %labels {reduction = "none"} : (tensor<3x5xf32>, tensor<3xi64>) -> tensor<3xf32> loc("loss_none")
  func.return %sm, %lsm, %ln, %ln2, %bn, %ce, %ce2 : tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4x4xf32>, tensor<f32>, tensor<3xf32>
}
func.func @layers(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %y, %z = wse.layer "blk"(%x) {rect = #wse.rect<1, 2, 3x4>} : (tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
  ^bb0(%a: tensor<2x3xf32>):
    %r = wse.relu %a : tensor<2x3xf32> loc("act")
    wse.yield %r, %a : tensor<2x3xf32>, tensor<2x3xf32>
  } loc("blk")
  wse.layer "sink"(%y, %z) : (tensor<2x3xf32>, tensor<2x3xf32>) -> () {
  ^bb0(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>):
    wse.yield
  }
  func.return %y : tensor<2x3xf32>
}

// CHECK: builtin.module {
// CHECK-LABEL: func.func @sources() -> (tensor<3x2xf32>, tensor<4x2x3xf32>, tensor<2x3xf32>, tensor<2xi64>, tensor<2xi1>) {
// CHECK-NEXT:  %w = wse.weight "fc.weight" : tensor<3x2xf32> loc("fc")
// CHECK-NEXT:  %v = wse.weight "emb" {frozen, perm = array<i64: 2, 0, 1>} : tensor<4x2x3xf32> loc("emb")
// CHECK-NEXT:  %c = wse.constant dense<[[0.000000e+00, 1.500000e+00, -2.000000e+00], [3.250000e+00, 4.000000e+00, 5.000000e+00]]> : tensor<2x3xf32> loc("c")
// CHECK-NEXT:  %i = wse.constant dense<[3, -1]> : tensor<2xi64>
// CHECK-NEXT:  %b = wse.constant dense<[true, false]> : tensor<2xi1>
// CHECK-NEXT:  func.return %w, %v, %c, %i, %b : tensor<3x2xf32>, tensor<4x2x3xf32>, tensor<2x3xf32>, tensor<2xi64>, tensor<2xi1>
// CHECK-NEXT:  }

// CHECK-LABEL: func.func @elementwise(%x: tensor<2x3xf32>, %y: tensor<3xf32>, %c: tensor<2x1xi1>) -> tensor<2x3xf32> {
// CHECK-NEXT:  %v0 = wse.neg %x : tensor<2x3xf32> loc("n0")
// CHECK-NEXT:  %v1 = wse.exp %v0 : tensor<2x3xf32> loc("n1")
// CHECK-NEXT:  %v2 = wse.log %v1 : tensor<2x3xf32> loc("n2")
// CHECK-NEXT:  %v3 = wse.sqrt %v2 : tensor<2x3xf32> loc("n3")
// CHECK-NEXT:  %v4 = wse.reciprocal %v3 : tensor<2x3xf32> loc("n4")
// CHECK-NEXT:  %v5 = wse.abs %v4 : tensor<2x3xf32> loc("n5")
// CHECK-NEXT:  %v6 = wse.relu %v5 : tensor<2x3xf32> loc("n6")
// CHECK-NEXT:  %v7 = wse.sigmoid %v6 : tensor<2x3xf32> loc("n7")
// CHECK-NEXT:  %v8 = wse.tanh %v7 : tensor<2x3xf32> loc("n8")
// CHECK-NEXT:  %v9 = wse.erf %v8 : tensor<2x3xf32> loc("n9")
// CHECK-NEXT:  %v10 = wse.add %v9, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b0")
// CHECK-NEXT:  %v11 = wse.sub %v10, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b1")
// CHECK-NEXT:  %v12 = wse.mul %v11, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b2")
// CHECK-NEXT:  %v13 = wse.div %v12, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b3")
// CHECK-NEXT:  %v14 = wse.pow %v13, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b4")
// CHECK-NEXT:  %v15 = wse.max %v14, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b5")
// CHECK-NEXT:  %v16 = wse.min %v15, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b6")
// CHECK-NEXT:  %v17 = wse.greater %v16, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xi1> loc("b7")
// CHECK-NEXT:  %v18 = wse.equal %v16, %y : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xi1> loc("b8")
// CHECK-NEXT:  %v19 = wse.select %c, %y, %v16 : (tensor<2x1xi1>, tensor<3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32> loc("sel")
// CHECK-NEXT:  %v20 = wse.cast %v17 : tensor<2x3xi1> -> tensor<2x3xf32> loc("cast")
// CHECK-NEXT:  func.return %v19 : tensor<2x3xf32>
// CHECK-NEXT:  }

// CHECK-LABEL: func.func @reductions(%x: tensor<2x3x4xf32>) -> (tensor<1x3x1xf32>, tensor<2x4xf32>, tensor<f32>, tensor<2x3xf32>) {
// CHECK-NEXT:  %s = wse.reduce_sum %x {axes = array<i64: 0, 2>, keepdims = true} : tensor<2x3x4xf32> -> tensor<1x3x1xf32> loc("sum")
// CHECK-NEXT:  %m = wse.reduce_mean %x {axes = array<i64: 1>} : tensor<2x3x4xf32> -> tensor<2x4xf32> loc("mean")
// CHECK-NEXT:  %hi = wse.reduce_max %x {axes = array<i64: 0, 1, 2>} : tensor<2x3x4xf32> -> tensor<f32> loc("max")
// CHECK-NEXT:  %lo = wse.reduce_min %x {axes = array<i64: 2>} : tensor<2x3x4xf32> -> tensor<2x3xf32> loc("min")
// CHECK-NEXT:  func.return %s, %m, %hi, %lo : tensor<1x3x1xf32>, tensor<2x4xf32>, tensor<f32>, tensor<2x3xf32>
// CHECK-NEXT:  }

// CHECK-LABEL: func.func @compute(%a: tensor<5x2x3xf32>, %b: tensor<3x4xf32>, %x: tensor<1x4x7x7xf32>, %k: tensor<6x2x3x3xf32>) -> (tensor<5x2x4xf32>, tensor<1x6x4x3xf32>, tensor<1x4x3x4xf32>, tensor<1x4x7x3xf32>, tensor<2x49x18xf32>) {
// CHECK-NEXT:  %mm = wse.matmul %a, %b : (tensor<5x2x3xf32>, tensor<3x4xf32>) -> tensor<5x2x4xf32> loc("mm")
// CHECK-NEXT:  %cv = wse.conv %x, %k {strides = array<i64: 2, 1>, pads = array<i64: 1, 0, 1, 0>, dilations = array<i64: 1, 2>, group = 2 : i64} : (tensor<1x4x7x7xf32>, tensor<6x2x3x3xf32>) -> tensor<1x6x4x3xf32> loc("conv")
// CHECK-NEXT:  %mp = wse.max_pool %x {kernel = array<i64: 2, 2>, strides = array<i64: 2, 2>, pads = array<i64: 0, 0, 0, 1>, dilations = array<i64: 1, 1>} : tensor<1x4x7x7xf32> -> tensor<1x4x3x4xf32> loc("maxpool")
// CHECK-NEXT:  %ap = wse.avg_pool %x {kernel = array<i64: 3, 2>, strides = array<i64: 1, 2>, pads = array<i64: 1, 0, 1, 0>, dilations = array<i64: 1, 1>, count_include_pad = true} : tensor<1x4x7x7xf32> -> tensor<1x4x7x3xf32> loc("avgpool")
// CHECK-NEXT:  %ic = wse.im2col %x {kernel = array<i64: 3, 3>, strides = array<i64: 1, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 2 : i64} : tensor<1x4x7x7xf32> -> tensor<2x49x18xf32> loc("im2col")
// CHECK-NEXT:  func.return %mm, %cv, %mp, %ap, %ic : tensor<5x2x4xf32>, tensor<1x6x4x3xf32>, tensor<1x4x3x4xf32>, tensor<1x4x7x3xf32>, tensor<2x49x18xf32>
// CHECK-NEXT:  }

// CHECK-LABEL: func.func @shapes(%x: tensor<2x3x4xf32>, %y: tensor<3x1xf32>, %i: tensor<4xi64>) -> (tensor<6x4xf32>, tensor<2x3x5xf32>, tensor<4x2x3xf32>, tensor<2x6x4xf32>, tensor<1x2x2xf32>, tensor<3x4x5xf32>, tensor<4x5xf32>) {
// CHECK-NEXT:  %r = wse.reshape %x : tensor<2x3x4xf32> -> tensor<6x4xf32> loc("reshape")
// CHECK-NEXT:  %b = wse.broadcast_to %y : tensor<3x1xf32> -> tensor<2x3x5xf32> loc("bcast")
// CHECK-NEXT:  %t = wse.transpose %x {perm = array<i64: 2, 0, 1>} : tensor<2x3x4xf32> -> tensor<4x2x3xf32> loc("transpose")
// CHECK-NEXT:  %c = wse.concat %x, %x {axis = 1 : i64} : (tensor<2x3x4xf32>, tensor<2x3x4xf32>) -> tensor<2x6x4xf32> loc("concat")
// CHECK-NEXT:  %s = wse.slice %x {starts = array<i64: 1, 0, 1>, limits = array<i64: 2, 3, 4>, strides = array<i64: 1, 2, 2>} : tensor<2x3x4xf32> -> tensor<1x2x2xf32> loc("slice")
// CHECK-NEXT:  %p = wse.pad %x {low = array<i64: 1, 0, 0>, high = array<i64: 0, 1, 1>, value = -1.500000e+00 : f64} : tensor<2x3x4xf32> -> tensor<3x4x5xf32> loc("pad")
// CHECK-NEXT:  %h = wse.one_hot %i : tensor<4xi64> -> tensor<4x5xf32> loc("onehot")
// CHECK-NEXT:  func.return %r, %b, %t, %c, %s, %p, %h : tensor<6x4xf32>, tensor<2x3x5xf32>, tensor<4x2x3xf32>, tensor<2x6x4xf32>, tensor<1x2x2xf32>, tensor<3x4x5xf32>, tensor<4x5xf32>
// CHECK-NEXT:  }

// CHECK-LABEL: func.func @composites(%x: tensor<2x3x4xf32>, %s: tensor<3x4xf32>, %b: tensor<4xf32>, %img: tensor<2x3x4x4xf32>, %p: tensor<3xf32>, %scores: tensor<3x5xf32>, %labels: tensor<3xi64>, %w: tensor<5xf32>) -> (tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4x4xf32>, tensor<f32>, tensor<3xf32>) {
// CHECK-NEXT:  %sm = wse.softmax %x {axis = 1 : i64} : tensor<2x3x4xf32> loc("softmax")
// CHECK-NEXT:  %lsm = wse.log_softmax %x {axis = 2 : i64} : tensor<2x3x4xf32> loc("log_softmax")
// CHECK-NEXT:  %ln = wse.layer_norm %x, %s, %b {axis = 1 : i64, epsilon = 1.000000e-05 : f64} : (tensor<2x3x4xf32>, tensor<3x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32> loc("ln")
// CHECK-NEXT:  %ln2 = wse.layer_norm %x, %b {axis = 2 : i64, epsilon = 1.000000e-03 : f64} : (tensor<2x3x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32> loc("ln_no_bias")
// CHECK-NEXT:  %bn = wse.batch_norm %img, %p, %p, %p, %p {epsilon = 1.000000e-05 : f64} : (tensor<2x3x4x4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<2x3x4x4xf32> loc("bn")
// CHECK-NEXT:  %ce = wse.softmax_cross_entropy %scores, %labels, %w {reduction = "mean", ignore_index = -100 : i64} : (tensor<3x5xf32>, tensor<3xi64>, tensor<5xf32>) -> tensor<f32> loc("loss")
// CHECK-NEXT:  %ce2 = wse.softmax_cross_entropy %scores, %labels {reduction = "none"} : (tensor<3x5xf32>, tensor<3xi64>) -> tensor<3xf32> loc("loss_none")
// CHECK-NEXT:  func.return %sm, %lsm, %ln, %ln2, %bn, %ce, %ce2 : tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4xf32>, tensor<2x3x4x4xf32>, tensor<f32>, tensor<3xf32>
// CHECK-NEXT:  }

// CHECK-LABEL: func.func @layers(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
// CHECK-NEXT:  %y, %z = wse.layer "blk"(%x) {rect = #wse.rect<1, 2, 3x4>} : (tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) {
// CHECK-NEXT:  ^{{.*}}(%a: tensor<2x3xf32>):
// CHECK-NEXT:  %r = wse.relu %a : tensor<2x3xf32> loc("act")
// CHECK-NEXT:  wse.yield %r, %a : tensor<2x3xf32>, tensor<2x3xf32>
// CHECK-NEXT:  } loc("blk")
// CHECK-NEXT:  wse.layer "sink"(%y, %z) : (tensor<2x3xf32>, tensor<2x3xf32>) -> () {
// CHECK-NEXT:  ^{{.*}}(%a: tensor<2x3xf32>, %b: tensor<2x3xf32>):
// CHECK-NEXT:  wse.yield
// CHECK-NEXT:  }
// CHECK-NEXT:  func.return %y : tensor<2x3xf32>
// CHECK-NEXT:  }

// GENERIC:      %w = "wse.weight"() <{name = "fc.weight"}> : () -> tensor<3x2xf32> loc("fc")
// GENERIC-NEXT: %v = "wse.weight"() <{name = "emb", frozen, perm = array<i64: 2, 0, 1>}> : () -> tensor<4x2x3xf32> loc("emb")
// GENERIC-NEXT: %c = "wse.constant"() <{value = dense<{{.*}}> : tensor<2x3xf32>}> : () -> tensor<2x3xf32> loc("c")
// GENERIC:      %v10 = "wse.add"(%v9, %y) : (tensor<2x3xf32>, tensor<3xf32>) -> tensor<2x3xf32> loc("b0")
// GENERIC:      %lo = "wse.reduce_min"(%x) <{axes = array<i64: 2>, keepdims = false}> : (tensor<2x3x4xf32>) -> tensor<2x3xf32> loc("min")
// GENERIC:      %cv = "wse.conv"(%x, %k) <{strides = array<i64: 2, 1>, pads = array<i64: 1, 0, 1, 0>, dilations = array<i64: 1, 2>, group = 2 : i64}> : (tensor<1x4x7x7xf32>, tensor<6x2x3x3xf32>) -> tensor<1x6x4x3xf32> loc("conv")
// GENERIC:      %ce = "wse.softmax_cross_entropy"(%scores, %labels, %w) <{reduction = "mean", ignore_index = -100 : i64}> : (tensor<3x5xf32>, tensor<3xi64>, tensor<5xf32>) -> tensor<f32> loc("loss")
// GENERIC:      %y, %z = "wse.layer"(%x) <{name = "blk", rect = #wse.rect<1, 2, 3x4>}> ({
// GENERIC-NEXT: ^{{.*}}(%a: tensor<2x3xf32>{{.*}}):
// GENERIC-NEXT:   %r = "wse.relu"(%a) : (tensor<2x3xf32>) -> tensor<2x3xf32> loc("act")
// GENERIC-NEXT:   "wse.yield"(%r, %a) : (tensor<2x3xf32>, tensor<2x3xf32>) -> () {{.*}}
// GENERIC-NEXT: }) : (tensor<2x3xf32>) -> (tensor<2x3xf32>, tensor<2x3xf32>) loc("blk")
