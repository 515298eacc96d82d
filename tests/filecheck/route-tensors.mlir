// RUN: cgc opt %s -p route-tensors | filecheck %s
// RUN: not cgc opt %s --target mesh4x8 -p route-tensors 2>&1 | filecheck %s --check-prefix=OUTSIDE
// RUN: cgc opt %s --target mesh4x8 -p place-layers,route-tensors | filecheck %s --check-prefix=PLACED

// Each tensor between layers gets a route on the mesh. fc1 -> fc2: the rectangles share rows
// 0-3 across the boundary of columns 1 and 2, so four straight lanes of one hop carry the 8x16
// floats (128 wavelets, 32 a lane). head's rectangle shares no row or column with fc1's or
// fc2's: two lanes (head is 2 columns wide) leave the source's east column on rows 0 and 2 and
// run along the row to head's columns 4 and 5, then down to its top row. The graph input x is
// read by fc1 first, so it travels to head from fc1; its lane on row 0 shares fc1 -> fc2's
// first link (32 + 64 = 96 wavelets there, the busiest link of fc1 -> fc2) and so takes color
// 1; fc2 -> head shares column 4 with it (64 + 64 = 128) and takes color 0, which no route on
// its links has.

builtin.module attributes {wse.target = #wse.target<"mesh8x8">} {
  func.func @main(%x: tensor<8x16xf32> loc("x")) -> tensor<8x16xf32> {
    %h = wse.layer "fc1"(%x) {rect = #wse.rect<0, 0, 2x4>} : (tensor<8x16xf32>) -> tensor<8x16xf32> {
    ^bb0(%a: tensor<8x16xf32>):
      %r = wse.relu %a : tensor<8x16xf32> loc("fc1")
      wse.yield %r : tensor<8x16xf32>
    } loc("fc1")
    %g = wse.layer "fc2"(%h) {rect = #wse.rect<2, 0, 2x4>} : (tensor<8x16xf32>) -> tensor<8x16xf32> {
    ^bb0(%a: tensor<8x16xf32>):
      %r = wse.relu %a : tensor<8x16xf32> loc("fc2")
      wse.yield %r : tensor<8x16xf32>
    } loc("fc2")
    %y = wse.layer "head"(%g, %x) {rect = #wse.rect<4, 6, 2x2>} : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32> {
    ^bb0(%a: tensor<8x16xf32>, %b: tensor<8x16xf32>):
      %s = wse.add %a, %b : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32> loc("head")
      wse.yield %s : tensor<8x16xf32>
    } loc("head")
    func.return %y : tensor<8x16xf32>
  }
}

// CHECK:       wse.layer "fc1"(%x) {rect = #wse.rect<0, 0, 2x4>}
// CHECK:       wse.layer "fc2"(%{{.*}}) {rect = #wse.rect<2, 0, 2x4>, routes = [#wse.route<"fc1", color 0, lanes 4, wavelets 128, busiest 96, hops 1, path [1, 0, 2, 0]>]}
// CHECK:       wse.layer "head"(%{{.*}}, %x) {rect = #wse.rect<4, 6, 2x2>, routes = [#wse.route<"fc1", color 1, lanes 2, wavelets 128, busiest 128, hops 9, path [1, 0, 4, 0, 4, 6]>, #wse.route<"fc2", color 0, lanes 2, wavelets 128, busiest 128, hops 7, path [3, 0, 4, 0, 4, 6]>]}

// OUTSIDE:     error: layer 'head' lies outside the 4x8 mesh of mesh4x8

// PLACED:      wse.layer "fc1"(%x) {rect = #wse.rect<{{.*}}>}
// PLACED:      wse.layer "fc2"(%{{.*}}) {rect = #wse.rect<{{.*}}>, routes = [#wse.route<"fc1", color 0, {{.*}}>]}
// PLACED:      wse.layer "head"(%{{.*}}, %x) {rect = #wse.rect<{{.*}}>, routes = [#wse.route<"fc1", {{.*}}>, #wse.route<"fc2", {{.*}}>]}
