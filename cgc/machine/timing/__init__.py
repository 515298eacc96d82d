"""Time on shapes alone, every timing model of cgc in one place, asked by the simulator
(``cgc.runtime``) and by ``cgc inspect`` (``cgc.tools.report``) alike:

* ``cost``: the timing engine that runs a program's instructions over their kernels' plans and
  answers what a layer or a program costs;
* ``streaming``: the weight-streaming step over K systems, through the SwarmX tree;
* ``pipeline``: the pipelined timeline, samples flowing through placed stages;
* ``run_stats``: a run's layer records made into each system's timeline, and its statistics
  (time, rates, MFU, MemoryX's footprint);
* ``utilization``: a weight-streaming step's MFU per layer and by term, and what binds it;
* ``pipeline_bound``: where a pipelined artifact's compute bound goes.
"""
