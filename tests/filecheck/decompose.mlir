// RUN: cgc opt %s -p decompose | filecheck %s
// RUN: cgc opt %s -p decompose | filecheck %s --check-prefix=NONE

// The composite ops become primitives; every new op keeps the composite's location.
// NONE-NOT: wse.softmax
// NONE-NOT: wse.log_softmax
// NONE-NOT: wse.layer_norm
// NONE-NOT: wse.batch_norm
// NONE-NOT: wse.softmax_cross_entropy
// NONE-NOT: wse.conv

func.func @softmax(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %y = wse.softmax %x {axis = 1 : i64} : tensor<2x3xf32> loc("sm")
  func.return %y : tensor<2x3xf32>
}

// CHECK-LABEL: func.func @softmax
// The max only shifts the exponent into range; no gradient flows through it.
// CHECK-NEXT:    %[[PEAK:.*]] = wse.reduce_max %x {axes = array<i64: 1>, keepdims = true} : tensor<2x3xf32> -> tensor<2x1xf32> loc("sm")
// CHECK-NEXT:    %[[MAX:.*]] = wse.stop_gradient %[[PEAK]] : tensor<2x1xf32> loc("sm")
// CHECK-NEXT:    %[[SUB:.*]] = wse.sub %x, %[[MAX]] : (tensor<2x3xf32>, tensor<2x1xf32>) -> tensor<2x3xf32> loc("sm")
// CHECK-NEXT:    %[[EXP:.*]] = wse.exp %[[SUB]] : tensor<2x3xf32> loc("sm")
// CHECK-NEXT:    %[[SUM:.*]] = wse.reduce_sum %[[EXP]] {axes = array<i64: 1>, keepdims = true} : tensor<2x3xf32> -> tensor<2x1xf32> loc("sm")
// CHECK-NEXT:    %[[Y:.*]] = wse.div %[[EXP]], %[[SUM]] : (tensor<2x3xf32>, tensor<2x1xf32>) -> tensor<2x3xf32> loc("sm")
// CHECK-NEXT:    func.return %[[Y]] : tensor<2x3xf32>

func.func @log_softmax(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %y = wse.log_softmax %x {axis = 0 : i64} : tensor<2x3xf32> loc("lsm")
  func.return %y : tensor<2x3xf32>
}

// CHECK-LABEL: func.func @log_softmax
// CHECK-NEXT:    %[[PEAK:.*]] = wse.reduce_max %x {axes = array<i64: 0>, keepdims = true} : tensor<2x3xf32> -> tensor<1x3xf32> loc("lsm")
// CHECK-NEXT:    %[[MAX:.*]] = wse.stop_gradient %[[PEAK]] : tensor<1x3xf32> loc("lsm")
// CHECK-NEXT:    %[[S:.*]] = wse.sub %x, %[[MAX]] : {{.*}} loc("lsm")
// CHECK-NEXT:    %[[EXP:.*]] = wse.exp %[[S]] : tensor<2x3xf32> loc("lsm")
// CHECK-NEXT:    %[[SUM:.*]] = wse.reduce_sum %[[EXP]] {axes = array<i64: 0>, keepdims = true} : {{.*}} loc("lsm")
// CHECK-NEXT:    %[[LOG:.*]] = wse.log %[[SUM]] : tensor<1x3xf32> loc("lsm")
// CHECK-NEXT:    %[[Y:.*]] = wse.sub %[[S]], %[[LOG]] : (tensor<2x3xf32>, tensor<1x3xf32>) -> tensor<2x3xf32> loc("lsm")
// CHECK-NEXT:    func.return %[[Y]]

func.func @layer_norm(%x: tensor<2x3x4xf32>, %s: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<2x3x4xf32> {
  %y = wse.layer_norm %x, %s, %b {axis = 2 : i64, epsilon = 1.0e-05 : f64} : (tensor<2x3x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32> loc("ln")
  func.return %y : tensor<2x3x4xf32>
}

// CHECK-LABEL: func.func @layer_norm
// CHECK-NEXT:    %[[MEAN:.*]] = wse.reduce_mean %x {axes = array<i64: 2>, keepdims = true} : tensor<2x3x4xf32> -> tensor<2x3x1xf32> loc("ln")
// CHECK-NEXT:    %[[C:.*]] = wse.sub %x, %[[MEAN]] : {{.*}} loc("ln")
// CHECK-NEXT:    %[[SQ:.*]] = wse.mul %[[C]], %[[C]] : {{.*}} loc("ln")
// CHECK-NEXT:    %[[VAR:.*]] = wse.reduce_mean %[[SQ]] {axes = array<i64: 2>, keepdims = true} : {{.*}} loc("ln")
// CHECK-NEXT:    %[[EPS:.*]] = wse.constant dense<1.000000e-05> : tensor<f32> loc("ln")
// CHECK-NEXT:    %[[VE:.*]] = wse.add %[[VAR]], %[[EPS]] : {{.*}} loc("ln")
// CHECK-NEXT:    %[[STD:.*]] = wse.sqrt %[[VE]] : tensor<2x3x1xf32> loc("ln")
// CHECK-NEXT:    %[[N:.*]] = wse.div %[[C]], %[[STD]] : {{.*}} loc("ln")
// CHECK-NEXT:    %[[SC:.*]] = wse.mul %[[N]], %s : (tensor<2x3x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32> loc("ln")
// CHECK-NEXT:    %[[Y:.*]] = wse.add %[[SC]], %b : (tensor<2x3x4xf32>, tensor<4xf32>) -> tensor<2x3x4xf32> loc("ln")
// CHECK-NEXT:    func.return %[[Y]]

func.func @layer_norm_no_bias(%x: tensor<2x3x4xf32>, %s: tensor<3x4xf32>) -> tensor<2x3x4xf32> {
  %y = wse.layer_norm %x, %s {axis = 1 : i64, epsilon = 1.0e-03 : f64} : (tensor<2x3x4xf32>, tensor<3x4xf32>) -> tensor<2x3x4xf32> loc("ln2")
  func.return %y : tensor<2x3x4xf32>
}

// CHECK-LABEL: func.func @layer_norm_no_bias
// CHECK-NEXT:    wse.reduce_mean %x {axes = array<i64: 1, 2>, keepdims = true} : tensor<2x3x4xf32> -> tensor<2x1x1xf32> loc("ln2")
// CHECK:         wse.constant dense<1.000000e-03> : tensor<f32> loc("ln2")
// CHECK:         %[[N:.*]] = wse.div
// CHECK-NEXT:    %[[Y:.*]] = wse.mul %[[N]], %s : (tensor<2x3x4xf32>, tensor<3x4xf32>) -> tensor<2x3x4xf32> loc("ln2")
// CHECK-NEXT:    func.return %[[Y]]

func.func @batch_norm(%x: tensor<2x3x4x4xf32>, %s: tensor<3xf32>, %b: tensor<3xf32>, %m: tensor<3xf32>, %v: tensor<3xf32>) -> tensor<2x3x4x4xf32> {
  %y = wse.batch_norm %x, %s, %b, %m, %v {epsilon = 1.0e-05 : f64} : (tensor<2x3x4x4xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xf32>) -> tensor<2x3x4x4xf32> loc("bn")
  func.return %y : tensor<2x3x4x4xf32>
}

// CHECK-LABEL: func.func @batch_norm
// The per-channel gain is worked out on the [C] vectors, then shaped to broadcast.
// CHECK-NEXT:    %[[EPS:.*]] = wse.constant dense<1.000000e-05> : tensor<f32> loc("bn")
// CHECK-NEXT:    %[[VE:.*]] = wse.add %v, %[[EPS]] : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32> loc("bn")
// CHECK-NEXT:    %[[STD:.*]] = wse.sqrt %[[VE]] : tensor<3xf32> loc("bn")
// CHECK-NEXT:    %[[GAIN:.*]] = wse.div %s, %[[STD]] : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32> loc("bn")
// CHECK-NEXT:    %[[M:.*]] = wse.reshape %m : tensor<3xf32> -> tensor<3x1x1xf32> loc("bn")
// CHECK-NEXT:    %[[C:.*]] = wse.sub %x, %[[M]] : (tensor<2x3x4x4xf32>, tensor<3x1x1xf32>) -> tensor<2x3x4x4xf32> loc("bn")
// CHECK-NEXT:    %[[GR:.*]] = wse.reshape %[[GAIN]] : tensor<3xf32> -> tensor<3x1x1xf32> loc("bn")
// CHECK-NEXT:    %[[G:.*]] = wse.mul %[[C]], %[[GR]] : {{.*}} loc("bn")
// CHECK-NEXT:    %[[B:.*]] = wse.reshape %b : tensor<3xf32> -> tensor<3x1x1xf32> loc("bn")
// CHECK-NEXT:    %[[Y:.*]] = wse.add %[[G]], %[[B]] : (tensor<2x3x4x4xf32>, tensor<3x1x1xf32>) -> tensor<2x3x4x4xf32> loc("bn")
// CHECK-NEXT:    func.return %[[Y]]

func.func @cross_entropy(%s: tensor<4x5xf32>, %l: tensor<4xi64>, %w: tensor<5xf32>) -> tensor<f32> {
  %y = wse.softmax_cross_entropy %s, %l, %w {reduction = "mean", ignore_index = -100 : i64} : (tensor<4x5xf32>, tensor<4xi64>, tensor<5xf32>) -> tensor<f32> loc("loss")
  func.return %y : tensor<f32>
}

// A weighted mean with ignore_index: log-softmax, one-hot pick, per-sample weight, then
// sum(loss * weight) / sum(weight).
// CHECK-LABEL: func.func @cross_entropy
// CHECK-NEXT:    %[[PEAK:.*]] = wse.reduce_max %s {axes = array<i64: 1>, keepdims = true} : tensor<4x5xf32> -> tensor<4x1xf32> loc("loss")
// CHECK-NEXT:    %[[MAX:.*]] = wse.stop_gradient %[[PEAK]] : tensor<4x1xf32> loc("loss")
// CHECK-NEXT:    %[[SH:.*]] = wse.sub %s, %[[MAX]]
// CHECK-NEXT:    %[[E:.*]] = wse.exp %[[SH]]
// CHECK-NEXT:    %[[SUM:.*]] = wse.reduce_sum %[[E]] {axes = array<i64: 1>, keepdims = true}
// CHECK-NEXT:    %[[LOG:.*]] = wse.log %[[SUM]]
// CHECK-NEXT:    %[[LOGP:.*]] = wse.sub %[[SH]], %[[LOG]]
// CHECK-NEXT:    %[[HOT:.*]] = wse.one_hot %l {labels, ignore_index = -100 : i64} : tensor<4xi64> -> tensor<4x5xf32> loc("loss")
// CHECK-NEXT:    %[[PICK:.*]] = wse.mul %[[LOGP]], %[[HOT]]
// CHECK-NEXT:    %[[PSUM:.*]] = wse.reduce_sum %[[PICK]] {axes = array<i64: 1>} : tensor<4x5xf32> -> tensor<4xf32>
// CHECK-NEXT:    %[[NLL:.*]] = wse.neg %[[PSUM]] : tensor<4xf32>
// CHECK-NEXT:    %[[HW:.*]] = wse.mul %[[HOT]], %w : (tensor<4x5xf32>, tensor<5xf32>) -> tensor<4x5xf32>
// CHECK-NEXT:    %[[SW:.*]] = wse.reduce_sum %[[HW]] {axes = array<i64: 1>} : tensor<4x5xf32> -> tensor<4xf32>
// CHECK-NEXT:    %[[II:.*]] = wse.constant dense<-100> : tensor<i64> loc("loss")
// CHECK-NEXT:    %[[IGN:.*]] = wse.equal %l, %[[II]] : (tensor<4xi64>, tensor<i64>) -> tensor<4xi1>
// CHECK-NEXT:    %[[ZERO:.*]] = wse.constant dense<0.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[ONE:.*]] = wse.constant dense<1.000000e+00> : tensor<f32>
// CHECK-NEXT:    %[[KEEP:.*]] = wse.select %[[IGN]], %[[ZERO]], %[[ONE]] : (tensor<4xi1>, tensor<f32>, tensor<f32>) -> tensor<4xf32>
// CHECK-NEXT:    %[[W:.*]] = wse.mul %[[SW]], %[[KEEP]]
// CHECK-NEXT:    %[[L:.*]] = wse.mul %[[NLL]], %[[W]]
// CHECK-NEXT:    %[[TOT:.*]] = wse.reduce_sum %[[L]] {axes = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
// CHECK-NEXT:    %[[WTOT:.*]] = wse.reduce_sum %[[W]] {axes = array<i64: 0>} : tensor<4xf32> -> tensor<f32>
// CHECK-NEXT:    %[[Y:.*]] = wse.div %[[TOT]], %[[WTOT]] : (tensor<f32>, tensor<f32>) -> tensor<f32> loc("loss")
// CHECK-NEXT:    func.return %[[Y]] : tensor<f32>

func.func @cross_entropy_none(%s: tensor<2x5x3xf32>, %l: tensor<2x3xi64>) -> tensor<2x3xf32> {
  %y = wse.softmax_cross_entropy %s, %l {reduction = "none"} : (tensor<2x5x3xf32>, tensor<2x3xi64>) -> tensor<2x3xf32> loc("loss3")
  func.return %y : tensor<2x3xf32>
}

// Rank-3 scores: the one-hot rows move to the class axis.
// CHECK-LABEL: func.func @cross_entropy_none
// CHECK:         wse.log
// CHECK-NEXT:    %[[LOGP:.*]] = wse.sub
// CHECK-NEXT:    %[[HOT:.*]] = wse.one_hot %l {labels} : tensor<2x3xi64> -> tensor<2x3x5xf32> loc("loss3")
// CHECK-NEXT:    %[[HT:.*]] = wse.transpose %[[HOT]] {perm = array<i64: 0, 2, 1>} : tensor<2x3x5xf32> -> tensor<2x5x3xf32> loc("loss3")
// CHECK-NEXT:    %[[PICK:.*]] = wse.mul %[[LOGP]], %[[HT]]
// CHECK-NEXT:    %[[PSUM:.*]] = wse.reduce_sum %[[PICK]] {axes = array<i64: 1>} : tensor<2x5x3xf32> -> tensor<2x3xf32>
// CHECK-NEXT:    %[[Y:.*]] = wse.neg %[[PSUM]] : tensor<2x3xf32> loc("loss3")
// CHECK-NEXT:    func.return %[[Y]]

func.func @conv(%x: tensor<1x4x5x5xf32>, %k: tensor<6x2x3x3xf32>) -> tensor<1x6x3x5xf32> {
  %y = wse.conv %x, %k {strides = array<i64: 2, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 2 : i64} : (tensor<1x4x5x5xf32>, tensor<6x2x3x3xf32>) -> tensor<1x6x3x5xf32> loc("conv1")
  func.return %y : tensor<1x6x3x5xf32>
}

// A grouped convolution: im2col, the filter as [group, C/group * kh * kw, K/group], one
// batched matmul, its groups side by side channels-last (N, H, W, K), then one transpose to
// (N, K, H, W).
// CHECK-LABEL: func.func @conv
// CHECK-NEXT:    %[[COLS:.*]] = wse.im2col %x {kernel = array<i64: 3, 3>, strides = array<i64: 2, 1>, pads = array<i64: 1, 1, 1, 1>, dilations = array<i64: 1, 1>, group = 2 : i64} : tensor<1x4x5x5xf32> -> tensor<2x15x18xf32> loc("conv1")
// CHECK-NEXT:    %[[F:.*]] = wse.reshape %k : tensor<6x2x3x3xf32> -> tensor<2x3x18xf32> loc("conv1")
// CHECK-NEXT:    %[[FT:.*]] = wse.transpose %[[F]] {perm = array<i64: 0, 2, 1>} : tensor<2x3x18xf32> -> tensor<2x18x3xf32> loc("conv1")
// CHECK-NEXT:    %[[MM:.*]] = wse.matmul %[[COLS]], %[[FT]] : (tensor<2x15x18xf32>, tensor<2x18x3xf32>) -> tensor<2x15x3xf32> loc("conv1")
// CHECK-NEXT:    %[[R:.*]] = wse.reshape %[[MM]] : tensor<2x15x3xf32> -> tensor<2x1x3x5x3xf32> loc("conv1")
// CHECK-NEXT:    %[[G:.*]] = wse.transpose %[[R]] {perm = array<i64: 1, 2, 3, 0, 4>} : tensor<2x1x3x5x3xf32> -> tensor<1x3x5x2x3xf32> loc("conv1")
// CHECK-NEXT:    %[[L:.*]] = wse.reshape %[[G]] : tensor<1x3x5x2x3xf32> -> tensor<1x3x5x6xf32> loc("conv1")
// CHECK-NEXT:    %[[Y:.*]] = wse.transpose %[[L]] {perm = array<i64: 0, 3, 1, 2>} : tensor<1x3x5x6xf32> -> tensor<1x6x3x5xf32> loc("conv1")
// CHECK-NEXT:    func.return %[[Y]] : tensor<1x6x3x5xf32>
