"""The keys of a params file: those cgc reads, and the Model Zoo's housekeeping it skips.

``without_housekeeping`` drops the housekeeping (``IGNORED_SECTIONS``, ``IGNORED_KEYS``) with
one warning, and rejects every section or key it does not know in one error.
"""

from __future__ import annotations

import difflib
import warnings
from collections.abc import Sequence

from cgc.errors import CgcError, CgcWarning
from cgc.machine.sparse.sparsity import DYNAMIC

SECTIONS = ("model", "train_input", "optimizer", "runconfig", "sparsity")
REQUIRED_SECTIONS = ("model", "train_input")
ZOO_BIAS_KEYS = ("use_projection_bias_in_attention", "use_ffn_bias_in_attention", "use_ffn_bias")
MODEL_KEYS = (
    "hidden_size",
    "num_hidden_layers",
    "num_heads",
    "extra_attention_params",
    "attention_sliding_window_length",
    "filter_size",
    "vocab_size",
    "max_position_embeddings",
    "position_embedding_type",
    "rotary_dim",
    "rope_theta",
    "pos_scaling_type",
    "pos_scaling_factor",
    "pos_scaling_extra_args",
    "norm_type",
    "layer_norm_epsilon",
    "nonlinearity",
    "share_embedding_weights",
    "use_bias",
    *ZOO_BIAS_KEYS,
    "use_bias_in_output",
    "parallel_attention",
    "use_untied_layer_norm",
    "embedding_dropout_rate",
    "attention_dropout_rate",
    "dropout_rate",
)
EXTRA_ATTENTION_KEYS = ("num_kv_groups",)
LLAMA3_SCALING_KEYS = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
"""The keys of ``pos_scaling_extra_args`` for ``pos_scaling_type: llama3`` (Hugging Face's
``rope_scaling`` names)."""
TRAIN_INPUT_KEYS = ("batch_size", "max_sequence_length")
OPTIMIZER_KEYS = (
    "optimizer_type",
    "learning_rate",
    "betas",
    "beta1",
    "beta2",
    "eps",
    "weight_decay",
    "weight_decay_rate",
    "momentum",
    "max_gradient_norm",
)
ADAM_KEYS = ("betas", "beta1", "beta2", "eps")
RUNCONFIG_KEYS = ("num_csx", "precision")
SPARSITY_KEYS = ("density", "param_name_patterns", "init", "schedule", *DYNAMIC)
KNOWN_KEYS = {
    "model": MODEL_KEYS,
    "train_input": TRAIN_INPUT_KEYS,
    "optimizer": OPTIMIZER_KEYS,
    "runconfig": RUNCONFIG_KEYS,
    "sparsity": SPARSITY_KEYS,
}
IGNORED_SECTIONS = ("eval_input",)
"""Model Zoo sections that say nothing of a training step's model or numbers."""
IGNORED_KEYS = {
    "train_input": ("data_processor", "data_dir", "shuffle", "shuffle_seed", "shuffle_buffer",
                    "repeat", "num_workers", "prefetch_factor", "persistent_workers",
                    "use_worker_cache", "drop_last", "n_parallel_reads"),
    "model": ("mixed_precision", "fp16_type", "boundary_casting", "tf_summary", "loss_scaling",
              "embedding_initializer", "initializer", "output_layer_initializer",
              "initializer_range"),
    "optimizer": ("loss_scaling_factor", "initial_loss_scale", "steps_per_increase",
                  "min_loss_scale", "max_loss_scale", "log_summaries",
                  "disable_lr_steps_reset"),
    "runconfig": ("max_steps", "num_steps", "num_epochs", "log_steps", "checkpoint_steps",
                  "save_initial_checkpoint", "seed", "eval_frequency", "eval_steps",
                  "num_wgt_servers", "num_workers_per_csx", "mode", "model_dir",
                  "checkpoint_path", "precision_opt_level", "use_cs_grad_accum", "save_losses",
                  "log_input_summaries", "compile_only", "validate_only", "target_device"),
}  # fmt: skip
"""Model Zoo housekeeping keys, by section: where the data comes from, how a run logs and
checkpoints, how its loss is scaled and its weights are first drawn. cgc reads none of them
(its data, steps, checkpoints and ``--init-seed`` are the command's) and names them in one
warning; any other key it does not know is an error."""


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """A hint naming the choice closest to ``word``, if one is close."""
    close = difflib.get_close_matches(word, choices, n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def without_housekeeping(document: dict, source: str) -> dict:
    """``document`` without the Model Zoo's housekeeping (``IGNORED_SECTIONS``,
    ``IGNORED_KEYS``), which one ``CgcWarning`` lists; every section or key it does not know
    is one error that lists them all."""
    unknown, ignored = [], []
    kept: dict = {}
    for key, value in document.items():
        if key in IGNORED_SECTIONS:
            ignored.append(str(key))
        elif key not in SECTIONS:
            hint = did_you_mean(key, SECTIONS) if isinstance(key, str) else ""
            unknown.append(f"{key} (a section{hint.replace(' (', '; ').rstrip(')')})")
        elif isinstance(value, dict):
            skipped = IGNORED_KEYS.get(key, ())
            for inner in value:
                if inner in skipped:
                    ignored.append(f"{key}.{inner}")
                elif inner not in KNOWN_KEYS[key]:
                    hint = did_you_mean(inner, KNOWN_KEYS[key]) if isinstance(inner, str) else ""
                    unknown.append(f"{key}.{inner}{hint}")
            kept[key] = {k: v for k, v in value.items() if k not in skipped}
        else:
            kept[key] = value
    if unknown:
        count = f"{len(unknown)} unknown keys" if len(unknown) > 1 else "unknown key"
        raise CgcError(f"{source}: {count}: {', '.join(unknown)}")
    if ignored:
        warnings.warn(
            f"{source}: ignoring the Model Zoo's housekeeping: {', '.join(ignored)}",
            CgcWarning,
            stacklevel=2,
        )
    return kept
