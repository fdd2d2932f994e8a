"""Command line: `jaxrl-reason {train,sft,eval,sample,plan} --config FILE[:ARG] [--config.a.b=v ...]`.

    jaxrl-reason train  --config configs/arith_grpo.py [--workdir DIR] [--resume]
                        [--init_checkpoint DIR]          # skip the cold start
    jaxrl-reason sft    --config configs/arith_grpo.py [--workdir DIR]
    jaxrl-reason eval   --checkpoint DIR [--config FILE] [--data FILE.jsonl|.parquet
                        [--data_preset generic|gsm8k|math]] [--seeds N|a,b,c]
                        [--num_samples N] [--num_problems N] [--out FILE]
    jaxrl-reason compare --a DIR --b DIR [--seeds N|a,b,c] [--num_samples N]
                        [--num_problems N] [--data FILE] [--resamples R] [--out FILE]
    jaxrl-reason sample --checkpoint DIR --prompt TEXT [--greedy] [--max-new-tokens N]
    jaxrl-reason sample --model HF_DIR --prompt TEXT [--chat] [--greedy] [--max-new-tokens N]
    jaxrl-reason export --checkpoint DIR --out HF_DIR [--dtype bfloat16]
    jaxrl-reason plan   --config configs/arith_grpo.py --topology v5e:2x4   # needs libtpu
    jaxrl-reason distill --checkpoint TEACHER_DIR [--config FILE] [--workdir DIR]
                        [--num_samples N] [--keep all|shortest] [--student_preset NAME] ...
    jaxrl-reason reward-model --config FILE --data pairs.jsonl [--workdir DIR]
                        [--eval_data FILE | --eval_fraction F] [--init_checkpoint DIR]
    jaxrl-reason pipeline --config configs/r1_pipeline.py [--workdir DIR] [--until STAGE]

Configs are `get_config()` files (ml_collections), locked after parsing; an override of a key
that does not exist is an error. Flags may be spelled with dashes or underscores. Bad input
ends with a one-line message; set JAXRL_REASON_DEBUG=1 to see the traceback instead.

Multi-host: run the same command on every host. Before anything else touches JAX, the CLI
calls `jax.distributed.initialize` as `config.distributed` says (default "auto": on Cloud
TPU VMs and pods, or when a coordinator address / process count is configured; see
`jaxrl_reason.distributed`); `--multihost` forces it (for eval/sample without a config,
the `distributed` settings come from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
JAX_PROCESS_ID).
"""

from __future__ import annotations

import os
import sys
from typing import Sequence

from absl import flags
from ml_collections import config_flags

COMMANDS = ("train", "sft", "eval", "compare", "sample", "plan", "export", "distill",
            "reward-model", "pipeline")


def _flag_values(command: str, argv: Sequence[str]) -> flags.FlagValues:
    fv = flags.FlagValues()
    needs_config = command in ("train", "sft", "plan", "reward-model", "pipeline")
    # sys_argv: ml_collections finds the `--config.a.b=v` overrides in it (by default it
    # reads sys.argv, which is wrong when `main` is called with its own argv).
    config_flags.DEFINE_config_file(
        "config", None, "experiment config file (`path.py` or `path.py:smoke`)",
        flag_values=fv, lock_config=True, sys_argv=list(argv))
    flags.DEFINE_string("workdir", None, "run directory (default runs/<config.name>)",
                        flag_values=fv)
    if command in ("train", "sft"):
        flags.DEFINE_bool("resume", False, "continue from the workdir's checkpoints",
                          flag_values=fv)
    if command == "train":
        flags.DEFINE_string("init_checkpoint", None,
                            "start RL from this checkpoint instead of a cold-start SFT",
                            flag_values=fv)
    if command in ("eval", "export"):
        flags.DEFINE_string("checkpoint", None, "run workdir or phase checkpoint directory",
                            flag_values=fv, required=True)
    if command == "sample":
        flags.DEFINE_string("checkpoint", None, "run workdir or phase checkpoint directory "
                            "(or --model)", flag_values=fv)
        flags.DEFINE_string("model", None, "a Hugging Face model directory (config.json, "
                            "*.safetensors, tokenizer files) instead of --checkpoint",
                            flag_values=fv)
        flags.DEFINE_bool("chat", False, "wrap the prompt in the model's chat template "
                          "(--model only)", flag_values=fv)
        flags.DEFINE_bool("tools", True, "run the tools a checkpoint was trained with "
                          "(config.tools): decoding pauses at each call and the result is "
                          "written in place (--notools: plain decoding)", flag_values=fv)
        flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                          "dtype the --model weights are loaded in", flag_values=fv)
    if command == "export":
        flags.DEFINE_string("out", None, "output Hugging Face model directory",
                            flag_values=fv, required=True)
        flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "dtype of the written "
                          "tensors (default: the params' own)", flag_values=fv)
        flags.DEFINE_integer("max_shard_bytes", 5_000_000_000, "split the safetensors files "
                             "above this size", flag_values=fv)
    if command in ("eval", "compare"):
        flags.DEFINE_string("data", None, "JSONL or parquet file (or directory / glob) of "
                            "problems to evaluate on instead of the task's held-out sets",
                            flag_values=fv)
        flags.DEFINE_enum("data_preset", "generic", ["generic", "gsm8k", "math"],
                          "field mapping of --data: generic {prompt, answer}, GSM8K "
                          "{question, answer '#### N'}, MATH {problem, solution \\boxed{}}",
                          flag_values=fv)
        flags.DEFINE_string("seeds", None, "sampling seeds: a count N (seeds 0..N-1) or a "
                            "list a,b,c (default: the config's eval.seeds)", flag_values=fv)
        flags.DEFINE_integer("num_samples", None, "samples per problem, n (default: "
                             "eval.num_samples)", flag_values=fv)
        flags.DEFINE_integer("num_problems", None, "problems per held-out set (default: "
                             "eval.num_problems)", flag_values=fv)
    if command == "eval":
        flags.DEFINE_string("out", None, "JSON report path (default <checkpoint>/eval.json)",
                            flag_values=fv)
    if command == "compare":
        flags.DEFINE_string("a", None, "checkpoint A (the baseline): run workdir or phase "
                            "checkpoint directory", flag_values=fv, required=True)
        flags.DEFINE_string("b", None, "checkpoint B, tested against A (B - A)",
                            flag_values=fv, required=True)
        flags.DEFINE_integer("resamples", 10_000, "paired bootstrap resamples",
                             flag_values=fv)
        flags.DEFINE_string("out", None, "JSON report path (default <B checkpoint>/"
                            "compare.json; the pass@k plot goes next to it)", flag_values=fv)
    if command == "distill":
        _distill_flags(fv)
    if command == "reward-model":
        _reward_model_flags(fv)
    if command == "pipeline":
        flags.DEFINE_string("until", None, "stop after this stage (its name in "
                            "config.pipeline.stages); rerun without it to continue",
                            flag_values=fv)
    if command == "plan":
        flags.DEFINE_string("topology", None, "TPU slice, e.g. v5e:2x4, v5p:2x2x1, v6e:2x4",
                            flag_values=fv, required=True)
    if command == "sample":
        flags.DEFINE_string("prompt", None, "prompt text", flag_values=fv, required=True)
        flags.DEFINE_bool("greedy", False, "argmax decoding", flag_values=fv)
        flags.DEFINE_integer("max_new_tokens", 128, "completion budget", flag_values=fv)
        flags.DEFINE_float("temperature", 1.0, "sampling temperature", flag_values=fv)
        flags.DEFINE_integer("num_samples", 1, "completions to print", flag_values=fv)
        flags.DEFINE_integer("seed", 0, "sampling seed", flag_values=fv)
    if command != "plan":
        flags.DEFINE_bool("multihost", False, "call jax.distributed.initialize() even when "
                          "config.distributed.enabled is 'auto' and detects one machine",
                          flag_values=fv)
    if needs_config:
        flags.mark_flag_as_required("config", flag_values=fv)
    return fv


def _distill_flags(fv: flags.FlagValues) -> None:
    """Flags of `distill`; unset ones fall back to config.distill, then the defaults of
    `distill.DistillSettings`."""
    flags.DEFINE_string("checkpoint", None, "the teacher: run workdir or phase checkpoint "
                        "directory", flag_values=fv, required=True)
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
    flags.DEFINE_bool("verify", None, "keep only verified completions (default true; "
                      "false: every sample, sequence-level distillation)", flag_values=fv)
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


def _reward_model_flags(fv: flags.FlagValues) -> None:
    """Flags of `reward-model`; unset training fields fall back to config.reward_model,
    then the defaults of `reward_model.RewardTrainConfig`."""
    flags.DEFINE_string("data", None, "JSONL of preference pairs {prompt, chosen, rejected"
                        "[, margin, id]}", flag_values=fv, required=True)
    flags.DEFINE_string("eval_data", None, "JSONL of held-out pairs (default: hold out "
                        "--eval_fraction of --data's prompts)", flag_values=fv)
    flags.DEFINE_float("eval_fraction", 0.1, "fraction of --data's prompts held out",
                       flag_values=fv)
    flags.DEFINE_string("init_checkpoint", None, "copy the trunk, model shape and tokenizer "
                        "from this policy/SFT checkpoint (InstructGPT); default: a random "
                        "trunk of the config's model and tokenizer", flag_values=fv)
    flags.DEFINE_integer("steps", None, "optimizer steps (default 100)", flag_values=fv)
    flags.DEFINE_integer("batch_size", None, "pairs per step (default 16)", flag_values=fv)
    flags.DEFINE_float("learning_rate", None, "peak AdamW rate (default 1e-3)",
                       flag_values=fv)
    flags.DEFINE_integer("max_response_length", None, "longest response in tokens "
                         "(default 128)", flag_values=fv)


def _normalize(argv: Sequence[str]) -> list[str]:
    """`--max-new-tokens=3` -> `--max_new_tokens=3` (config overrides are left alone)."""
    out = []
    for arg in argv:
        if arg.startswith("--") and not arg.startswith("--config"):
            name, eq, value = arg[2:].partition("=")
            arg = "--" + name.replace("-", "_") + eq + value
        out.append(arg)
    return out


def _usage() -> str:
    return __doc__.split("\n\n")[1] if __doc__ else "jaxrl-reason COMMAND ..."


def _error_text(e: Exception, argv: Sequence[str]) -> str:
    """A one-line reason for a flag error (no embedded tracebacks, unknown keys named)."""
    missing = e if isinstance(e, KeyError) else e.__context__  # AttributeError wraps it
    if isinstance(missing, KeyError):
        key = str(missing.args[0]).strip("'\"") if missing.args else ""
        named = [a.split("=", 1)[0] for a in argv
                 if a.startswith("--config.") and key in a.split("=", 1)[0].split(".")]
        return (f"unknown config key {key!r} in {', '.join(named) or 'a --config override'} "
                f"(overrides must name existing keys)")
    text = str(e)
    if isinstance(e, OSError):
        text = "cannot load the config file: " + " ".join(text.split())
    elif "Traceback (most recent call last)" in text:
        head = text.split("Error whilst parsing", 1)[0].strip()
        last = [line for line in text.strip().splitlines() if line.strip()][-1]
        text = f"{head} cannot load the config: {last}"
    return text


def parse(argv: Sequence[str]):
    """(command, parsed FlagValues) from a full argv; SystemExit(2) with a message on error."""
    if len(argv) < 2 or argv[1] not in COMMANDS:
        given = argv[1] if len(argv) > 1 else "nothing"
        sys.stderr.write(f"jaxrl-reason: expected a command in {COMMANDS}, got {given}\n\n"
                         f"{_usage()}\n")
        raise SystemExit(2)
    command = argv[1]
    args = [f"jaxrl-reason {command}"] + _normalize(argv[2:])
    fv = _flag_values(command, args)
    try:
        fv(args)
        if fv.config is not None:
            fv.config.get("name")  # a config file that failed to load raises only on access
    except (flags.Error, KeyError, ValueError, AttributeError, TypeError, OSError) as e:
        sys.stderr.write(f"jaxrl-reason {command}: {_error_text(e, args)}\n")
        raise SystemExit(2) from None
    return command, fv


def _distributed_block(fv: flags.FlagValues) -> dict:
    """The config's `distributed` block as a dict (empty without a config), `--multihost`
    turning it on."""
    config = fv.config
    block = config.get("distributed") if config is not None else None
    block = dict(block.to_dict() if hasattr(block, "to_dict") else block or {})
    if fv.multihost:
        block["enabled"] = True
    return block


def init_distributed(command: str, fv: flags.FlagValues) -> None:
    """`jax.distributed.initialize` per the config's `distributed` block, the environment and
    `--multihost` (never for `plan`, which only compiles). Must run before any JAX call."""
    if command == "plan":
        return
    from jaxrl_reason import distributed
    distributed.initialize(_distributed_block(fv))


def init_cpu_devices(command: str, fv: flags.FlagValues) -> int | None:
    """Splits a CPU host into `config.cpu_devices` XLA devices (see `jaxrl_reason.cpu_devices`)
    before JAX starts; returns the count set, or None (no config, `plan`, or the environment
    chose). Must run before any JAX call, and before `init_distributed` decides the process
    count (auto gives 1 in a multi-process job)."""
    config = fv.config
    if command == "plan" or config is None or "cpu_devices" not in config:
        return None
    from jaxrl_reason import cpu_devices, distributed, validation
    multi = distributed.decide(distributed.settings(_distributed_block(fv)))[0]
    count = cpu_devices.resolve(config.cpu_devices, cores=cpu_devices.usable_cores(),
                                fits=lambda n: validation.fits_devices(config, n),
                                multi_process=multi)  # a bad value is an error either way
    if config.cpu_devices == 0 and cpu_devices.started():
        return None  # auto in a process where JAX already runs: keep its devices
    return count if cpu_devices.apply(count) else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    command, fv = parse(argv)
    # Imported after parsing so that `--help` and flag errors are instant.
    from jaxrl_reason.reliability import GracefulStop, NumericError, Preempted
    try:
        init_cpu_devices(command, fv)  # before any other JAX call
        init_distributed(command, fv)
    except ValueError as e:
        sys.stderr.write(f"jaxrl-reason {command}: error: {e}\n")
        return 1
    from jaxrl_reason import commands
    try:
        with GracefulStop():  # SIGTERM/SIGINT: checkpoint at the next step, then exit 0
            return getattr(commands, command.replace("-", "_"))(fv)
    except Preempted as e:
        print(f"jaxrl-reason {command}: {e}", flush=True)
        return 0
    except (ValueError, FileNotFoundError, OSError, NumericError) as e:
        if os.environ.get("JAXRL_REASON_DEBUG"):
            raise  # the full traceback, for bugs rather than bad input
        sys.stderr.write(f"jaxrl-reason {command}: error: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
