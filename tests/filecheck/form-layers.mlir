// RUN: cgc opt %s --split-input-file -p form-layers | filecheck %s

// A layer opens at a matmul or pooling window once the current layer holds one, and is
// named after the node of the op that opened it. Layer bodies are isolated: their inputs
// come in as block arguments, and each layer creates the weights and constants it uses
// (the shared weight and the constant appear in two layers each).

func.func @main(%x: tensor<2x4xf32> loc("x")) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
  %w = wse.weight "shared.weight" : tensor<4x4xf32> loc("shared")
  %b = wse.weight "fc1.bias" : tensor<4xf32> loc("fc1")
  %m1 = wse.matmul %x, %w : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32> loc("fc1")
  %a1 = wse.add %m1, %b : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32> loc("fc1")
  %r1 = wse.relu %a1 : tensor<2x4xf32> loc("fc1_relu")
  %m2 = wse.matmul %r1, %w : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32> loc("fc2")
  %half = wse.constant dense<0.5> : tensor<f32> loc("half")
  %s = wse.mul %m2, %half : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32> loc("scale")
  %res = wse.add %s, %x : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32> loc("residual")
  %p = wse.reshape %res : tensor<2x4xf32> -> tensor<2x1x2x2xf32> loc("to_image")
  %q = wse.max_pool %p {kernel = array<i64: 1, 2>, strides = array<i64: 1, 2>, pads = array<i64: 0, 0, 0, 0>, dilations = array<i64: 1, 1>} : tensor<2x1x2x2xf32> -> tensor<2x1x2x1xf32> loc("pool")
  %f = wse.reshape %q : tensor<2x1x2x1xf32> -> tensor<2x2xf32> loc("flatten")
  %v = wse.weight "fc2.weight" : tensor<2x4xf32> loc("head")
  %m3 = wse.matmul %f, %v : (tensor<2x2xf32>, tensor<2x4xf32>) -> tensor<2x4xf32> loc("head")
  %o = wse.mul %m3, %half : (tensor<2x4xf32>, tensor<f32>) -> tensor<2x4xf32> loc("head_scale")
  func.return %o, %r1 : tensor<2x4xf32>, tensor<2x4xf32>
}

// CHECK-LABEL: func.func @main(%x: tensor<2x4xf32> loc("x")) -> (tensor<2x4xf32>, tensor<2x4xf32>) {
// CHECK-NEXT:    %[[L1:.*]] = wse.layer "fc1"(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32> {
// CHECK-NEXT:    ^{{.*}}(%[[A:.*]]: tensor<2x4xf32>):
// CHECK-NEXT:      %[[W:.*]] = wse.weight "shared.weight" : tensor<4x4xf32> loc("shared")
// CHECK-NEXT:      %[[B:.*]] = wse.weight "fc1.bias" : tensor<4xf32> loc("fc1")
// CHECK-NEXT:      %[[M:.*]] = wse.matmul %[[A]], %[[W]] : (tensor<2x4xf32>, tensor<4x4xf32>) -> tensor<2x4xf32> loc("fc1")
// CHECK-NEXT:      %[[ADD:.*]] = wse.add %[[M]], %[[B]] : {{.*}} loc("fc1")
// CHECK-NEXT:      %[[R:.*]] = wse.relu %[[ADD]] : tensor<2x4xf32> loc("fc1_relu")
// CHECK-NEXT:      wse.yield %[[R]] : tensor<2x4xf32>
// CHECK-NEXT:    } loc("fc1")
// CHECK-NEXT:    %[[L2:.*]] = wse.layer "fc2"(%[[L1]], %x) : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x1x2x2xf32> {
// CHECK-NEXT:    ^{{.*}}(%[[H:.*]]: tensor<2x4xf32>, %[[X:.*]]: tensor<2x4xf32>):
// CHECK-NEXT:      %[[W:.*]] = wse.weight "shared.weight" : tensor<4x4xf32> loc("shared")
// CHECK-NEXT:      %[[HALF:.*]] = wse.constant dense<5.000000e-01> : tensor<f32> loc("half")
// CHECK-NEXT:      %[[M:.*]] = wse.matmul %[[H]], %[[W]] : {{.*}} loc("fc2")
// CHECK-NEXT:      %[[S:.*]] = wse.mul %[[M]], %[[HALF]] : {{.*}} loc("scale")
// CHECK-NEXT:      %[[RES:.*]] = wse.add %[[S]], %[[X]] : {{.*}} loc("residual")
// CHECK-NEXT:      %[[P:.*]] = wse.reshape %[[RES]] : tensor<2x4xf32> -> tensor<2x1x2x2xf32> loc("to_image")
// CHECK-NEXT:      wse.yield %[[P]] : tensor<2x1x2x2xf32>
// CHECK-NEXT:    } loc("fc2")
// CHECK-NEXT:    %[[L3:.*]] = wse.layer "pool"(%[[L2]]) : (tensor<2x1x2x2xf32>) -> tensor<2x2xf32> {
// CHECK-NEXT:    ^{{.*}}(%[[I:.*]]: tensor<2x1x2x2xf32>):
// CHECK-NEXT:      %[[Q:.*]] = wse.max_pool %[[I]] {{.*}} loc("pool")
// CHECK-NEXT:      %[[F:.*]] = wse.reshape %[[Q]] : tensor<2x1x2x1xf32> -> tensor<2x2xf32> loc("flatten")
// CHECK-NEXT:      wse.yield %[[F]] : tensor<2x2xf32>
// CHECK-NEXT:    } loc("pool")
// CHECK-NEXT:    %[[L4:.*]] = wse.layer "head"(%[[L3]]) : (tensor<2x2xf32>) -> tensor<2x4xf32> {
// CHECK-NEXT:    ^{{.*}}(%[[J:.*]]: tensor<2x2xf32>):
// CHECK-NEXT:      %[[V:.*]] = wse.weight "fc2.weight" : tensor<2x4xf32> loc("head")
// CHECK-NEXT:      %[[HALF:.*]] = wse.constant dense<5.000000e-01> : tensor<f32> loc("half")
// CHECK-NEXT:      %[[M:.*]] = wse.matmul %[[J]], %[[V]] : {{.*}} loc("head")
// CHECK-NEXT:      %[[O:.*]] = wse.mul %[[M]], %[[HALF]] : {{.*}} loc("head_scale")
// CHECK-NEXT:      wse.yield %[[O]] : tensor<2x4xf32>
// CHECK-NEXT:    } loc("head")
// CHECK-NEXT:    func.return %[[L4]], %[[L1]] : tensor<2x4xf32>, tensor<2x4xf32>
// CHECK-NEXT:  }

// -----

// A token embedding (a weight's rows looked up by ids the model is given, reshaped or cast at
// most) is a layer of its own, named after its node: what follows it up to the next matmul
// joins it (the position table's rows added, a norm), and that matmul opens the next layer.
// A lookup by ids the model computes opens no layer (the relative bias after the matmul).

func.func @main(%ids: tensor<2x3xi64> loc("ids")) -> tensor<6x4xf32> {
  %table = wse.weight "wte.weight" : tensor<10x4xf32> loc("wte")
  %flat = wse.reshape %ids : tensor<2x3xi64> -> tensor<6xi64> loc("wte_flat")
  %cast = wse.cast %flat : tensor<6xi64> -> tensor<6xi32> loc("wte_cast")
  %x = wse.gather %table, %cast {axis = 0 : i64} : (tensor<10x4xf32>, tensor<6xi32>) -> tensor<6x4xf32> loc("wte")
  %positions = wse.weight "wpe.weight" : tensor<3x4xf32> loc("wpe")
  %at = wse.constant dense<[0, 1, 2, 0, 1, 2]> : tensor<6xi32> loc("positions")
  %p = wse.gather %positions, %at {axis = 0 : i64} : (tensor<3x4xf32>, tensor<6xi32>) -> tensor<6x4xf32> loc("wpe")
  %e = wse.add %x, %p : (tensor<6x4xf32>, tensor<6x4xf32>) -> tensor<6x4xf32> loc("embed_sum")
  %w = wse.weight "q.weight" : tensor<4x4xf32> loc("q_proj")
  %q = wse.matmul %e, %w : (tensor<6x4xf32>, tensor<4x4xf32>) -> tensor<6x4xf32> loc("q_proj")
  %r = wse.gather %positions, %at {axis = 0 : i64} : (tensor<3x4xf32>, tensor<6xi32>) -> tensor<6x4xf32> loc("bias")
  %o = wse.add %q, %r : (tensor<6x4xf32>, tensor<6x4xf32>) -> tensor<6x4xf32> loc("biased")
  func.return %o : tensor<6x4xf32>
}

// CHECK-LABEL: func.func @main(%ids: tensor<2x3xi64> loc("ids")) -> tensor<6x4xf32> {
// CHECK-NEXT:    %[[E:.*]] = wse.layer "wte"(%ids) : (tensor<2x3xi64>) -> tensor<6x4xf32> {
// CHECK-NEXT:    ^{{.*}}(%[[IDS:.*]]: tensor<2x3xi64>):
// CHECK-NEXT:      %[[T:.*]] = wse.weight "wte.weight" : tensor<10x4xf32> loc("wte")
// CHECK-NEXT:      %[[P:.*]] = wse.weight "wpe.weight" : tensor<3x4xf32> loc("wpe")
// CHECK-NEXT:      %[[AT:.*]] = wse.constant {{.*}} loc("positions")
// CHECK-NEXT:      %[[F:.*]] = wse.reshape %[[IDS]] : {{.*}} loc("wte_flat")
// CHECK-NEXT:      %[[C:.*]] = wse.cast %[[F]] : {{.*}} loc("wte_cast")
// CHECK-NEXT:      %[[X:.*]] = wse.gather %[[T]], %[[C]] {{.*}} loc("wte")
// CHECK-NEXT:      %[[Y:.*]] = wse.gather %[[P]], %[[AT]] {{.*}} loc("wpe")
// CHECK-NEXT:      %[[S:.*]] = wse.add %[[X]], %[[Y]] : {{.*}} loc("embed_sum")
// CHECK-NEXT:      wse.yield %[[S]] : tensor<6x4xf32>
// CHECK-NEXT:    } loc("wte")
// CHECK-NEXT:    %[[Q:.*]] = wse.layer "q_proj"(%[[E]]) : (tensor<6x4xf32>) -> tensor<6x4xf32> {
// CHECK-NEXT:    ^{{.*}}(%[[A:.*]]: tensor<6x4xf32>):
// CHECK-NEXT:      %[[W:.*]] = wse.weight "q.weight" : tensor<4x4xf32> loc("q_proj")
// CHECK-NEXT:      %[[P:.*]] = wse.weight "wpe.weight" : tensor<3x4xf32> loc("wpe")
// CHECK-NEXT:      %[[AT:.*]] = wse.constant {{.*}} loc("positions")
// CHECK-NEXT:      %[[M:.*]] = wse.matmul %[[A]], %[[W]] : {{.*}} loc("q_proj")
// CHECK-NEXT:      %[[R:.*]] = wse.gather %[[P]], %[[AT]] {{.*}} loc("bias")
// CHECK-NEXT:      %[[O:.*]] = wse.add %[[M]], %[[R]] : {{.*}} loc("biased")
// CHECK-NEXT:      wse.yield %[[O]] : tensor<6x4xf32>
// CHECK-NEXT:    } loc("q_proj")
// CHECK-NEXT:    func.return %[[Q]] : tensor<6x4xf32>
// CHECK-NEXT:  }

// -----

// Generation's decode step: the key-value caches are sources like weights, created inside
// the layer that writes and reads them (the cached attention opens it, as a matmul would),
// and the positions come in as the layer's argument.

func.func @main(%q: tensor<2x8xf32> loc("q"), %k: tensor<2x4xf32> loc("k"), %v: tensor<2x4xf32> loc("v"), %pos: tensor<2x1xi32> loc("positions")) -> tensor<2x8xf32> {
  %w = wse.weight "q_proj.weight" : tensor<8x8xf32> loc("q_proj")
  %x = wse.matmul %q, %w : (tensor<2x8xf32>, tensor<8x8xf32>) -> tensor<2x8xf32> loc("q_proj")
  %kc = wse.kv_cache "attn.key_cache" {capacity = 6 : i64} : tensor<12x4xf32> loc("attn")
  %vc = wse.kv_cache "attn.value_cache" {capacity = 6 : i64} : tensor<12x4xf32> loc("attn")
  %a = wse.cached_attention %x, %k, %v, %kc, %vc, %pos {heads = 2 : i64, kv_heads = 1 : i64, scale = 5.000000e-01 : f64} : (tensor<2x8xf32>, tensor<2x4xf32>, tensor<2x4xf32>, tensor<12x4xf32>, tensor<12x4xf32>, tensor<2x1xi32>) -> tensor<2x8xf32> loc("attn")
  func.return %a : tensor<2x8xf32>
}

// CHECK:      wse.layer "q_proj"(%q)
// CHECK:      wse.layer "attn"(%{{.*}}, %k, %v, %pos)
// CHECK-NEXT:   ^{{.*}}(%{{.*}}: tensor<2x8xf32>, %{{.*}}: tensor<2x4xf32>, %{{.*}}: tensor<2x4xf32>, %{{.*}}: tensor<2x1xi32>):
// CHECK-NEXT:     %{{.*}} = wse.kv_cache "attn.key_cache" {capacity = 6 : i64} : tensor<12x4xf32>
// CHECK-NEXT:     %{{.*}} = wse.kv_cache "attn.value_cache" {capacity = 6 : i64} : tensor<12x4xf32>
// CHECK-NEXT:     %{{.*}} = wse.cached_attention
