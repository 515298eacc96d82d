"""The fuzzer's numeric oracle: cgc's outputs against a reference's on the same inputs.

The reference is onnxruntime for an ONNX model, or torch eager for a ``FILE.py:FACTORY``
module. It runs in a child forked from the worker: a reference kernel may die of a signal on
edge values (torch's and onnxruntime's integer division of the type's minimum by -1 or by 0
raise SIGFPE), which must not take the worker with it; such a reference is no reference.

Float outputs agree to rtol 1e-4, atol 1e-5 with NaNs in the same places (or, for an
ill-conditioned output, lie nearer its float64 value, by onnx's reference evaluator, than
onnxruntime's float32 does). With ``exact``, integer outputs must be equal, an output's kind
(integer or float) must be the reference's, and inputs the reference rejects when it runs them
(an index out of range, torch's integer division by zero) must not give outputs: cgc computed
something for inputs that have no result.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import re
import runpy
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RTOL, ATOL = 1e-4, 1e-5
FACTORY = re.compile(r"(?P<path>.+\.py):(?P<name>\w+)")
Outputs = dict[str, np.ndarray]


def compare(case_dir: Path, reference: str, exact: bool = False) -> tuple[bool, str | None]:
    """Whether the outputs could be checked (the reference takes the model and the inputs,
    or, with ``exact``, takes the model), and how cgc's ``outputs.npz`` disagrees with the
    reference's outputs on ``inputs.npz``, or None."""
    with np.load(case_dir / "inputs.npz") as f:
        inputs = dict(f)
    factory = FACTORY.fullmatch(reference)
    if factory:
        path = str(case_dir / factory["path"])
        status, expected = isolated(lambda: _torch_outputs(path, factory["name"], inputs))
    else:
        status, expected = isolated(lambda: _onnxruntime_outputs(case_dir / reference, inputs))
    if status == "rejected" and exact:
        return True, f"cgc ran inputs the reference rejects ({expected})"
    if status != "ok":
        return False, None
    try:
        with np.load(case_dir / "outputs.npz") as f:
            got = dict(f)
    except (OSError, ValueError) as e:
        return True, f"outputs.npz does not load ({type(e).__name__})"
    for name, want in expected.items():
        if name not in got:
            return True, f"output '{name}' missing"
        mismatch = _differs(name, got[name], np.asarray(want), exact)
        if mismatch and not factory and _ill_conditioned(case_dir / reference, inputs, name,
                                                         got[name], want):  # fmt: skip
            continue
        if mismatch:
            return True, mismatch
    return True, None


def _ill_conditioned(
    model: Path, inputs: dict[str, np.ndarray], name: str, got: np.ndarray, want: np.ndarray
) -> bool:
    """Whether float output ``name`` is nearer its float64 value than onnxruntime's."""
    if got.dtype.kind != "f" or got.shape != np.shape(want):
        return False
    exact = _in_float64(model, inputs, name)
    return exact is not None and _error(got, exact) <= _error(want, exact)


def _differs(name: str, got: np.ndarray, want: np.ndarray, exact: bool) -> str | None:
    """How output ``name`` differs from the reference's, or None."""
    if got.shape != want.shape:
        return f"output '{name}' shape {got.shape} != {want.shape}"
    integers = got.dtype.kind in "iub" and want.dtype.kind in "iub"
    if exact and (got.dtype.kind == "f") != (want.dtype.kind == "f"):
        return f"output '{name}' is {got.dtype}, the reference's {want.dtype}"
    if exact and integers:
        wrong = got.astype(np.int64) != want.astype(np.int64)
        if wrong.any():
            at = tuple(int(i) for i in np.argwhere(wrong)[0])
            return f"output '{name}' differs at {at}: {got[at]} != {want[at]}"
        return None
    wide, reference = got.astype(np.float64), want.astype(np.float64)
    if np.allclose(wide, reference, rtol=RTOL, atol=ATOL, equal_nan=True):
        return None
    with np.errstate(invalid="ignore"):
        worst = float(np.nanmax(np.abs(wide - reference), initial=0.0))
    nans = int((np.isnan(wide) != np.isnan(reference)).sum())
    return f"output '{name}' differs (max abs diff {worst:.3g}, NaNs in {nans} other places)"


def isolated(compute: Callable[[], Outputs], timeout: float = 60.0) -> tuple[str, Any]:
    """``compute()`` in a forked child: ``("ok", outputs)``; ``("model", why)`` when the
    reference does not take the model, ``("rejected", why)`` when it does not take the inputs
    (``compute`` raises ``Rejected``), ``("crashed", why)`` when the child dies or hangs. (The
    worker is a daemonic process, which ``multiprocessing`` lets have no children.)"""
    receive, send = multiprocessing.Pipe(duplex=False)
    pid = os.fork()
    if pid == 0:  # the child: answer, and leave without running the worker's cleanup
        receive.close()
        faulthandler.disable()  # a reference's crash is an answer, not news
        try:
            send.send(("ok", compute()))
        except Rejected as e:
            send.send(("rejected", str(e)[:200]))
        except BaseException as e:
            send.send(("model", f"{type(e).__name__}: {str(e)[:200]}"))
        finally:
            os._exit(0)
    send.close()
    try:
        if receive.poll(timeout):
            return receive.recv()
        return "crashed", "no answer"
    except EOFError:
        return "crashed", "the reference died"
    finally:
        receive.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)


class Rejected(Exception):
    """The reference takes the model but not these inputs."""


def _onnxruntime_outputs(model: Path, inputs: dict[str, np.ndarray]) -> Outputs:
    import onnxruntime as ort

    ort.set_default_logger_severity(4)  # its complaints about mutants would flood the terminal
    options = ort.SessionOptions()
    options.log_severity_level = 4
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model), options, ["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    try:
        values = session.run(None, inputs)
    except Exception as e:  # its status message says why, after its own preamble
        why = str(e).splitlines()[0].rpartition("Status Message: ")[2]
        raise Rejected(f"onnxruntime: {why}") from None
    return dict(zip(names, (np.asarray(v) for v in values), strict=True))


def _torch_outputs(path: str, name: str, inputs: dict[str, np.ndarray]) -> Outputs:
    """The module's outputs in eager mode, the inputs of the dtypes of the factory's example
    inputs (bound to ``forward``'s parameters by name), named as cgc names a module's:
    ``output``, or ``output_0``, ``output_1``, ... for several."""
    import inspect

    import torch

    module, example = runpy.run_path(path)[name]()[:2]
    bound = inspect.signature(module.forward).bind(*example).arguments
    args = {k: torch.from_numpy(v).to(bound[k].dtype) for k, v in inputs.items()}
    try:
        with torch.no_grad():
            result = module(**args)
    except Exception as e:
        raise Rejected(f"torch: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    values = list(result) if isinstance(result, tuple | list) else [result]
    if len(values) == 1:
        return {"output": values[0].numpy()}
    return {f"output_{i}": v.numpy() for i, v in enumerate(values)}


def _in_float64(path: Path, inputs: dict[str, np.ndarray], name: str) -> np.ndarray | None:
    """Output ``name`` of the model computed in float64 by onnx's reference evaluator (every
    float32 tensor, initializer, constant and cast made float64; onnxruntime has no float64
    convolution), or None where it cannot run so."""
    import onnx
    from onnx import TensorProto, numpy_helper
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(path))
    graph = model.graph
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type == TensorProto.FLOAT:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    tensors = [*graph.initializer]
    for node in graph.node:
        for attribute in node.attribute:
            if (
                node.op_type == "Cast"
                and attribute.name == "to"
                and attribute.i == TensorProto.FLOAT
            ):
                attribute.i = TensorProto.DOUBLE
            if attribute.type == onnx.AttributeProto.TENSOR:
                tensors.append(attribute.t)
    for tensor in tensors:
        if tensor.data_type == TensorProto.FLOAT:
            tensor.CopyFrom(
                numpy_helper.from_array(
                    numpy_helper.to_array(tensor).astype(np.float64), tensor.name
                )
            )
    wide = {k: v.astype(np.float64) if v.dtype == np.float32 else v for k, v in inputs.items()}
    try:
        (value,) = ReferenceEvaluator(model).run([name], wide)
        return np.asarray(value, dtype=np.float64)
    except Exception:  # an op the evaluator has not, or not for float64
        return None


def _error(values: np.ndarray, exact: np.ndarray) -> float:
    """The largest distance of ``values`` from ``exact`` in units of the tolerance."""
    scale = ATOL + RTOL * np.abs(exact)
    return float(np.nanmax(np.abs(values.astype(np.float64) - exact) / scale, initial=0.0))
