"""A cluster of K systems as Ray actors, MemoryX as one more: the numbers of a local run.

Each system is a ``SystemActor``: it holds its own SRAM, pinned tensors and activations, and
runs the chunks ``c`` with ``c mod K`` its index (``Cluster``'s split), returning the run's
records and outputs to the driver and keeping its gradients in the object store. MemoryX is a
``MemoryXActor`` holding the weights and the optimizer state. A step goes:

* broadcast: MemoryX puts its weights in the object store once (``ray.put``) and every
  system actor is handed that one object (zero-copy on its node);
* the systems run their chunks in parallel;
* reduce: SwarmX's tree (``SwarmX.combine``) is walked with nodes that run on the actor of
  their first leaf and sum their children's gradients left to right, as ``SwarmX.reduce``
  does, so every sum is the local one, bit for bit, for every K and fan-out; the root's
  sums go to MemoryX, which folds in the buffers and applies the optimizer.

Every actor computes with as many BLAS threads as the driver does (``blas_threads``): OpenBLAS
splits a matrix product among its threads in ways that round differently (a product of 16 x
784 by 784 x 128 on one thread differs from the same on two in the last bit), and Ray alone
gives an actor one thread per CPU it holds where the local run in the driver has the
machine's. The timing is the local cluster's: it comes from the runs' records, which do not
depend on where the runs ran. An actor that dies ends the run with a one-line ``CgcError``
naming it; a training run continues from its last checkpoint with ``--resume``.

This module imports Ray: it is imported only for ``--executor ray``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import ray
import threadpoolctl
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from cgc.errors import CgcError
from cgc.machine.hardware.target import Target
from cgc.machine.program.artifact import Artifact, WeightSpec
from cgc.machine.program.bytecode import Program
from cgc.machine.program.mode import Mode
from cgc.machine.timing.cost import Sram
from cgc.runtime.cluster import Cluster, OnStep, Run
from cgc.runtime.executors import Backend
from cgc.runtime.memoryx import MemoryX
from cgc.runtime.swarmx import add
from cgc.runtime.vm import Executor, System

Gradients = list[tuple[str, list[int] | None, np.ndarray]]
"""A run's gradient streams, or a SwarmX node's sums of them: (weight, view, values)."""

PLACEMENT_SECONDS = 60.0
"""How long a run waits for the Ray cluster to make room for its actors."""


class _Actor:
    """What every actor of a run answers."""

    def __init__(self, threads: dict[str, int]):
        """``threads``: the driver's ``blas_threads``, which this process's BLAS takes up
        (for the life of the actor's process: it runs this actor alone)."""
        threadpoolctl.threadpool_limits(threads)

    def identity(self) -> str | None:
        """This actor's id, as Ray's errors name it."""
        return ray.get_runtime_context().get_actor_id()


class SystemActor(_Actor):
    """One system: its SRAM, its pinned tensors, and the weights of the current step."""

    def __init__(
        self,
        program: Program,
        target: Target,
        mode: Mode,
        specs: dict[str, WeightSpec],
        threads: dict[str, int],
    ):
        super().__init__(threads)
        self.program = program
        self.target = target
        self.deliver = mode == Mode.PIPELINED
        self.system = System(Sram(target))
        self.weights = MemoryX({}, target, specs)
        """Streams the weights of the step from the object store's copy."""

    def run(
        self, chunk: Sequence[np.ndarray], weights: dict[str, np.ndarray]
    ) -> tuple[Run, Gradients]:
        """Runs the program on one chunk with the step's weights, as MemoryX broadcast them
        (each run is handed them: a lost broadcast fails the run, not a later step): the run
        without its gradients, and the gradients."""
        self.weights.weights = weights
        executor = Executor(self.program, self.target, self.system, self.weights, self.deliver)
        executor.run(chunk)
        gradients = [(name, perm, executor.gradient(i)) for i, (name, perm, _) in
                     enumerate(executor.gradients)]  # fmt: skip
        bare: list[tuple[str, list[int] | None, np.ndarray | None]]
        bare = [(name, perm, None) for name, perm, _ in gradients]
        return dataclasses.replace(Run.of(executor), gradients=bare), gradients

    def reduce(self, *children: Gradients) -> Gradients:
        """A SwarmX node: its children's gradients summed left to right, stream by stream."""
        return [
            (name, perm, add([child[i][2] for child in children]))
            for i, (name, perm, _) in enumerate(children[0])
        ]


class MemoryXActor(_Actor):
    """MemoryX: the weights, this step's gradients and the optimizer state."""

    def __init__(self, memoryx: MemoryX, threads: dict[str, int]):
        super().__init__(threads)
        # a copy of its own: arrays that come through the object store are read-only views
        self.memoryx = copy.deepcopy(memoryx)

    def broadcast(self) -> list[ray.ObjectRef]:
        """The weights put in the object store once, for every system (in a list: the
        driver hands the reference on without fetching the weights)."""
        return [ray.put(self.memoryx.weights)]

    def receive(self, summed: Gradients) -> None:
        """Adds SwarmX's sums of one micro-batch to the step's gradients."""
        for name, perm, gradient in summed:
            self.memoryx.receive(name, gradient, perm)

    def update(
        self,
        buffers: list[dict[str, Any]],
        outputs: list[dict[str, np.ndarray]],
        optimizer: tuple[str, dict[str, float]] | None,
        lr_factor: float,
        max_grad_norm: float | None,
        allow_nonfinite: bool,
        loss: float,
        *received: None,
    ) -> tuple[float | None, list[ray.ObjectRef]]:
        """Folds in the buffers, applies the optimizer (if the program has one) and
        broadcasts the new weights; returns the gradients' norm and the broadcast.
        ``received``: the step's ``receive`` calls, so that a reduction that failed fails
        the update too, rather than leave it the step's gradients in part."""
        self.memoryx.fold(buffers, outputs)
        norm = None
        if optimizer is not None:
            norm = self.memoryx.apply(
                *optimizer,
                lr_factor=lr_factor,
                max_grad_norm=max_grad_norm,
                allow_nonfinite=allow_nonfinite,
                loss=loss,
            )
        return norm, self.broadcast()

    def held(self) -> MemoryX:
        """MemoryX as it stands."""
        return self.memoryx

    def restore(
        self,
        weights: Mapping[str, np.ndarray],
        state: dict[str, dict[str, np.ndarray]],
        steps: int,
        masks: Mapping[str, np.ndarray] | None,
    ) -> list[ray.ObjectRef]:
        """Takes up a checkpoint (copied, as ``__init__`` copies) and broadcasts its weights."""
        self.memoryx.restore(copy.deepcopy(weights), copy.deepcopy(state), steps, masks)
        return self.broadcast()


class RayCluster(Cluster):
    """A numeric cluster whose systems and MemoryX are Ray actors (Ray is connected)."""

    def __init__(self, artifact: Artifact, num_csx: int | None, backend: Backend):
        super().__init__(artifact, num_csx)
        self.pending: list[ray.ObjectRef] = []
        """The gradients of the last step's runs, by chunk, in the systems' object stores."""
        self.group: Any = None
        self.actors: list[Any] = []
        self.store: Any = None
        self.names: dict[str, str] = {}
        """Each actor's name in errors, by its id."""
        try:
            self._start(artifact, backend.placement or "pack")
        except BaseException:  # the actors must not outlive a cluster that never started
            self.close()
            raise
        # the driver's MemoryX keeps the shapes and live counts that the timing needs
        self.memoryx.weights = {}

    def _start(self, artifact: Artifact, placement: str) -> None:
        """Places the actors, and has MemoryX broadcast the first weights."""
        count = self.num_csx + 1
        self.group = _placement(count, placement)
        run = uuid.uuid4().hex[:8]

        def placed(index: int, name: str) -> dict[str, Any]:
            strategy = PlacementGroupSchedulingStrategy(self.group, index)
            cpus = self.group.bundle_specs[index]["CPU"]
            return {"name": f"cgc-{run}/{name}", "num_cpus": cpus, "scheduling_strategy": strategy}

        program = ray.put(self.program)  # once for all the systems
        specs = artifact.weight_specs
        threads = blas_threads()
        self.actors = [
            _SYSTEM.options(**placed(k, f"system {k}")).remote(
                program, self.target, self.mode, specs, threads
            )
            for k in range(self.num_csx)
        ]
        self.store = _MEMORYX.options(**placed(self.num_csx, "MemoryX")).remote(
            self.memoryx, threads
        )
        names = [*(f"system {k}" for k in range(self.num_csx)), "MemoryX"]
        ids = ray.get([actor.identity.remote() for actor in [*self.actors, self.store]])
        self.names = {id_: name for id_, name in zip(ids, names, strict=True) if id_}
        self.weights = self._get(self.store.broadcast.remote())[0]
        """The object of the step's weights, handed to every run."""

    def _get(self, ref: ray.ObjectRef) -> Any:
        """``ref``'s value; an actor that died is a one-line error naming it, and an error of
        the run inside an actor is raised as it is."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as error:
            who = self.names.get(error.actor_id or "", "an actor of the run")
            raise CgcError(
                f"{who} died (its Ray actor ended); a training run with checkpoints continues "
                "from the last one with resume",
                "resume",
            ) from None
        except ray.exceptions.RayTaskError as error:
            if isinstance(error.cause, CgcError):
                raise error.cause from None
            raise

    def _runs(
        self, inputs: Mapping[str, np.ndarray] | None, on_step: OnStep | None = None
    ) -> tuple[list[Run], int]:
        """The chunks' runs, chunk ``c`` on system actor ``c mod K``; their gradients stay
        in the object store (``pending``). The actors run their layers out of sight:
        ``on_step`` is told of each run's first layer as this process waits for it."""
        if inputs is None:
            raise CgcError("a run with numbers needs inputs")
        calls = [
            self.actors[c % self.num_csx].run.options(num_returns=2).remote(chunk, self.weights)
            for c, chunk in enumerate(self._chunks(inputs))
        ]
        self.pending = [gradients for _, gradients in calls]
        runs = []
        for c, (run, _) in enumerate(calls):
            told = self._told(on_step, c, len(calls))
            if told is not None:
                told(1, "on Ray")
            runs.append(self._get(run))
        return runs, len(runs)

    def _update(
        self,
        runs: Sequence[Run],
        lr_factor: float,
        max_grad_norm: float | None,
        allow_nonfinite: bool,
        loss: float,
    ) -> None:
        """Each micro-batch's gradients summed through SwarmX's tree on the system actors
        into the MemoryX actor, which then updates and broadcasts the weights."""
        received = []
        for first in range(0, len(runs), self.num_csx):
            leaves = list(enumerate(self.pending[first : first + self.num_csx]))
            received.append(self.store.receive.remote(self.swarmx.combine(leaves, self._node)[1]))
        self.pending = []
        outputs = self._named_outputs(runs)
        update = self.store.update.remote(
            self._buffers(),
            outputs,
            runs[0].optimizer,
            lr_factor,
            max_grad_norm,
            allow_nonfinite,
            loss,
            *received,
        )
        norm, weights = self._get(update)
        if norm is not None:
            self.grad_norm = norm
        self.weights = weights[0]

    def _node(self, group: Sequence[tuple[int, ray.ObjectRef]]) -> tuple[int, ray.ObjectRef]:
        """A SwarmX node over ``group`` (first leaf's system, gradients), run on the actor of
        its first leaf."""
        first = group[0][0]
        return first, self.actors[first].reduce.remote(*[gradients for _, gradients in group])

    def stored(self) -> MemoryX:
        # a copy of its own: arrays from the object store are read-only, the local ones not
        return copy.deepcopy(self._get(self.store.held.remote()))

    def restore(
        self,
        weights: Mapping[str, np.ndarray],
        state: dict[str, dict[str, np.ndarray]],
        steps: int,
        masks: Mapping[str, np.ndarray] | None,
    ) -> None:
        self.weights = self._get(self.store.restore.remote(weights, state, steps, masks))[0]

    def close(self) -> None:
        """Ends the actors and frees their placement (those made so far)."""
        for actor in [*self.actors, self.store]:
            if actor is not None:
                ray.kill(actor)
        if self.group is not None:
            remove_placement_group(self.group)


def blas_threads() -> dict[str, int]:
    """The threads of each BLAS library loaded in this process, by its name's prefix (as
    ``threadpoolctl`` names it): what a local run's products and norms are computed with."""
    return {
        library["prefix"]: library["num_threads"]
        for library in threadpoolctl.threadpool_info()
        if library["user_api"] == "blas"
    }


def _placement(count: int, strategy: str) -> Any:
    """A placement group of ``count`` bundles, packed or spread, each of a CPU or, on a
    cluster of fewer, an equal share of them; it waits for them to be free."""
    cpus = ray.cluster_resources().get("CPU", 0.0)
    share = min(1.0, math.floor(cpus / count * 100) / 100)
    if not share:
        raise CgcError(f"the Ray cluster has {cpus:g} CPU, too few for {count} actors")
    group = placement_group([{"CPU": share}] * count, strategy=strategy.upper())
    try:
        ray.get(group.ready(), timeout=PLACEMENT_SECONDS)
    except ray.exceptions.GetTimeoutError:
        remove_placement_group(group)
        raise CgcError(
            f"the Ray cluster found no room for {count} actors of {share:g} CPU "
            f"in {PLACEMENT_SECONDS:g} s"
        ) from None
    return group


_SYSTEM: Any = ray.remote(SystemActor)
_MEMORYX: Any = ray.remote(MemoryXActor)
