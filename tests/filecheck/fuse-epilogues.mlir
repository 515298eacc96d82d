// RUN: cgc opt %s --split-input-file -p fuse-epilogues | filecheck %s

// A convolution's rows, an inference batch norm and a ReLU: the product viewed as the image,
// the norm's gain (a weight over a constant) folded into the filter's columns, its shift
// computed from the channel vectors and added first, the ReLU in the epilogue.
func.func @main(%x: tensor<1x36x72xf32>) -> tensor<1x6x6x8xf32> {
  %y = wse.layer "conv" (%x) : (tensor<1x36x72xf32>) -> tensor<1x6x6x8xf32> {
  ^bb0(%a: tensor<1x36x72xf32>):
    %w = wse.weight "w" : tensor<1x72x8xf32> loc("conv")
    %g = wse.weight "g" : tensor<8xf32> loc("bn")
    %b = wse.weight "b" : tensor<8xf32> loc("bn")
    %std = wse.constant dense<2.0> : tensor<8xf32> loc("bn")
    %mean = wse.constant dense<0.5> : tensor<8xf32> loc("bn")
    %m = wse.matmul %a, %w : (tensor<1x36x72xf32>, tensor<1x72x8xf32>) -> tensor<1x36x8xf32> loc("conv")
    %r = wse.reshape %m : tensor<1x36x8xf32> -> tensor<1x6x6x8xf32> loc("conv")
    %gain = wse.div %g, %std : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32> loc("bn")
    %c = wse.sub %r, %mean : (tensor<1x6x6x8xf32>, tensor<8xf32>) -> tensor<1x6x6x8xf32> loc("bn")
    %s = wse.mul %c, %gain : (tensor<1x6x6x8xf32>, tensor<8xf32>) -> tensor<1x6x6x8xf32> loc("bn")
    %n = wse.add %s, %b : (tensor<1x6x6x8xf32>, tensor<8xf32>) -> tensor<1x6x6x8xf32> loc("bn")
    %o = wse.relu %n : tensor<1x6x6x8xf32> loc("relu")
    wse.yield %o : tensor<1x6x6x8xf32>
  } loc("conv")
  func.return %y : tensor<1x6x6x8xf32>
}

// CHECK-LABEL: wse.layer "conv"
// CHECK:         %[[G:.*]] = wse.weight "g"
// CHECK:         %[[B:.*]] = wse.weight "b"
// CHECK:         %[[MEAN:.*]] = wse.constant dense<5.000000e-01>
// CHECK:         %[[GAIN:.*]] = wse.div %[[G]], %{{.*}} : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32> loc("bn")
// CHECK-NEXT:    %[[NEG:.*]] = wse.neg %[[MEAN]] : tensor<8xf32> loc("bn")
// CHECK-NEXT:    %[[MUL:.*]] = wse.mul %[[NEG]], %[[GAIN]] : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32> loc("bn")
// CHECK-NEXT:    %[[SHIFT:.*]] = wse.add %[[MUL]], %[[B]] : (tensor<8xf32>, tensor<8xf32>) -> tensor<8xf32> loc("bn")
// CHECK-NEXT:    %[[INV:.*]] = wse.constant dense<5.000000e-01> : tensor<8xf32> loc("bn")
// CHECK-NEXT:    %{{.*}} = wse.fused_matmul %a, %w scaled(%[[G]], %[[INV]] : tensor<8xf32>, tensor<8xf32>) with(%[[SHIFT]] : tensor<8xf32>) : (tensor<1x36x72xf32>, tensor<1x72x8xf32>) -> tensor<1x6x6x8xf32> {
// CHECK-NEXT:    ^bb0(%[[ACC:.*]]: tensor<1x6x6x8xf32>, %[[S:.*]]: tensor<8xf32>):
// CHECK-NEXT:      %[[X:.*]] = wse.add %[[ACC]], %[[S]] : (tensor<1x6x6x8xf32>, tensor<8xf32>) -> tensor<1x6x6x8xf32> loc("bn")
// CHECK-NEXT:      %[[R:.*]] = wse.relu %[[X]] : tensor<1x6x6x8xf32> loc("relu")
// CHECK-NEXT:      wse.yield %[[R]] : tensor<1x6x6x8xf32>
// CHECK-NEXT:    } loc("conv")
// CHECK-NOT:     wse.matmul

// -----

// A linear layer's bias and GELU in its erf form: x * 0.5 * (1 + erf(x / sqrt 2)) reads the
// biased product twice; the bias starts the accumulator, the rest is the epilogue.
func.func @main(%x: tensor<4x16xf32>) -> tensor<4x32xf32> {
  %y = wse.layer "fc" (%x) : (tensor<4x16xf32>) -> tensor<4x32xf32> {
  ^bb0(%a: tensor<4x16xf32>):
    %w = wse.weight "fc.weight" : tensor<16x32xf32> loc("fc")
    %b = wse.weight "fc.bias" : tensor<32xf32> loc("fc")
    %half = wse.constant dense<0.5> : tensor<f32> loc("gelu")
    %one = wse.constant dense<1.0> : tensor<f32> loc("gelu")
    %root = wse.constant dense<1.41421354> : tensor<f32> loc("gelu")
    %m = wse.matmul %a, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("fc")
    %h = wse.add %m, %b : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32> loc("fc")
    %d = wse.div %h, %root : (tensor<4x32xf32>, tensor<f32>) -> tensor<4x32xf32> loc("gelu")
    %e = wse.erf %d : tensor<4x32xf32> loc("gelu")
    %p = wse.add %e, %one : (tensor<4x32xf32>, tensor<f32>) -> tensor<4x32xf32> loc("gelu")
    %q = wse.mul %h, %half : (tensor<4x32xf32>, tensor<f32>) -> tensor<4x32xf32> loc("gelu")
    %o = wse.mul %q, %p : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> loc("gelu")
    wse.yield %o : tensor<4x32xf32>
  } loc("fc")
  func.return %y : tensor<4x32xf32>
}

// CHECK-LABEL: wse.layer "fc"
// CHECK:         %{{.*}} = wse.fused_matmul %a, %w with(%b, %root, %one, %half : tensor<32xf32>, tensor<f32>, tensor<f32>, tensor<f32>) : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> {
// CHECK-NEXT:    ^bb0(%[[ACC:.*]]: tensor<4x32xf32>, %[[BIAS:.*]]: tensor<32xf32>, %[[ROOT:.*]]: tensor<f32>, %[[ONE:.*]]: tensor<f32>, %[[HALF:.*]]: tensor<f32>):
// CHECK-NEXT:      %[[H:.*]] = wse.add %[[ACC]], %[[BIAS]] : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32> loc("fc")
// CHECK-NEXT:      %[[D:.*]] = wse.div %[[H]], %[[ROOT]]
// CHECK-NEXT:      %[[E:.*]] = wse.erf %[[D]]
// CHECK-NEXT:      %[[P:.*]] = wse.add %[[E]], %[[ONE]]
// CHECK-NEXT:      %[[Q:.*]] = wse.mul %[[H]], %[[HALF]]
// CHECK-NEXT:      %[[O:.*]] = wse.mul %[[Q]], %[[P]]
// CHECK-NEXT:      wse.yield %[[O]] : tensor<4x32xf32>
// CHECK-NEXT:    } loc("fc")
// CHECK-NEXT:    wse.yield

// -----

// SwiGLU: silu(x @ w_gate) * (x @ w_up). The SiLU is the gate's epilogue, and the product of
// the two the up projection's: the gate's result is an extra of it, of its shape.
func.func @main(%x: tensor<4x16xf32>) -> tensor<4x32xf32> {
  %y = wse.layer "mlp" (%x) : (tensor<4x16xf32>) -> tensor<4x32xf32> {
  ^bb0(%a: tensor<4x16xf32>):
    %wu = wse.weight "up" : tensor<16x32xf32> loc("up")
    %wg = wse.weight "gate" : tensor<16x32xf32> loc("gate")
    %u = wse.matmul %a, %wu : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("up")
    %g = wse.matmul %a, %wg : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("gate")
    %s = wse.sigmoid %g : tensor<4x32xf32> loc("silu")
    %silu = wse.mul %g, %s : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> loc("silu")
    %o = wse.mul %silu, %u : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> loc("swiglu")
    wse.yield %o : tensor<4x32xf32>
  } loc("mlp")
  func.return %y : tensor<4x32xf32>
}

// CHECK-LABEL: wse.layer "mlp"
// CHECK:         %[[SILU:.*]] = wse.fused_matmul %a, %wg : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> {
// CHECK-NEXT:    ^bb0(%[[G:.*]]: tensor<4x32xf32>):
// CHECK-NEXT:      %[[S:.*]] = wse.sigmoid %[[G]] : tensor<4x32xf32> loc("silu")
// CHECK-NEXT:      %[[GS:.*]] = wse.mul %[[G]], %[[S]] : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> loc("silu")
// CHECK-NEXT:      wse.yield %[[GS]] : tensor<4x32xf32>
// CHECK-NEXT:    } loc("gate")
// CHECK-NEXT:    %{{.*}} = wse.fused_matmul %a, %wu with(%[[SILU]] : tensor<4x32xf32>) : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> {
// CHECK-NEXT:    ^bb0(%[[U:.*]]: tensor<4x32xf32>, %[[GATE:.*]]: tensor<4x32xf32>):
// CHECK-NEXT:      %[[O:.*]] = wse.mul %[[GATE]], %[[U]] : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> loc("swiglu")
// CHECK-NEXT:      wse.yield %[[O]] : tensor<4x32xf32>
// CHECK-NEXT:    } loc("up")

// -----

// A residual block's end: the bias, a scale, the residual add and the ReLU. The scale is a
// constant: the filter's columns take it, and it scales the bias added before it.
func.func @main(%x: tensor<4x16xf32>, %res: tensor<4x32xf32>) -> tensor<4x32xf32> {
  %y = wse.layer "proj" (%x, %res) : (tensor<4x16xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> {
  ^bb0(%a: tensor<4x16xf32>, %r: tensor<4x32xf32>):
    %w = wse.weight "proj.weight" : tensor<16x32xf32> loc("proj")
    %b = wse.weight "proj.bias" : tensor<32xf32> loc("proj")
    %k = wse.constant dense<0.25> : tensor<f32> loc("scale")
    %m = wse.matmul %a, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("proj")
    %h = wse.add %m, %b : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32> loc("proj")
    %s = wse.mul %h, %k : (tensor<4x32xf32>, tensor<f32>) -> tensor<4x32xf32> loc("scale")
    %t = wse.add %s, %r : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> loc("residual")
    %o = wse.relu %t : tensor<4x32xf32> loc("relu")
    wse.yield %o : tensor<4x32xf32>
  } loc("proj")
  func.return %y : tensor<4x32xf32>
}

// CHECK-LABEL: wse.layer "proj"
// CHECK:         %[[K:.*]] = wse.constant dense<2.500000e-01> : tensor<f32> loc("scale")
// CHECK-NEXT:    %[[SHIFT:.*]] = wse.mul %b, %[[K]] : (tensor<32xf32>, tensor<f32>) -> tensor<32xf32> loc("scale")
// CHECK-NEXT:    %[[SCALE:.*]] = wse.constant dense<2.500000e-01> : tensor<32xf32> loc("scale")
// CHECK-NEXT:    %{{.*}} = wse.fused_matmul %a, %w scaled(%[[SCALE]] : tensor<32xf32>) with(%[[SHIFT]], %r : tensor<32xf32>, tensor<4x32xf32>) : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> {
// CHECK-NEXT:    ^bb0(%[[ACC:.*]]: tensor<4x32xf32>, %[[S:.*]]: tensor<32xf32>, %[[RES:.*]]: tensor<4x32xf32>):
// CHECK-NEXT:      %[[X:.*]] = wse.add %[[ACC]], %[[S]] : (tensor<4x32xf32>, tensor<32xf32>) -> tensor<4x32xf32> loc("proj")
// CHECK-NEXT:      %[[T:.*]] = wse.add %[[X]], %[[RES]] : (tensor<4x32xf32>, tensor<4x32xf32>) -> tensor<4x32xf32> loc("residual")
// CHECK-NEXT:      %[[R:.*]] = wse.relu %[[T]] : tensor<4x32xf32> loc("relu")
// CHECK-NEXT:      wse.yield %[[R]] : tensor<4x32xf32>

// -----

// A product another layer also reads has no epilogue: the matmul stays as it is.
func.func @main(%x: tensor<4x16xf32>) -> (tensor<4x32xf32>, tensor<4x32xf32>) {
  %y:2 = wse.layer "fc" (%x) : (tensor<4x16xf32>) -> (tensor<4x32xf32>, tensor<4x32xf32>) {
  ^bb0(%a: tensor<4x16xf32>):
    %w = wse.weight "fc.weight" : tensor<16x32xf32> loc("fc")
    %m = wse.matmul %a, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("fc")
    %o = wse.relu %m : tensor<4x32xf32> loc("relu")
    wse.yield %m, %o : tensor<4x32xf32>, tensor<4x32xf32>
  } loc("fc")
  func.return %y#0, %y#1 : tensor<4x32xf32>, tensor<4x32xf32>
}

// CHECK-LABEL: wse.layer "fc"
// CHECK:         %[[M:.*]] = wse.matmul %a, %w : (tensor<4x16xf32>, tensor<16x32xf32>) -> tensor<4x32xf32> loc("fc")
// CHECK-NEXT:    %[[O:.*]] = wse.relu %[[M]] : tensor<4x32xf32> loc("relu")
// CHECK-NEXT:    wse.yield %[[M]], %[[O]]


// -----

// A linear layer over the tokens of two sequences, its product split back into sequences
// between its bias and the residual add: the epilogue works on the sequences' shape, the
// bias given as [1, 1, 32] reshaped to the columns' and the residual given as the tokens'
// [8, 32] reshaped to the sequences'.
func.func @main(%x: tensor<8x16xf32>, %res: tensor<8x32xf32>) -> tensor<2x4x32xf32> {
  %y = wse.layer "proj" (%x, %res) : (tensor<8x16xf32>, tensor<8x32xf32>) -> tensor<2x4x32xf32> {
  ^bb0(%a: tensor<8x16xf32>, %r: tensor<8x32xf32>):
    %w = wse.weight "proj.weight" : tensor<16x32xf32> loc("proj")
    %b = wse.weight "proj.bias" : tensor<1x1x32xf32> loc("proj")
    %m = wse.matmul %a, %w : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<8x32xf32> loc("proj")
    %s = wse.reshape %m : tensor<8x32xf32> -> tensor<2x4x32xf32> loc("split")
    %h = wse.add %s, %b : (tensor<2x4x32xf32>, tensor<1x1x32xf32>) -> tensor<2x4x32xf32> loc("bias")
    %rs = wse.reshape %r : tensor<8x32xf32> -> tensor<2x4x32xf32> loc("residual.split")
    %t = wse.add %rs, %h : (tensor<2x4x32xf32>, tensor<2x4x32xf32>) -> tensor<2x4x32xf32> loc("residual")
    wse.yield %t : tensor<2x4x32xf32>
  } loc("proj")
  func.return %y : tensor<2x4x32xf32>
}

// CHECK-LABEL: wse.layer "proj"
// CHECK:         %[[RS:.*]] = wse.reshape %r : tensor<8x32xf32> -> tensor<2x4x32xf32> loc("residual.split")
// CHECK-NEXT:    %[[BIAS:.*]] = wse.reshape %b : tensor<1x1x32xf32> -> tensor<32xf32> loc("bias")
// CHECK-NEXT:    %{{.*}} = wse.fused_matmul %a, %w with(%[[BIAS]], %[[RS]] : tensor<32xf32>, tensor<2x4x32xf32>) : (tensor<8x16xf32>, tensor<16x32xf32>) -> tensor<2x4x32xf32> {
// CHECK-NEXT:    ^bb0(%[[ACC:.*]]: tensor<2x4x32xf32>, %[[B:.*]]: tensor<32xf32>, %[[R:.*]]: tensor<2x4x32xf32>):
// CHECK-NEXT:      %[[H:.*]] = wse.add %[[ACC]], %[[B]] : (tensor<2x4x32xf32>, tensor<32xf32>) -> tensor<2x4x32xf32> loc("bias")
// CHECK-NEXT:      %[[T:.*]] = wse.add %[[R]], %[[H]] : (tensor<2x4x32xf32>, tensor<2x4x32xf32>) -> tensor<2x4x32xf32> loc("residual")
// CHECK-NEXT:      wse.yield %[[T]] : tensor<2x4x32xf32>
// CHECK-NEXT:    } loc("proj")
