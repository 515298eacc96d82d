"""Time on shapes alone: the timing engine that runs a program's instructions over their
kernels' plans and answers what a layer or a program costs (``cost``), and the weight-streaming
step over K systems with the SwarmX tree (``streaming``)."""
