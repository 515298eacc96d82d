"""Where a tensor lies on the mesh and what moving it costs: layouts (``layout``), the
traffic of a transfer (``traffic``), a data-movement op's index map by digits (``index_maps``)
and the flows it makes, counted without enumerating elements (``flows``, ``flow_counts``;
convolution windows by tap ranges in ``window_flows`` and ``window_segments``)."""
