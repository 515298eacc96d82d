"""cgc's passes, one module each; a pass's name is its module's name with '-' for '_'."""

from __future__ import annotations

from xdsl.passes import ModulePass


def all_passes() -> dict[str, type[ModulePass]]:
    """Every cgc pass by name."""
    from cgc.passes.autodiff import AutodiffPass
    from cgc.passes.cache_keys_values import CacheKeysValuesPass
    from cgc.passes.channels_last import ChannelsLastPass
    from cgc.passes.decompose import DecomposePass
    from cgc.passes.fold_constants import FoldConstantsPass
    from cgc.passes.form_layers import FormLayersPass
    from cgc.passes.fuse_attention import FuseAttentionPass
    from cgc.passes.fuse_epilogues import FuseEpiloguesPass
    from cgc.passes.fuse_rotary import FuseRotaryPass
    from cgc.passes.place_layers import PlaceLayersPass
    from cgc.passes.recompute_activations import RecomputeActivationsPass
    from cgc.passes.route_tensors import RouteTensorsPass
    from cgc.passes.schedule_streams import ScheduleStreamsPass
    from cgc.passes.select_sparse_weights import SelectSparseWeightsPass

    passes: tuple[type[ModulePass], ...] = (
        FuseRotaryPass,
        FuseAttentionPass,
        CacheKeysValuesPass,
        DecomposePass,
        FoldConstantsPass,
        ChannelsLastPass,
        FormLayersPass,
        SelectSparseWeightsPass,
        AutodiffPass,
        RecomputeActivationsPass,
        FuseEpiloguesPass,
        PlaceLayersPass,
        RouteTensorsPass,
        ScheduleStreamsPass,
    )
    return {p.name: p for p in passes}
