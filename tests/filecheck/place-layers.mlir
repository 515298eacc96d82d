// RUN: cgc opt %s -p place-layers | filecheck %s
// RUN: cgc opt %s --target mesh2x2 -p place-layers | filecheck %s --check-prefix=BANDS
// RUN: cgc opt %s --target mesh8x3 -p place-layers | filecheck %s --check-prefix=NARROW
// RUN: not cgc opt %s --target mesh1x2 -p place-layers 2>&1 | filecheck %s --check-prefix=TOOBIG
// RUN: cgc opt %s --target mesh8x3 -p 'place-layers{bands=true}' | filecheck %s --check-prefix=ROWS

// Layers in program order stack in vertical strips of the mesh: down the first strip, up the
// next. A layer is as high as its tensors have matrix rows (8 here, so the mesh's 4), and its
// width balances the stages: the slowest stage as fast as the columns allow (fc1 has 16384
// MACs, fc2 8192, head 512 on 8 columns: 5, 2, 1). The target comes from the module's
// wse.target, or from cgc opt --target.

builtin.module attributes {wse.target = #wse.target<"mesh4x8">} {
  func.func @main(%x: tensor<8x32xf32> loc("x")) -> tensor<8x4xf32> {
    %h = wse.layer "fc1"(%x) : (tensor<8x32xf32>) -> tensor<8x64xf32> {
    ^bb0(%a: tensor<8x32xf32>):
      %w = wse.weight "fc1.weight" : tensor<32x64xf32> loc("fc1")
      %m = wse.matmul %a, %w : (tensor<8x32xf32>, tensor<32x64xf32>) -> tensor<8x64xf32> loc("fc1")
      %r = wse.relu %m : tensor<8x64xf32> loc("fc1_relu")
      wse.yield %r : tensor<8x64xf32>
    } loc("fc1")
    %g = wse.layer "fc2"(%h) : (tensor<8x64xf32>) -> tensor<8x16xf32> {
    ^bb0(%a: tensor<8x64xf32>):
      %w = wse.weight "fc2.weight" : tensor<64x16xf32> loc("fc2")
      %m = wse.matmul %a, %w : (tensor<8x64xf32>, tensor<64x16xf32>) -> tensor<8x16xf32> loc("fc2")
      wse.yield %m : tensor<8x16xf32>
    } loc("fc2")
    %y = wse.layer "head"(%g) : (tensor<8x16xf32>) -> tensor<8x4xf32> {
    ^bb0(%a: tensor<8x16xf32>):
      %w = wse.weight "head.weight" : tensor<16x4xf32> loc("head")
      %m = wse.matmul %a, %w : (tensor<8x16xf32>, tensor<16x4xf32>) -> tensor<8x4xf32> loc("head")
      wse.yield %m : tensor<8x4xf32>
    } loc("head")
    func.return %y : tensor<8x4xf32>
  }
}

// CHECK:       builtin.module attributes {wse.target = #wse.target<"mesh4x8", rows = 4, cols = 8, {{.*}}>} {
// CHECK:         %[[H:.*]] = wse.layer "fc1"(%x) {rect = #wse.rect<0, 0, 5x4>} : (tensor<8x32xf32>) -> tensor<8x64xf32> {
// CHECK:         %[[G:.*]] = wse.layer "fc2"(%[[H]]) {rect = #wse.rect<5, 0, 2x4>} : (tensor<8x64xf32>) -> tensor<8x16xf32> {
// CHECK:         %[[Y:.*]] = wse.layer "head"(%[[G]]) {rect = #wse.rect<7, 0, 1x4>} : (tensor<8x16xf32>) -> tensor<8x4xf32> {
// CHECK:         func.return %[[Y]]

// Three layers on a 2x2 mesh: they take one row each, and fc1, the slowest, is fastest on
// both columns of the first row; strips cannot hold that, so the rectangles go where the
// ones before leave room (the skyline), fc2 and head side by side below it.
// BANDS:       wse.layer "fc1"(%x) {rect = #wse.rect<0, 0, 2x1>}
// BANDS:       wse.layer "fc2"(%{{.*}}) {rect = #wse.rect<0, 1, 1x1>}
// BANDS:       wse.layer "head"(%{{.*}}) {rect = #wse.rect<1, 1, 1x1>}

// On 8 rows x 3 columns a strip of every column beats three one-column strips: the heights
// are chosen with the width, each layer on the fewest rows that keep its stage within the
// slowest (fc1 4 of its 8 rows, fc2 3, head 1), where the widths alone gave each 1x8.
// NARROW:      wse.layer "fc1"(%x) {rect = #wse.rect<0, 0, 3x4>}
// NARROW:      wse.layer "fc2"(%{{.*}}) {rect = #wse.rect<0, 4, 3x3>}
// NARROW:      wse.layer "head"(%{{.*}}) {rect = #wse.rect<0, 7, 3x1>}

// TOOBIG:      error: model does not fit on mesh1x2 in pipelined mode: its 3 layers, each on its narrowest rectangle, do not pack onto the 1x2 mesh: as strips of all 1 rows they need 3 columns (144.0 KiB of SRAM), the mesh has 2 (96.0 KiB); use --mode weight_streaming

// With bands (a generation's decode step) every layer takes the mesh's full width, its rows
// in proportion to its time on the whole mesh (fc1 the most), stacked down the mesh.
// ROWS:        wse.layer "fc1"(%x) {rect = #wse.rect<0, 0, 3x5>}
// ROWS:        wse.layer "fc2"(%{{.*}}) {rect = #wse.rect<0, 5, 3x2>}
// ROWS:        wse.layer "head"(%{{.*}}) {rect = #wse.rect<0, 7, 3x1>}
