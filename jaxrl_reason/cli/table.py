"""The table of `jaxrl-reason` commands: each command's one-line summary, its flags, which of
them are paths, and the function that runs it (`jaxrl_reason.cli.commands.<function>`).

A flag is defined by the group it belongs to (`_FLAG_GROUPS`); a command lists its groups.
Every flag has a one-line help text, shown by `jaxrl-reason CMD --help`.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

from absl import flags
from ml_collections import config_flags

Define = Callable[[flags.FlagValues], None]


@dataclasses.dataclass(frozen=True)
class Command:
    """One `jaxrl-reason` command.

    name: what the user types; summary: one line for `jaxrl-reason --help`; usage: the
    synopsis; groups: names of the flag groups it takes (`_FLAG_GROUPS`); required: flags that
    must be given; function: the name of its function in `jaxrl_reason.cli.commands`.
    """
    name: str
    summary: str
    usage: str
    groups: tuple[str, ...]
    required: tuple[str, ...] = ()
    function: str = ""

    @property
    def function_name(self) -> str:
        return self.function or self.name.replace("-", "_")


# Flags whose values are local paths (or gs:// and other URIs, kept as they are): the CLI
# makes local ones absolute before any command sees them (orbax and the subprocesses of a
# run need absolute paths; a resumed run may start from another directory).
PATH_FLAGS = ("workdir", "checkpoint", "init_checkpoint", "out", "data", "eval_data", "model",
              "a", "b")


def _config(fv, argv):
    # sys_argv: ml_collections finds the `--config.a.b=v` overrides in it (by default it
    # reads sys.argv, which is wrong when `main` is called with its own argv).
    config_flags.DEFINE_config_file(
        "config", None, "experiment config file (`path.py` or `path.py:smoke`); override "
        "any field with --config.a.b=value", flag_values=fv, lock_config=True,
        sys_argv=list(argv))


def _workdir(fv, argv):
    flags.DEFINE_string("workdir", None, "run directory, local or gs:// (default "
                        "runs/<config.name>)", flag_values=fv)


def _resume(fv, argv):
    flags.DEFINE_bool("resume", False, "continue the run in --workdir from its checkpoints",
                      flag_values=fv)


def _init_checkpoint(fv, argv):
    flags.DEFINE_string("init_checkpoint", None, "start RL from this checkpoint (run workdir "
                        "or phase directory) instead of a cold-start SFT", flag_values=fv)


def _checkpoint(fv, argv):
    flags.DEFINE_string("checkpoint", None, "run workdir or phase checkpoint directory",
                        flag_values=fv)


def _sample(fv, argv):
    flags.DEFINE_string("model", None, "a Hugging Face model directory (config.json, "
                        "*.safetensors, tokenizer files) instead of --checkpoint",
                        flag_values=fv)
    flags.DEFINE_bool("chat", False, "wrap the prompt in the model's chat template "
                      "(--model only)", flag_values=fv)
    flags.DEFINE_bool("tools", True, "run the tools a checkpoint was trained with; "
                      "--notools decodes plainly", flag_values=fv)
    flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                      "dtype the --model weights are loaded in", flag_values=fv)
    flags.DEFINE_string("prompt", None, "prompt text", flag_values=fv)
    flags.DEFINE_bool("greedy", False, "argmax decoding instead of sampling", flag_values=fv)
    flags.DEFINE_integer("max_new_tokens", 128, "completion budget in tokens", flag_values=fv)
    flags.DEFINE_float("temperature", 1.0, "sampling temperature", flag_values=fv)
    flags.DEFINE_integer("num_samples", 1, "completions to print", flag_values=fv)
    flags.DEFINE_integer("seed", 0, "sampling seed", flag_values=fv)


def _export(fv, argv):
    flags.DEFINE_string("out", None, "output Hugging Face model directory", flag_values=fv)
    flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "dtype of the written tensors "
                      "(default: the parameters' own)", flag_values=fv)
    flags.DEFINE_integer("max_shard_bytes", 5_000_000_000, "split the safetensors files "
                         "above this size", flag_values=fv)


def _eval_common(fv, argv):
    flags.DEFINE_string("data", None, "JSONL or parquet file (or directory / glob) of "
                        "problems to evaluate on instead of the task's held-out sets",
                        flag_values=fv)
    flags.DEFINE_enum("data_preset", "generic", ["generic", "gsm8k", "math"],
                      "field mapping of --data: generic {prompt, answer}, GSM8K {question, "
                      "answer '#### N'}, MATH {problem, solution \\boxed{}}", flag_values=fv)
    flags.DEFINE_string("seeds", None, "sampling seeds: a count N (seeds 0..N-1) or a list "
                        "a,b,c (default: the config's eval.seeds)", flag_values=fv)
    flags.DEFINE_integer("num_samples", None, "samples per problem (default: "
                         "eval.num_samples)", flag_values=fv)
    flags.DEFINE_integer("num_problems", None, "problems per held-out set (default: "
                         "eval.num_problems)", flag_values=fv)


def _eval_out(fv, argv):
    flags.DEFINE_string("out", None, "JSON report path (default <checkpoint>/eval.json)",
                        flag_values=fv)


def _compare(fv, argv):
    flags.DEFINE_string("a", None, "checkpoint A, the baseline: run workdir or phase "
                        "checkpoint directory", flag_values=fv)
    flags.DEFINE_string("b", None, "checkpoint B, tested against A (B - A)", flag_values=fv)
    flags.DEFINE_integer("resamples", 10_000, "paired bootstrap resamples", flag_values=fv)
    flags.DEFINE_string("out", None, "JSON report path (default <B checkpoint>/compare.json; "
                        "the pass@k plot goes next to it)", flag_values=fv)


def _distill(fv, argv):
    """Unset flags fall back to config.distill, then `distill.DistillSettings`."""
    flags.DEFINE_integer("num_prompts", None, "training prompts to sample (default 256)",
                         flag_values=fv)
    flags.DEFINE_integer("num_samples", None, "completions per prompt (default 8)",
                         flag_values=fv)
    flags.DEFINE_enum("keep", None, ["all", "shortest"], "keep every verified completion, or "
                      "the shortest per prompt (long2short)", flag_values=fv)
    flags.DEFINE_integer("max_new_tokens", None, "teacher token budget (default "
                         "rl.max_new_tokens)", flag_values=fv)
    flags.DEFINE_float("temperature", None, "teacher sampling temperature (default 1.0)",
                       flag_values=fv)
    flags.DEFINE_string("verifiers", None, "comma-separated rewards a completion must pass "
                        "(default: the task's verifier)", flag_values=fv)
    flags.DEFINE_bool("verify", None, "keep only verified completions (default true; false: "
                      "every sample, sequence-level distillation)", flag_values=fv)
    flags.DEFINE_bool("drop_truncated", None, "drop completions that hit the budget "
                      "(default true)", flag_values=fv)
    flags.DEFINE_string("student_preset", None, "the student's model preset (default: the "
                        "teacher's model)", flag_values=fv)
    flags.DEFINE_enum("student_init", None, ["random", "teacher"], "start the student from a "
                      "random init (default) or from the teacher's weights", flag_values=fv)
    flags.DEFINE_integer("student_steps", None, "student SFT steps (default sft.steps)",
                         flag_values=fv)
    flags.DEFINE_float("student_learning_rate", None, "student peak SFT rate (default "
                       "sft.learning_rate)", flag_values=fv)
    flags.DEFINE_integer("seed", None, "sampling seed (default 0)", flag_values=fv)


def _reward_model(fv, argv):
    """Unset training flags fall back to config.reward_model, then `RewardTrainConfig`."""
    flags.DEFINE_string("data", None, "JSONL of preference pairs {prompt, chosen, rejected"
                        "[, margin, id]}", flag_values=fv)
    flags.DEFINE_string("eval_data", None, "JSONL of held-out pairs (default: hold out "
                        "--eval_fraction of --data's prompts)", flag_values=fv)
    flags.DEFINE_float("eval_fraction", 0.1, "fraction of --data's prompts held out",
                       flag_values=fv)
    flags.DEFINE_string("init_checkpoint", None, "copy the trunk, model shape and tokenizer "
                        "from this policy/SFT checkpoint (default: a random trunk)",
                        flag_values=fv)
    flags.DEFINE_integer("steps", None, "optimizer steps (default 100)", flag_values=fv)
    flags.DEFINE_integer("batch_size", None, "pairs per step (default 16)", flag_values=fv)
    flags.DEFINE_float("learning_rate", None, "peak AdamW rate (default 1e-3)",
                       flag_values=fv)
    flags.DEFINE_integer("max_response_length", None, "longest response in tokens "
                         "(default 128)", flag_values=fv)


def _pipeline(fv, argv):
    flags.DEFINE_string("until", None, "stop after this stage (its name in "
                        "config.pipeline.stages); rerun without it to continue",
                        flag_values=fv)


def _plan(fv, argv):
    flags.DEFINE_string("topology", None, "TPU slice, e.g. v5e:2x4, v5p:2x2x1, v6e:2x4",
                        flag_values=fv)
    flags.DEFINE_float("kv_budget_gib", None, "with rl.max_num_seqs > 0: KV-cache budget per "
                       "chip, GiB, for the sampler's long-tail time (default: the HBM left "
                       "beside the sampler's weights and resident arrays)", flag_values=fv)
    flags.DEFINE_bool("choose_context", True, "when the log-prob pass or the update does not "
                      "fit, shard the sequence over 2, 4, ... chips (mesh.context) and report "
                      "the smallest size that fits", flag_values=fv)


def _multihost(fv, argv):
    flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() even when "
                      "config.distributed.enabled is 'auto' and detects one machine",
                      flag_values=fv)


_FLAG_GROUPS: dict[str, Callable[[flags.FlagValues, Sequence[str]], None]] = {
    "config": _config, "workdir": _workdir, "resume": _resume,
    "init_checkpoint": _init_checkpoint, "checkpoint": _checkpoint, "sample": _sample,
    "export": _export, "eval": _eval_common, "eval_out": _eval_out, "compare": _compare,
    "distill": _distill, "reward_model": _reward_model, "pipeline": _pipeline, "plan": _plan,
    "multihost": _multihost,
}

_RUN = ("config", "workdir")

COMMANDS: dict[str, Command] = {c.name: c for c in (
    Command("train", "cold-start SFT, then RL, then evaluation (or RL from "
            "--init_checkpoint)", "--config FILE[:ARG] [--workdir DIR] [--resume] "
            "[--init_checkpoint DIR]", (*_RUN, "resume", "init_checkpoint", "multihost"),
            ("config",)),
    Command("sft", "the cold-start SFT phase alone", "--config FILE[:ARG] [--workdir DIR] "
            "[--resume]", (*_RUN, "resume", "multihost"), ("config",)),
    Command("eval", "evaluate a checkpoint: pass@1, maj@k, pass@k with intervals",
            "--checkpoint DIR [--config FILE] [--data FILE [--data_preset P]] [--seeds N] "
            "[--num_samples N] [--num_problems N] [--out FILE]",
            (*_RUN, "checkpoint", "eval", "eval_out", "multihost"), ("checkpoint",)),
    Command("compare", "paired comparison of two checkpoints on the same problems and seeds",
            "--a DIR --b DIR [--seeds N] [--num_samples N] [--data FILE] [--out FILE]",
            (*_RUN, "eval", "compare", "multihost"), ("a", "b")),
    Command("sample", "print completions of a checkpoint or a Hugging Face model",
            "(--checkpoint DIR | --model HF_DIR) --prompt TEXT [--greedy] "
            "[--max_new_tokens N]", (*_RUN, "checkpoint", "sample", "multihost"),
            ("prompt",)),
    Command("export", "write a checkpoint as a Hugging Face model directory",
            "--checkpoint DIR --out HF_DIR [--dtype bfloat16]",
            (*_RUN, "checkpoint", "export", "multihost"), ("checkpoint", "out")),
    Command("plan", "compile a config's programs for a TPU slice ahead of time (needs "
            "libtpu) and report memory", "--config FILE --topology v5e:2x4",
            ("config", "workdir", "plan"), ("config", "topology")),
    Command("distill", "rejection-sampling distillation: verified teacher samples, then "
            "student SFT", "--checkpoint TEACHER_DIR [--config FILE] [--workdir DIR] ...",
            (*_RUN, "checkpoint", "distill", "multihost"), ("checkpoint",)),
    Command("reward-model", "train a Bradley-Terry reward model on preference pairs",
            "--config FILE --data pairs.jsonl [--workdir DIR] [--eval_data FILE]",
            (*_RUN, "reward_model", "multihost"), ("config", "data")),
    Command("pipeline", "the R1 recipe's stages in order, resumable stage by stage",
            "--config FILE [--workdir DIR] [--until STAGE]",
            (*_RUN, "pipeline", "multihost"), ("config",)),
)}


def flag_values(command: Command, argv: Sequence[str]) -> flags.FlagValues:
    """The flags of `command`, defined on a fresh FlagValues (`argv`: the full argument list,
    which the config flag reads its overrides from)."""
    fv = flags.FlagValues()
    for group in command.groups:
        _FLAG_GROUPS[group](fv, argv)
    return fv
