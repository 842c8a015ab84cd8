"""Bad input never costs work, data or a silent wrong answer: one table, every argument of every
subcommand.

Each row is (command, parameter it covers, argv, environment, expected message fragment, time
bound, exit status). Every row must exit with status 2 within its bound, print exactly ONE line
on stderr containing the fragment and no traceback, and leave no run folder behind ($LAB_RUNS_DIR
is a fresh folder). Cheap rows call ``lab.cli.main`` in this process (imports warmed once, so the
bound measures the checks, not Python's start-up); the rows that used to end in a traceback run
the real ``lab`` in parallel subprocesses, as does the Ctrl-C test. ``test_every_argument_has_a_row``
fails when a subcommand gains an argument without a bad-input row here.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lab import cli

ROOT = Path(__file__).resolve().parents[1]
NB02 = "02_tosca_sparsity_orthogonality"


@dataclass(frozen=True)
class Row:
    command: str              # "tosca", "aware finetune", ... ("" = lab itself)
    param: str                # the argument it covers: "--lr", "extra", "(none)", or "$ENV" for the environment
    argv: tuple[str, ...]     # after the command; {file} {dir} ... are filled in from the sandbox
    fragment: str             # expected in the one-line message
    env: dict = field(default_factory=dict)
    bound: float = 5.0        # seconds
    code: int = 2
    sub: bool = False         # run the real `lab` in a subprocess
    no_cuda: bool = False     # only bad where CUDA is missing

    @property
    def id(self) -> str:
        return f"{self.command or 'lab'}:{' '.join(self.argv)}{' ' + str(self.env) if self.env else ''}"


def R(command, param, argv, fragment, **kw) -> Row:
    return Row(command, param, tuple(argv), fragment, **kw)


AWARE_ACTIONS = ("profile", "finetune", "ablate", "tune")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]




def _aware_common(action: str) -> list[Row]:
    c = f"aware {action}"
    return [
        R(c, "--size", ["--size", "huge"], "argument --size: invalid choice"),
        R(c, "--cache-dir", ["--cache-dir", "{file}"], "--cache-dir {file}: is a file, not a folder"),
        R(c, "--quiet", ["--quiet=1"], "ignored explicit argument"),
        R(c, "--device", ["--device", "foo"], "--device foo: must be cpu, cuda or cuda:N"),
        R(c, "--steps", ["--steps", "0"], "--steps 0: must be an integer >= 1"),
        R(c, "--lr", ["--lr", "nan"], "--lr nan: must be a finite number > 0"),
        R(c, "--lr-aware", ["--lr-aware", "inf"], "--lr-aware inf: must be a finite number > 0"),
        R(c, "--lr-projector", ["--lr-projector", "0"], "--lr-projector 0.0: must be a finite number > 0"),
        R(c, "--lr-adapter", ["--lr-adapter", "-1"], "--lr-adapter -1.0: must be a finite number > 0"),
        R(c, "--model", ["--model", "{file}"], "--model {file}: is a file; give a LLaVA checkpoint folder"),
        R(c, "--dtype", ["--dtype", "fp8"], "argument --dtype: invalid choice"),
        R(c, "--batch-size", ["--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),
        R(c, "--n-probe", ["--n-probe", "321"], "--n-probe 321: the text probe has 320 questions"),
        R(c, "--n-easy-eval", ["--n-easy-eval", "9674"], "--n-easy-eval 9674: easy-VQA has 9673 test questions"),
        R(c, "--n-eval", ["--n-eval", "0"], "--n-eval 0: must be an integer >= 1"),
    ]


ROWS: list[Row] = [
    # lab itself and the listing commands
    R("", "(none)", ["--bogus"], "lab: error: unrecognized arguments: --bogus"),
    R("", "(none)", ["nope"], "argument COMMAND: invalid choice: 'nope'"),
    R("backbones", "(none)", ["--bogus"], "unrecognized arguments: --bogus"),
    R("plugins", "(none)", ["--bogus"], "unrecognized arguments: --bogus"),
    R("datasets", "--root", ["--root", "{file}"], "--root {file}: is a file, not a folder"),
    R("datasets", "$LAB_DATA_DIR", [], "$LAB_DATA_DIR {file}: is a file", env={"LAB_DATA_DIR": "{file}"}),
    # lab features
    R("features", "--backbone", ["--backbone", "nope"], "unknown backbone 'nope'; valid backbones: efficientnet_lite0"),
    R("features", "--dataset", ["--dataset", "nope"], "unknown dataset 'nope'; valid datasets:"),
    R("features", "--resolution", ["--resolution", "0"], "--resolution 0: need 32..512 px"),
    R("features", "--resolution", ["--resolution", "abc"], "argument --resolution: invalid int value: 'abc'"),
    R("features", "--splits", ["--splits", "val"], "argument --splits: invalid choice: 'val'"),
    R("features", "--batch-size", ["--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),
    R("features", "--all-stages", ["--all-stages=yes"], "ignored explicit argument 'yes'"),
    R("features", "--precision", ["--precision", "fp16"], "argument --precision: invalid choice: 'fp16'"),
    R("features", "--cache-dir", ["--cache-dir", "{file}"], "--cache-dir {file}: is a file, not a folder", sub=True, bound=30),
    R("features", "--cache-dir", ["--cache-dir", "{unwritable}"], "--cache-dir {unwritable}: cannot write into"),
    R("features", "$LAB_CACHE_DIR", [], "$LAB_CACHE_DIR {file}: is a file", env={"LAB_CACHE_DIR": "{file}"}),
    R("features", "--weights", ["--weights", "{missing}"], "--weights {missing}: does not exist"),
    R("features", "--weights", ["--weights", "{dir}"], "--weights {dir}: is a folder; give a file"),
    R("features", "--weights", ["--weights", "{garbage}", "--splits", "test", "--cache-dir", "{dir}"],
      "is not a loadable weights file"),
    R("features", "--weights", ["--backbone", "vit_tiny_patch16_224", "--weights", "{garbage}"], "takes no weights"),
    R("features", "$LAB_VIT_B16_WEIGHTS", ["--backbone", "vit_base_patch16_224.augreg_in21k"],
      "$LAB_VIT_B16_WEIGHTS {dir}: is a folder", env={"LAB_VIT_B16_WEIGHTS": "{dir}"}),
    R("features", "--quiet", ["--quiet=1"], "ignored explicit argument '1'"),
    R("features", "--preprocess", ["--preprocess", "nope"], "argument --preprocess: invalid choice: 'nope'"),
    R("features", "--preprocess", ["--preprocess", "reference"],
      "--preprocess reference: it has one preprocessing, its own"),   # efficientnet_lite0
    R("features", "--device", ["--device", "foo"], "--device foo: must be cpu, cuda or cuda:N"),
    R("features", "--device", ["--device", "cuda"], "--device cuda: CUDA is not available on this machine",
      no_cuda=True),
    # lab tosca
    R("tosca", "--dataset", ["--dataset", "nope"], "unknown dataset 'nope'; valid datasets:"),
    R("tosca", "--dataset", ["--dataset", "cub200"], "cub200: no train/ and test/ folders", env={"LAB_DATA_DIR": "{dir}"}),
    R("tosca", "--backbone", ["--backbone", "nope"], "valid backbones:"),
    R("tosca", "--backbone", ["--backbone", "vit_base_patch16_224.augreg_in21k"], "or pass a file with --weights",
      env={"HF_HUB_OFFLINE": "1", "HF_HOME": "{dir}"}, sub=True, bound=30),   # no ViT weights anywhere
    R("tosca", "--resolution", ["--resolution", "0"], "--resolution 0: need 32..512 px"),
    R("tosca", "--weights", ["--weights", "{dir}"], "--weights {dir}: is a folder; give a file"),
    R("tosca", "--weights", ["--weights", "{garbage}"], "{garbage} is not a loadable weights file"),
    R("tosca", "--weights", ["--weights", "{pickle}"], "{pickle} is not a loadable weights file"),
    R("tosca", "$LAB_VIT_B16_WEIGHTS", ["--backbone", "vit_base_patch16_224.augreg_in21k"],
      "$LAB_VIT_B16_WEIGHTS {dir}: is a folder", env={"LAB_VIT_B16_WEIGHTS": "{dir}"}),
    R("tosca", "--preprocess", ["--preprocess", "nope"], "argument --preprocess: invalid choice: 'nope'"),
    R("tosca", "--preprocess", ["--preprocess", "timm"], "--preprocess timm: it has one preprocessing, its own"),
    R("tosca", "--init", ["--init", "-1"], "--init -1: must be an integer >= 0"),
    R("tosca", "--init", ["--init", "11"], "init=11 exceeds the 10 classes"),
    R("tosca", "--inc", ["--inc", "0"], "--inc 0: must be an integer >= 1"),
    R("tosca", "--seed", ["--seed", "-1"], "--seed -1: must be an integer >= 0"),
    R("tosca", "--method", ["--method", "nope"], "argument --method: invalid choice: 'nope'"),
    R("tosca", "--routing", ["--routing", "nope"], "argument --routing: invalid choice"),
    R("tosca", "--mode", ["--mode", "nope"], "argument --mode: invalid choice"),
    R("tosca", "--epochs", ["--epochs", "0"], "--epochs 0: must be an integer >= 1"),
    R("tosca", "--epochs", ["--epochs", "x"], "argument --epochs: invalid int value: 'x'"),
    R("tosca", "--batch-size", ["--batch-size", "0"], "--batch-size 0: must be an integer >= 1"),
    R("tosca", "--lr", ["--lr", "0", "--epochs", "2"], "--lr 0.0: must be a finite number > 0"),
    R("tosca", "--lr", ["--lr", "nan"], "--lr nan: must be a finite number > 0"),
    R("tosca", "--lr", ["--lr=-inf"], "--lr -inf: must be a finite number > 0"),
    R("tosca", "--l1", ["--l1", "nan"], "--l1 nan: must be a finite number >= 0"),
    R("tosca", "--l1", ["--l1", "-1"], "--l1 -1.0: must be a finite number >= 0"),
    R("tosca", "--ratio", ["--ratio", "0"], "--ratio 0: must be an integer >= 1"),
    R("tosca", "--ratio", ["--ratio", "5000"], "--ratio 5000: must be an integer >= 1 and <= 1280"),
    R("tosca", "--flow", ["--flow", "nope"], "argument --flow: invalid choice"),
    R("tosca", "--per-batch-size", ["--per-batch-size", "0"], "--per-batch-size 0: must be an integer >= 1"),
    R("tosca", "--device", ["--device", "foo"], "--device foo: must be cpu, cuda or cuda:N"),
    R("tosca", "--device", ["--device", "cuda:99"], "--device cuda:99:"),
    R("tosca", "--device", ["--device", "cuda"], "--device cuda: CUDA is not available on this machine", no_cuda=True),
    R("tosca", "--engine", ["--engine", "nope"], "argument --engine: invalid choice"),
    R("tosca", "--engine", ["--engine", "cuda_graph"], "--engine cuda_graph: needs --device cuda"),
    R("tosca", "--head-scale-param", ["--head-scale-param", "nope"], "argument --head-scale-param: invalid choice"),
    R("tosca", "--routings", ["--routings", "nope"], "argument --routings: invalid choice"),
    R("tosca", "--momentum", ["--momentum", "-1"], "--momentum -1.0: must be a finite number >= 0"),
    R("tosca", "--momentum", ["--momentum", "nan"], "--momentum nan: must be a finite number >= 0"),
    R("tosca", "--weight-decay", ["--weight-decay", "inf"], "--weight-decay inf: must be a finite number >= 0"),
    R("tosca", "--eta-min", ["--eta-min=-1e-3"], "--eta-min -0.001: must be a finite number >= 0"),
    R("tosca", "--head-scale", ["--head-scale", "0"], "--head-scale 0.0: must be a finite number > 0"),
    R("tosca", "--head-init", ["--head-init", "nope"], "argument --head-init: invalid choice"),
    R("tosca", "--luca-init", ["--luca-init", "nope"], "argument --luca-init: invalid choice"),
    R("tosca", "--threads", ["--threads", "-1"], "--threads -1: must be an integer >= 0"),
    R("tosca", "--runs-dir", ["--runs-dir", "{file}"], "--runs-dir {file}: {file} is a file, so the folder cannot be created",
      sub=True, bound=30),
    R("tosca", "--runs-dir", ["--runs-dir", "{unwritable}"], "--runs-dir {unwritable}: cannot write into"),
    R("tosca", "$LAB_RUNS_DIR", [], "$LAB_RUNS_DIR {file}: {file} is a file", env={"LAB_RUNS_DIR": "{file}"}),
    R("tosca", "--resume", ["--resume", "{file}"], "--resume {file}: is a file, not a folder", sub=True, bound=30),
    R("tosca", "--resume", ["--resume", "{dir}"], "--resume {dir}: is not a tosca run or sweep folder (no config.json"),
    R("tosca", "--seeds", ["--seeds", "1", "-2"], "--seeds -2: must be an integer >= 0"),
    R("tosca", "--seeds", ["--seeds", "1", "1"], "--seeds 1 1: lists a seed twice"),
    R("tosca", "--seeds", ["--seed", "1", "--seeds", "2", "3"], "argument --seeds: not allowed with argument --seed"),
    R("tosca", "--l1", ["--l1", "0", "0.0"], "--l1 0.0 0.0: lists a value twice"),
    R("tosca", "--l1", ["--l1", "0", "1e-3", "--method", "ncm"], "--l1 0.0 0.001: sweeps TOSCA's L1; method ncm has none"),
    R("tosca", "--mode", ["--seeds", "1", "2", "--mode", "augment"], "--mode augment: a sweep (--seeds, several --l1"),
    R("tosca", "--method", ["--l1", "0", "1e-3", "--method", "layerwise_adapter"], "--l1 0.0 0.001: sweeps TOSCA's L1"),
    R("tosca", "--method", ["--seeds", "1", "2", "--method", "layerwise_adapter"],
      "--method layerwise_adapter: runs the backbone; a sweep"),
    R("tosca", "--executor", ["--executor", "dask"], "argument --executor: invalid choice: 'dask'"),
    R("tosca", "--address", ["--address", "auto"], "--address auto: joins a Ray cluster: needs --executor ray"),
    R("tosca", "--address", ["--executor", "ray", "--address", " "], "--address ' ': give auto, HOST:PORT"),
    R("tosca", "--resume", ["--resume", "{missing}"], "--resume {missing}: does not exist"),
    R("tosca", "--resume", ["--resume", "{run_empty_lock}"], "unreadable lock {run_empty_lock}/.lock"),
    R("tosca", "--resume", ["--resume", "{run_garbage_lock}"], "remove it: rm {run_garbage_lock}/.lock"),
    R("tosca", "--resume", ["--resume", "{run_alive_lock}"], "is in use by process"),
    R("tosca", "--resume", ["--resume", "{run_other}", "--epochs", "2"],
      "--resume {run_other}: --epochs 2 contradicts the run's stored config (epochs 1); resume without it"),
    R("tosca", "--resume", ["--seeds", "5", "6", "--resume", "{run_other}"],
      "--resume {run_other}: --seeds 5 6 contradicts the run's stored config (seeds 1993)"),
    R("tosca", "--resume", ["--resume", "{sweep_other}", "--epochs", "9", "--seeds", "7", "8"],
      "--resume {sweep_other}: --epochs 9 --seeds 7 8 contradict the sweep's stored config (epochs 20, seeds 1993 1994)"),
    R("tosca", "--resume", ["--resume", "{sweep_other}", "--seed", "1993", "--l1", "0.1"],
      "--seed 1993 --l1 0.1 contradict the sweep's stored config (seeds 1993 1994, l1 0.0005)"),
    R("tosca", "--resume", ["--resume", "{run_list_config}"], "{run_list_config}/config.json: not a run config (a JSON array"),
    R("tosca", "--resume", ["--resume", "{run_null_config}"], "{run_null_config}/config.json: not a run config (a JSON null"),
    R("tosca", "--resume", ["--resume", "{run_newer_config}"],
      "{run_newer_config}/config.json: unknown field(s) from_the_future (written by a newer version"),
    R("tosca", "--resume", ["--resume", "{sweep_newer}"], "sweep.json: unknown field(s) from_the_future"),
    R("tosca", "--resume", ["--resume", "{sweep_list}"], "sweep.json: not a sweep manifest (a JSON list"),
    R("tosca", "--resume", ["--resume", "{run_fifo_lock}"], "has a lock {run_fifo_lock}/.lock that is a FIFO, not a regular file"),
    R("tosca", "--resume", ["--resume", "{run_foreign}"],
      "cannot resume {run_foreign}: {run_foreign}/modules/task000.safetensors belongs to another run (seed 5, task 0"),
    R("tosca", "--resume", ["--resume", "{run_moved}"],
      "{run_moved}/stages/stage001.json belongs to another run (seed 1993, task 0"),
    R("tosca", "--quiet", ["--quiet=1"], "ignored explicit argument"),
    # --track: a tracker's name (docs/tracking.md), from the flag or $LAB_TRACK
    *[R(c, "--track", ["--track", "wandb"], "argument --track: invalid choice: 'wandb'")
      for c in ("tosca", "aware finetune", "aware ablate", "aware study")],
    R("tosca", "$LAB_TRACK", [], "$LAB_TRACK wandb: must be one of mlflow, none", env={"LAB_TRACK": "wandb"}),
    # lab aware (the options every action shares, then each action's own)
    R("aware", "(none)", ["nope"], "argument ACTION: invalid choice: 'nope'"),
    *[row for action in AWARE_ACTIONS for row in _aware_common(action)],
    R("aware profile", "--calib", ["--calib", "nope"], "argument --calib: invalid choice"),
    R("aware profile", "--model", ["--model", "{dir}"], "--model {dir}: {dir} holds no config.json"),
    R("aware profile", "--model", ["--model", "{missing}"], "--model {missing}: no such folder"),
    R("aware finetune", "--model", ["--model", "llava-hf/llava-1.5-7b-hf"],
      "--model llava-hf/llava-1.5-7b-hf: not a local folder, not in the hub cache, and HF_HUB_OFFLINE is set",
      env={"HF_HUB_OFFLINE": "1", "HF_HOME": "{dir}"}),
    R("aware profile", "--n", ["--n", "0"], "--n 0: must be an integer >= 1"),
    R("aware profile", "--n", ["--size", "smoke", "--n", "65"], "--n 65: the smoke preset has 64 upstream"),
    R("aware profile", "--targets", ["--targets", "[bad("], "--targets [bad(: not a valid regular expression",
      sub=True, bound=30),
    R("aware profile", "--targets", ["--targets", "nomatch_xyz"], "--targets nomatch_xyz: matches no Linear layer",
      bound=3),
    R("aware profile", "--targets", ["--targets", ","], "give a preset"),
    R("aware profile", "--out", ["--out", "{dir}"], "--out {dir}: is a folder; give a file path", sub=True, bound=30),
    R("aware profile", "--out", ["--out", "{file}/x.safetensors"], "{file} is a file, so the folder cannot be created"),
    R("aware profile", "$LAB_RUNS_DIR", [], "$LAB_RUNS_DIR {unwritable}: cannot write into",
      env={"LAB_RUNS_DIR": "{unwritable}"}, sub=True, bound=30),
    R("aware finetune", "--lr", ["--size", "smoke", "--method", "full", "--lr", "nan"], "--lr nan: must be a finite"),
    R("aware finetune", "--lr-aware", ["--size", "smoke", "--lr-aware", "nan"], "--lr-aware nan: must be a finite"),
    R("aware finetune", "--method", ["--method", "nope"], "argument --method: invalid choice"),
    R("aware finetune", "--task", ["--task", "nope"], "argument --task: invalid choice"),
    R("aware finetune", "--rho", ["--rho", "1.5"], "--rho 1.5: must be a number in [0, 1]"),
    R("aware finetune", "--rho", ["--rho", "nan"], "--rho nan: must be a number in [0, 1]"),
    R("aware finetune", "--rule", ["--rule", "nope"], "argument --rule: invalid choice"),
    R("aware finetune", "--targets", ["--targets", "nomatch_xyz"], "--targets nomatch_xyz: matches no Linear layer",
      bound=3),
    R("aware finetune", "--calib", ["--calib", "nope"], "argument --calib: invalid choice"),
    R("aware finetune", "--seed", ["--seed", "-1"], "--seed -1: must be an integer >= 0"),
    R("aware finetune", "--save", ["--save", "{file}"], "--save {file}: is a file, not a folder", sub=True, bound=30),
    R("aware finetune", "--save", ["--save", "{unwritable}/model"], "cannot write into"),
    R("aware finetune", "--save", ["--model", "{run_other}", "--save", "{run_other}", "--replace"],
      "--save {run_other}: is (or holds, or is inside) the input checkpoint --model {run_other}"),
    R("aware finetune", "--save", ["--save", "{run_other}"],
      "--save {run_other}: is a folder that is not empty; give a new or empty folder, or --replace"),
    R("aware finetune", "--replace", ["--replace"], "--replace: applies to --save, which is not given"),
    R("aware ablate", "--seeds", ["--seeds", "-1"], "--seeds -1: must be an integer >= 0"),
    R("aware ablate", "--groups", ["--groups", "nope"], "argument --groups: invalid choice"),
    R("aware ablate", "--task", ["--task", "nope"], "argument --task: invalid choice"),
    R("aware ablate", "--rules", ["--rules", "nope"],
      "--rules nope: unknown AWARe rule; valid rules: activation-balanced, weight-norm, random"),
    R("aware ablate", "--rules", ["--rules", "activation-global"], "--rules activation-global: is the reference"),
    R("aware ablate", "--rules", ["--rules", "random", "random"], "--rules 'random random': lists random twice"),
    R("aware ablate", "--run-dir", ["--run-dir", "{file}"], "--run-dir {file}: is a file, not a folder"),
    R("aware tune", "--task", ["--task", "nope"], "argument --task: invalid choice"),
    R("aware tune", "--seeds", ["--seeds", "-3"], "--seeds -3: must be an integer >= 0"),
    R("aware tune", "--n-val", ["--n-val", "0"], "--n-val 0: must be an integer >= 1"),
    R("aware tune", "--n-val", ["--size", "smoke", "--n-val", "1000000"], "validation questions exist at --size smoke"),
    R("aware tune", "--grid", ["--grid", "full=nan"], "--grid full nan: must be a finite number > 0"),
    R("aware tune", "--grid", ["--grid", "aware=1e-4"], "must include 'full'"),
    R("aware tune", "--grid", ["--grid", "full=x"], "learning rates must be numbers"),
    R("aware tune", "--grid", ["--grid", "qlora=1e-4", "full=1e-5"], "tunable methods"),
    R("aware tune", "--run-dir", ["--run-dir", "{unwritable}"], "--run-dir {unwritable}: cannot write into"),
    *[row for action in ("ablate", "tune") for row in (
        R(f"aware {action}", "--executor", ["--executor", "dask"], "argument --executor: invalid choice: 'dask'"),
        R(f"aware {action}", "--address", ["--address", "auto"], "--address auto: joins a Ray cluster: needs --executor ray"),
        R(f"aware {action}", "--address", ["--executor", "ray", "--address", " "], "--address ' ': give auto, HOST:PORT"),
        R(f"aware {action}", "$WORLD_SIZE", [], "$WORLD_SIZE 2: one of several launched processes; only `lab aware "
          "finetune` runs under accelerate launch", env={"WORLD_SIZE": "2"}))],
    # a full output filesystem is found before the run (free space against $LAB_MIN_FREE_MB, and a write probe)
    R("tosca", "$LAB_MIN_FREE_MB", [], "MB free on the filesystem of", env={"LAB_MIN_FREE_MB": "1e11"}),
    R("tosca", "$LAB_MIN_FREE_MB", [], "a run needs at least 100,000,000,000 MB ($LAB_MIN_FREE_MB)",
      env={"LAB_MIN_FREE_MB": "1e11"}),
    R("tosca", "$LAB_MIN_FREE_MB", [], "$LAB_MIN_FREE_MB abc: must be a finite number >= 0", env={"LAB_MIN_FREE_MB": "abc"}),
    R("features", "$LAB_MIN_FREE_MB", ["--cache-dir", "{dir}"], "--cache-dir {dir}: only ",
      env={"LAB_MIN_FREE_MB": "1e11"}),
    R("features", "$LAB_MIN_FREE_MB", [], "$LAB_CACHE_DIR {dir}: only ", env={"LAB_MIN_FREE_MB": "1e11",
                                                                            "LAB_CACHE_DIR": "{dir}"}),
    R("report", "$LAB_MIN_FREE_MB", ["--out", "{dir}"], "--out {dir}: only ", env={"LAB_MIN_FREE_MB": "1e11"}),
    R("aware finetune", "$LAB_MIN_FREE_MB", ["--size", "smoke", "--cache-dir", "{dir}"], "--cache-dir {dir}: only ",
      env={"LAB_MIN_FREE_MB": "1e11"}),
    # a launched rank whose peers never come: one line after $LAB_DIST_TIMEOUT seconds, not a wait forever
    R("aware finetune", "$WORLD_SIZE", ["--size", "smoke"], "$WORLD_SIZE 2: one of 2 launched processes, but $RANK "
      "and $MASTER_ADDR are not set", env={"WORLD_SIZE": "2"}),
    R("aware finetune", "$WORLD_SIZE", ["--size", "smoke"],
      f"$WORLD_SIZE 2: rank 0 waited 2 s at 127.0.0.1:{{free_port}} and the other 1 process(es) did not join",
      env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "{free_port}",
           "LAB_DIST_TIMEOUT": "2"}, bound=20),
    R("aware finetune", "$LAB_DIST_TIMEOUT", ["--size", "smoke"], "$LAB_DIST_TIMEOUT abc: must be a finite number > 0",
      env={"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "127.0.0.1", "LAB_DIST_TIMEOUT": "abc"}),
    R("aware finetune", "$RANK", ["--size", "smoke"], "$RANK 5: must be an integer >= 0 and <= 1",
      env={"WORLD_SIZE": "2", "RANK": "5", "MASTER_ADDR": "127.0.0.1"}),
    R("aware study", "--out", ["--out", "{file}"], "--out {file}: is a file, not a folder"),
    R("aware study", "--preset", ["--preset", "huge"], "argument --preset: invalid choice"),
    R("aware study", "--status", ["--status=1"], "ignored explicit argument"),
    R("aware study", "--out", ["--preset", "smoke", "--out", "results/aware"],
      "--out results/aware: holds a study made with another configuration"),
    R("aware study", "--replace", ["--replace=1"], "ignored explicit argument"),
    R("aware study", "--add-rules", ["--add-rules", "random"],
      "--add-rules random: is in the study already (its rules: activation-balanced, weight-norm, random)"),
    R("aware study", "--add-rules", ["--add-rules", "activation-global"],
      "--add-rules activation-global: is the reference the rule group compares every rule with"),
    R("aware study", "--add-rules", ["--add-rules", "nope"], "--add-rules nope: unknown AWARe rule; valid rules: "),
    R("tosca study", "--out", ["--out", "results/tosca", "--seeds", "1993", "--epochs", "1"],
      "holds a study made with other settings"),
    R("tosca study", "--epochs", ["--epochs", "0"], "--epochs 0: must be an integer >= 1"),
    R("tosca study", "--inc", ["--inc", "0"], "--inc 0: must be an integer >= 1"),
    R("tosca study", "--flow-scenarios", ["--flow-scenarios", "nope"], "unknown dataset 'nope'; valid:"),
    R("tosca study", "--replace", ["--replace=1"], "ignored explicit argument"),
    R("tosca study", "--executor", ["--executor", "slurm"], "argument --executor: invalid choice"),
    R("tosca study", "--address", ["--address", "auto"], "--address auto: joins a Ray cluster: needs --executor ray"),
    R("tosca study", "--seeds", ["--seeds", "1993", "1993"], "lists a seed twice"),
    R("tosca study", "--headline-seeds", ["--headline-seeds", "7", "7"], "lists a seed twice"),
    R("tosca study", "--scenarios", ["--scenarios", "nope"], "unknown dataset 'nope'; valid:"),
    R("tosca study", "--baselines", ["--baselines", "nope"], "not a baseline; valid:"),
    R("tosca study", "--resolution", ["--resolution", "7"], "--resolution 7: must be an integer >= 32"),
    R("tosca study", "--out", ["--out", "{file}"], "--out {file}: is a file, not a folder"),
    R("aware study", "--tables-only", ["--tables-only=1"], "ignored explicit argument"),
    R("aware study", "--executor", ["--executor", "slurm"], "argument --executor: invalid choice"),
    R("aware study", "--address", ["--address", "auto"], "--address auto: joins a Ray cluster: needs --executor ray"),
    R("aware study", "--workers", ["--executor", "ray", "--workers", "0"], "--workers 0: must be an integer >= 1"),
    R("aware check", "--out", ["--out", "{dir}"], "holds no study runs"),
    R("aware check", "--preset", ["--preset", "huge"], "argument --preset: invalid choice"),
    R("aware check", "--run", ["--run", "nope", "--out", "{dir}"], "holds no study runs"),
    R("aware check", "--steps", ["--steps", "0"], "--steps 0:"),
    R("report", "--solutions", ["--solutions=1"], "ignored explicit argument"),
    R("tosca study", "--engine", ["--engine", "warp"], "invalid choice"),
    R("aware check", "--cache-dir", ["--cache-dir", "{file}"], "--cache-dir {file}: is a file, not a folder"),
    R("aware check", "--device", ["--device", "foo"], "--device foo: must be cpu, cuda or cuda:N"),
    R("aware check", "--quiet", ["--quiet=1"], "ignored explicit argument"),
    R("aware ablate", "--seeds", ["--seeds", "0", "0"], "--seeds '0 0': lists 0 twice"),
    R("aware tune", "--grid", ["--grid", "full=1e-5,1e-5"], "--grid full '1e-05 1e-05': lists 1e-05 twice"),
    R("aware study", "--cache-dir", ["--cache-dir", "{file}"], "--cache-dir {file}: is a file, not a folder"),
    R("aware study", "--device", ["--device", "foo"], "--device foo: must be cpu, cuda or cuda:N"),
    R("aware study", "--quiet", ["--quiet=1"], "ignored explicit argument"),
    # lab report
    R("report", "--only", ["--only", "nope"], "no notebook named ['nope']"),
    R("report", "--out", ["--out", "{file}"], "--out {file}: is a file, not a folder", sub=True, bound=30),
    R("report", "--out", ["--out", "{unwritable}"], "--out {unwritable}: cannot write into"),
    R("report", "--params", ["--params", "huge"], "argument --params: invalid choice"),
    R("report", "--parameter", ["-p", "seed=notanint", "--only", NB02],
      f'-p seed="notanint": must be an integer in {NB02}.ipynb'),
    R("report", "--parameter", ["-p", "datasets=mnist_5k", "--only", NB02], "must be a list of strings"),
    R("report", "--parameter", ["-p", "epochs=NaN", "--only", NB02], "must be a finite number"),
    R("report", "--parameter", ["-p", "nope=1", "--only", NB02], "unknown parameter(s) ['nope']"),
    R("report", "--parameter", ["-p", "3=4"], "expected NAME=VALUE"),
    R("report", "--notebooks", ["--notebooks", "{file}"], "--notebooks {file}: is a file, not a folder"),
    R("report", "--notebooks", ["--notebooks", "{dir}"], "no notebooks in"),
    R("report", "--no-png", ["--no-png=1"], "ignored explicit argument"),
    R("report", "--kernel", ["--kernel", "nope"], "--kernel nope: no such Jupyter kernel; installed:"),
    R("report", "--timeout", ["--timeout", "-1"], "--timeout -1: must be an integer >= 1"),
    R("report", "--timeout", ["--timeout", "nan"], "argument --timeout: invalid int value: 'nan'"),
    R("report", "--timeout", ["--timeout", "30.5"], "argument --timeout: invalid int value: '30.5'"),
    R("report", "--timeout", ["--timeout", "99999999999"], "--timeout 99999999999: must be an integer >= 1 and <= 604800"),
    R("report", "--jobs", ["--jobs", "0"], "--jobs 0: must be an integer >= 1"),
    R("report", "--jobs", ["--jobs", "two"], "argument --jobs: invalid int value: 'two'"),
    R("report", "--jobs", ["--jobs", "65"], "--jobs 65: must be an integer >= 1 and <= 64"),
    R("report", "--parameter", ["-p", "resolution=0"], "-p resolution=0: must be in 32..1024 in 00_quickstart.ipynb"),
    R("report", "--parameter", ["-p", "dataset=nope"], '-p dataset="nope": must be one of fashion_mnist,'),
    R("report", "--parameter", ["-p", "datasets=[\"nope\"]", "--only", NB02], '-p datasets=["nope"]: must be one of'),
    R("report", "--parameter", ["-p", "rho=1.5", "--only", "03_aware_saliency"], "-p rho=1.5: must be in 0..1 in 03_aware"),
    R("report", "--parameter", ["-p", "size=huge", "--only", "03_aware_saliency"], '-p size="huge": must be one of smoke,'),
    # numbers bounded and empty paths refused, before any work
    R("tosca", "--eta-min", ["--eta-min", "0.1"], "--eta-min 0.1: must be below --lr 0.025"),
    R("tosca", "--eta-min", ["--eta-min", "0.5", "--lr", "0.5"], "--eta-min 0.5: must be below --lr 0.5"),
    R("tosca", "--lr", ["--lr", "1e30"], "--lr 1e+30: must be a finite number > 0 and <= 10"),
    R("tosca", "--l1", ["--l1", "1e30"], "--l1 1e+30: must be a finite number >= 0 and <= 10"),
    R("tosca", "--head-scale", ["--head-scale", "1e30"], "--head-scale 1e+30: must be a finite number > 0 and <= 1000"),
    R("tosca", "--momentum", ["--momentum", "5"], "--momentum 5.0: must be a finite number >= 0 and < 1"),
    R("tosca", "--momentum", ["--momentum", "1"], "--momentum 1.0: must be a finite number >= 0 and < 1"),
    R("tosca", "--weight-decay", ["--weight-decay", "1e30"], "--weight-decay 1e+30: must be a finite number >= 0 and <= 1"),
    R("tosca", "--threads", ["--threads", "100000"], f"--threads 100000: must be an integer >= 0 and <= {os.cpu_count()}"),
    R("tosca", "--epochs", ["--epochs", "99999999999999999999"], "must be an integer >= 1 and <= 100000"),
    R("tosca", "--batch-size", ["--batch-size", "99999999999999999999"], "must be an integer >= 1 and <= 1000000"),
    R("tosca", "--per-batch-size", ["--per-batch-size", "99999999999"], "must be an integer >= 1 and <= 1000000"),
    R("tosca", "--inc", ["--inc", "99999999999999999999"], "must be an integer >= 1 and <= 100000"),
    R("tosca", "--runs-dir", ["--runs-dir", ""], "--runs-dir '': must be a folder path"),
    R("tosca", "--ridge-dim", ["--ridge-dim", "0", "--routings", "ridge"], "--ridge-dim 0: must be an integer >= 1"),
    R("tosca", "--ridge-dim", ["--ridge-dim", "1000000", "--routings", "ridge"],
      "--ridge-dim 1000000: must be an integer >= 1 and <= 100000"),
    R("tosca", "--ridge-lambda", ["--ridge-lambda", "0", "--routings", "ridge"],
      "--ridge-lambda 0.0: must be a finite number > 0"),
    R("tosca", "--ridge-lambda", ["--ridge-lambda", "nan", "--routings", "ridge"], "--ridge-lambda nan: must be a finite"),
    R("tosca", "--ridge-dim", ["--ridge-dim", "500"],
      "--ridge-dim 500: set the ridge router, which is not among --routings per-sample per-batch oracle"),
    R("tosca", "--ridge-lambda", ["--method", "ranpac", "--ridge-lambda", "10", "--routings", "ridge"],
      "--ridge-lambda 10.0: not used by --method ranpac"),
    # options the chosen method does not use: refused, all named (only those typed; defaults never)
    R("tosca", "--method", ["--method", "simplecil", "--routing", "oracle", "--l1", "0.1", "--epochs", "7"],
      "--routing oracle --l1 0.1 --epochs 7: not used by --method simplecil (it is not routed"),
    R("tosca", "--mode", ["--mode", "augment", "--method", "ncm"],
      "--mode augment: not used by --method ncm (augment mode changes only tosca and layerwise_adapter)"),
    R("tosca", "--mode", ["--mode", "augment", "--method", "finetune"], "--mode augment: not used by --method finetune"),
    R("tosca", "--head-scale", ["--method", "finetune", "--head-scale", "2"],
      "--head-scale 2.0: not used by --method finetune (it has no trained cosine head)"),
    R("tosca", "--per-batch-size", ["--method", "ranpac", "--per-batch-size", "8", "--routings", "oracle"],
      "--routings oracle --per-batch-size 8: not used by --method ranpac"),
    R("tosca", "--engine", ["--method", "joint", "--engine", "static", "--ratio", "8", "--flow", "adapter"],
      "--ratio 8 --flow adapter --engine static: not used by --method joint (it has no LuCA module)"),
    R("tosca", "--momentum", ["--method", "fecam", "--momentum", "0.5", "--lr", "0.1", "--batch-size", "8"],
      "--batch-size 8 --lr 0.1 --momentum 0.5: not used by --method fecam (it takes no gradient steps)"),
    R("aware finetune", "--steps", ["--steps", "99999999999999999999"], "must be an integer >= 1 and <= 1000000"),
    R("aware finetune", "--lr", ["--lr", "1e30"], "--lr 1e+30: must be a finite number > 0 and <= 10"),
    R("aware profile", "--n", ["--calib", "proxy", "--n", "99999999999999999999"], "must be an integer >= 1 and <= 1000000"),
    R("aware tune", "--n-val", ["--n-val", "99999999999999999999"], "must be an integer >= 1 and <= 1000000"),
    R("aware tune", "--run-dir", ["--run-dir", ""], "--run-dir '': must be a folder path"),
    R("aware finetune", "--save", ["--save", ""], "--save '': must be a folder path"),
    R("aware profile", "--out", ["--out", ""], "--out '': must be a file path"),
    R("features", "--cache-dir", ["--cache-dir", ""], "--cache-dir '': must be a folder path"),
    # lab jupyter (nothing starts: the checks come first)
    R("jupyter", "--port", ["--port", "70000"], "--port 70000: must be an integer >= 0 and <= 65535"),
    R("jupyter", "--port", ["--port", "-1"], "--port -1: must be an integer >= 0"),
    R("jupyter", "--token", ["--token", "a b"], "--token 'a b': must be non-empty"),
    R("jupyter", "--root-dir", ["--root-dir", "{file}"], "--root-dir {file}: is a file, not a folder"),
    R("jupyter", "--kernel", ["--kernel", "no kernel"], "--kernel 'no kernel': must be a kernel name"),
    R("jupyter", "--ui", ["--ui", "classic"], "argument --ui: invalid choice: 'classic'"),
    R("jupyter", "--dry-run", ["--dry-run=1"], "ignored explicit argument"),
    R("jupyter", "extra", ["--dry-run", "--", "--ip=0.0.0.0"], "--ip=0.0.0.0: the address, port and token are set"),
    R("jupyter", "extra", ["--dry-run", "--", "--ServerApp.allow_origin_pat=.*"], "the address, port and token are set"),
    R("jupyter", "extra", ["--dry-run", "--", "--config=/tmp/x.py"], "the address, port and token are set"),
]


# --- the sandbox the rows refer to ----------------------------------------------------------------
@pytest.fixture(scope="module")
def sandbox(tmp_path_factory) -> dict[str, str]:
    import pickle

    tmp = tmp_path_factory.mktemp("bad_input")
    (tmp / "a_file.txt").write_text("not a folder\n")
    (tmp / "a_dir").mkdir()
    (tmp / "garbage.pth").write_bytes(os.urandom(2048))
    (tmp / "code.pth").write_bytes(pickle.dumps({"w": argparse.Namespace(x=1)}))  # a pickle that carries a class
    paths = {"file": tmp / "a_file.txt", "dir": tmp / "a_dir", "missing": tmp / "missing" / "nothing.pth",
             "garbage": tmp / "garbage.pth", "pickle": tmp / "code.pth"}
    for name, lock in (("run_empty_lock", ""), ("run_garbage_lock", "not-a-pid\n"),
                       ("run_alive_lock", f"{os.getppid()}\n"), ("run_other", None)):
        folder = tmp / name
        folder.mkdir()
        (folder / "config.json").write_text('{"epochs": 1}\n')
        if lock is not None:
            (folder / ".lock").write_text(lock)
        paths[name] = folder
    import json
    from dataclasses import asdict

    from lab.experiments.tosca.run import RunConfig, config_hash

    for name, text in (("run_list_config", "[]"), ("run_null_config", "null"),
                       ("run_newer_config", '{"epochs": 1, "from_the_future": 1}'),
                       ("run_fifo_lock", '{"epochs": 1}'), ("run_foreign", '{"epochs": 1}'),
                       ("run_moved", '{"epochs": 1}')):
        folder = tmp / name
        (folder / "modules").mkdir(parents=True)
        (folder / "stages").mkdir()
        (folder / "config.json").write_text(text + "\n")
        paths[name] = folder
    os.mkfifo(tmp / "run_fifo_lock" / ".lock")     # reading it would wait for a writer forever
    (tmp / "run_foreign" / "modules" / "task000.safetensors").write_bytes(b"a module of another run")
    (tmp / "run_foreign" / "modules" / "task000.safetensors.owner").write_text(
        json.dumps({"seed": 5, "config_sha256": "0" * 64, "task": 0, "sha256": "0" * 64}))
    (tmp / "run_moved" / "stages" / "stage001.json").write_text("{}")   # task 0's stage, renamed
    (tmp / "run_moved" / "stages" / "stage001.json.owner").write_text(
        json.dumps({"seed": 1993, "config_sha256": config_hash(RunConfig(epochs=1)), "task": 0, "sha256": "0" * 64}))
    base = asdict(RunConfig())
    for name, manifest in (("sweep_other", {"base_config": base, "seeds": [1993, 1994], "l1": [5e-4], "executor": "local"}),
                           ("sweep_newer", {"base_config": base, "seeds": [1993], "l1": [5e-4], "from_the_future": 1}),
                           ("sweep_list", [])):
        folder = tmp / name
        folder.mkdir()
        (folder / "sweep.json").write_text(json.dumps(manifest))
        paths[name] = folder
    if os.geteuid() == 0:  # root writes anywhere a mode allows: use a folder the kernel refuses
        paths["unwritable"] = Path("/sys")
    else:
        ro = tmp / "read_only"
        ro.mkdir()
        ro.chmod(0o555)
        paths["unwritable"] = ro
    # where no rank listens; filled in at run time, so the test ids (which every xdist worker must
    # collect identically) never hold a random number
    return {**{k: str(v) for k, v in paths.items()}, "free_port": str(_free_port())}


def _fill(text: str, sandbox: dict) -> str:
    return text.format(**sandbox)


def _argv(row: Row, sandbox: dict) -> list[str]:
    return [*row.command.split(), *(_fill(a, sandbox) for a in row.argv)]


def _runs_dirs(runs: Path) -> list[Path]:
    return [p for p in runs.glob("*/*") if p.is_dir()]


def _check(row: Row, sandbox: dict, code, err: str, seconds: float, runs: Path) -> None:
    assert code == row.code, err
    assert "Traceback" not in err, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert _fill(row.fragment, sandbox) in lines[0], lines[0]
    assert seconds < row.bound, f"{seconds:.1f} s > {row.bound} s"
    assert _runs_dirs(runs) == [], "a run folder was created"


# --- in-process rows --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def warm():
    """Import what the checks use once, so each row's time is its own checks."""
    import jupyter_client.kernelspec  # noqa: F401
    import papermill  # noqa: F401
    import torch  # noqa: F401

    from lab.experiments.aware.run.checks import mini_llava_skeleton

    mini_llava_skeleton()


@pytest.mark.parametrize("row", [r for r in ROWS if not r.sub], ids=lambda r: r.id)
def test_bad_input_in_process(row, sandbox, warm, tmp_path, monkeypatch, capsys):
    if row.no_cuda:
        import torch

        if torch.cuda.is_available():
            pytest.skip("CUDA is available here")
    runs = tmp_path / "runs"
    monkeypatch.setenv("LAB_RUNS_DIR", str(runs))
    for k, v in row.env.items():
        monkeypatch.setenv(k, _fill(v, sandbox))
    capsys.readouterr()
    t0 = time.perf_counter()
    try:
        code = cli.main(_argv(row, sandbox))
    except SystemExit as exc:  # argparse
        code = exc.code
    seconds = time.perf_counter() - t0
    _check(row, sandbox, code, capsys.readouterr().err, seconds, runs)


# --- subprocess rows (the real `lab`, in parallel) ------------------------------------------------
def _lab(argv: list[str], env: dict) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "lab.cli", *argv], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    return p.returncode, p.stderr, time.perf_counter() - t0


@pytest.fixture(scope="module")
def sub_results(sandbox, tmp_path_factory):
    rows = [r for r in ROWS if r.sub]
    runs = tmp_path_factory.mktemp("sub_runs")
    jobs = {}
    with ThreadPoolExecutor(max_workers=3) as pool:
        for row in rows:
            env = {**os.environ, "LAB_RUNS_DIR": str(runs), "PYTHONWARNINGS": "ignore",
                   **{k: _fill(v, sandbox) for k, v in row.env.items()}}
            jobs[row.id] = pool.submit(_lab, _argv(row, sandbox), env)
    return runs, {key: f.result() for key, f in jobs.items()}


@pytest.mark.parametrize("row", [r for r in ROWS if r.sub], ids=lambda r: r.id)
def test_bad_input_subprocess(row, sandbox, sub_results):
    runs, results = sub_results
    code, err, seconds = results[row.id]
    _check(row, sandbox, code, err, seconds, runs)


def _sigint_state() -> str:
    """This process's SIGINT disposition (Python's view) and whether the kernel has it ignored/blocked."""
    try:
        status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
    except OSError:   # no /proc: Python's view only
        status = {}
    bit = 1 << (signal.SIGINT - 1)
    ignored, blocked = (bool(int(status.get(k, "0").strip(), 16) & bit) for k in ("SigIgn", "SigBlk"))
    return f"handler {signal.getsignal(signal.SIGINT)!r}, ignored {ignored}, blocked {blocked}"


def test_ctrl_c_names_the_run_folder_and_the_resume_command(tmp_path):
    """SIGINT during a (long) TOSCA run: one line with the folder and how to resume, exit 130."""
    env = {**os.environ, "LAB_RUNS_DIR": str(tmp_path), "PYTHONFAULTHANDLER": "1"}
    # 32 px: on a cold cache the first pass over the images takes seconds, so the signal lands in training
    # A terminal's Ctrl-C reaches a process whose SIGINT is at its default. A test runner's worker
    # may have it ignored or blocked (the child would inherit that across exec, and a run was seen
    # to train on untouched 60 s after the signal under pytest-xdist): start the child from the
    # default, noting what the worker had.
    inherited = _sigint_state()
    old_handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    old_mask = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        p = subprocess.Popen([sys.executable, "-m", "lab.cli", "tosca", "--resolution", "32", "--epochs", "100000",
                              "--quiet"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env, cwd=ROOT)
    finally:
        signal.signal(signal.SIGINT, old_handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not list(tmp_path.glob("tosca/*/config.json")) and p.poll() is None:
            time.sleep(0.2)
        time.sleep(1.0)  # inside the training loop
        sent = time.time()
        p.send_signal(signal.SIGINT)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:   # where it is stuck: faulthandler prints every thread on SIGABRT
            p.send_signal(signal.SIGABRT)
            _, err = p.communicate(timeout=30)
            pytest.fail(f"no exit {time.time() - sent:.0f} s after SIGINT (this worker's SIGINT before the test: "
                        f"{inherited}); the run's threads:\n{err[-4000:]}")
    finally:
        if p.poll() is None:
            p.kill()
    (folder,) = tmp_path.glob("tosca/*")
    assert p.returncode == 130, err
    assert "Traceback" not in err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1, err
    assert str(folder) in lines[0] and f"--resume {folder}" in lines[0]
    assert "lab tosca --resolution 32 --epochs 100000" in lines[0]
    assert not (folder / ".lock").exists()  # released: the resume command works at once


# --- the table covers every argument ---------------------------------------------------------------
def _arguments() -> set[tuple[str, str]]:
    """(command, long option or positional dest) for every argument of every subcommand, and
    (command, '(none)') for a command without arguments."""
    out = set()

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]):
        own = [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        for a in own:
            longs = [o for o in a.option_strings if o.startswith("--")]
            out.add((" ".join(path), longs[0] if longs else (a.option_strings or [a.dest])[0]))
        if not own:
            out.add((" ".join(path), "(none)"))
        for action in subs:
            for name, sub in action.choices.items():
                walk(sub, (*path, name))

    walk(cli.build_parser(), ())
    from lab.experiments.tosca import study

    walk(study.parser(), ("tosca", "study"))     # lab tosca study: its own parser, dispatched by lab.cli
    return out


def test_every_argument_has_a_row():
    covered = {(r.command, r.param) for r in ROWS}
    missing = sorted(_arguments() - covered)
    assert not missing, f"arguments without a bad-input row in tests/test_bad_input.py: {missing}"


def test_rows_use_the_argument_they_cover():
    parser_args = _arguments()
    for r in ROWS:
        if r.param.startswith("$"):
            assert r.param[1:] in r.env or r.param == "$LAB_RUNS_DIR", r
            continue
        assert (r.command, r.param) in parser_args, f"{r.id}: {r.command!r} has no argument {r.param!r}"
        if r.param.startswith("--"):
            short = {"--parameter": "-p"}.get(r.param, r.param)
            assert any(a in (r.param, short) or a.startswith(r.param + "=") for a in r.argv), r.id


# --- readers of shipped results: verified, one line naming the file ----------------------------------
# Each row: (study, mutation, fragment naming the file). A mutation edits a copy of the study folder;
# ``rehash`` re-records the edited table's sha256, as a writer that wrote a bad table would have (so
# that the check after the sha256 one is what answers). The reader must raise BadShipped (a
# RuntimeError: the command line prints it as one line) naming the file, fast, writing nothing.
@dataclass(frozen=True)
class Shipped:
    study: str          # "tosca" or "aware"
    what: str
    file: str           # the file the mutation touches (relative to the study folder)
    content: bytes | None = None   # new bytes for it (None: delete it)
    rehash: bool = False
    manifest: dict | None = None   # keys set in manifest.json (after the content change)
    fragment: str = ""             # expected in the message besides the file's path
    names: str = ""                # the file named in the message, when not ``file``


_RANDOM = bytes(random_byte for random_byte in __import__("random").Random(0).randbytes(4096))
SHIPPED_ROWS = [
    *[row for study, runs, summary in (("tosca", "runs.csv", "summary.csv"), ("aware", "runs.csv", "fronts.csv"))
      for row in (
          Shipped(study, "manifest random bytes", "manifest.json", _RANDOM, fragment="not a JSON manifest"),
          Shipped(study, "manifest truncated", "manifest.json", b'{"command": "lab', fragment="invalid JSON"),
          Shipped(study, "manifest a list", "manifest.json", b"[]", fragment="a JSON array, not an object"),
          Shipped(study, "manifest null", "manifest.json", b"null", fragment="a JSON null, not an object"),
          Shipped(study, "no sha256", "manifest.json", manifest={"sha256": None}, fragment="records no sha256"),
          Shipped(study, "absolute path", "manifest.json", manifest={"sha256+": {"/etc/passwd": "0" * 64}},
                  fragment="'/etc/passwd', which is not a file inside"),
          Shipped(study, "dot-dot", "manifest.json", manifest={"sha256+": {"../x.csv": "0" * 64}},
                  fragment="'../x.csv', which is not a file inside"),
          Shipped(study, "truncated runs", runs, b"scenario,seed\n", fragment="differs from the"),
          Shipped(study, "missing runs", runs, None, fragment="missing"),
          Shipped(study, "random runs", runs, _RANDOM, rehash=True, fragment=""),
          Shipped(study, "runs lacks a column", runs, b"", rehash=True, fragment="lacks the column(s)"),
          Shipped(study, "empty summary", summary, b"", rehash=True, fragment="empty (no header, no rows)"),
          Shipped(study, "summary header only", summary, b"HEADER", rehash=True, fragment="has no rows"),
      )],
    Shipped("aware", "tables outside", "manifest.json", manifest={"tables+": ["../../etc/passwd"]},
            fragment="'../../etc/passwd', which is not a file inside"),
    Shipped("tosca", "efficiency truncated", "efficiency_time.csv", b"backbone\n", fragment="differs from the"),
    Shipped("tosca", "efficiency outside", "efficiency_manifest.json", manifest={"files": ["/etc/hosts"]},
            fragment="'/etc/hosts', which is not a file inside"),
]


def _aware_copy(dest: Path) -> None:
    """A small AWARe study folder: the shipped CSV tables with a manifest recording their sha256
    (complete, so an empty fronts table is an error)."""
    import json

    from lab import _manifest

    src = ROOT / "results" / "aware"
    dest.mkdir()
    tables = ["baselines.csv", "comparisons.csv", "runs.csv", "fronts.csv"]
    for t in tables:
        (dest / t).write_bytes((src / t).read_bytes())
    # a fronts table with one row: an empty one is refused when the study is complete
    header = (dest / "fronts.csv").read_text().splitlines()[0]
    (dest / "fronts.csv").write_text(header + "\n" + ",".join(["x"] * len(header.split(","))) + "\n")
    (dest / "manifest.json").write_text(json.dumps({"command": "lab aware study", "tables": tables, "complete": True,
                                                    "sha256": _manifest.digests(dest, tables)}))


def _tosca_copy(dest: Path) -> None:
    import shutil

    src = ROOT / "results" / "tosca"
    dest.mkdir()
    for f in src.iterdir():
        if f.is_file():
            shutil.copy(f, dest / f.name)


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("row", SHIPPED_ROWS, ids=lambda r: f"{r.study}:{r.what}")
def test_shipped_study_readers_fail_in_one_line_naming_the_file(row, tmp_path):
    import json

    from lab import _manifest
    from lab.cli import one_line

    folder = tmp_path / "study"
    (_tosca_copy if row.study == "tosca" else _aware_copy)(folder)
    target = folder / row.file
    if row.content is None and row.manifest is None:
        target.unlink()
    elif row.content is not None:
        content = row.content
        if content == b"HEADER":
            content = (target.read_text().splitlines()[0] + "\n").encode()
        elif content == b"" and "column" in row.what:   # drop the first column of every line
            content = "".join(",".join(l.split(",")[1:]) + "\n" for l in target.read_text().splitlines()).encode()
        target.write_bytes(content)
    mname = "efficiency_manifest.json" if row.file.startswith("efficiency") else "manifest.json"
    if row.rehash or row.manifest:
        m = json.loads((folder / mname).read_text())
        if row.rehash:
            m["sha256"][row.file] = _manifest.digests(folder, [row.file])[row.file]
        for k, v in (row.manifest or {}).items():
            if k.endswith("+"):
                k = k[:-1]
                m[k] = {**m[k], **v} if isinstance(v, dict) else [*m[k], *v]
            else:
                m[k] = v
        (folder / mname).write_text(json.dumps(m))
    from lab.experiments.aware.views import study as study_views
    from lab.experiments.tosca import results   # imported before the clock starts

    before = _snapshot(folder)
    t0 = time.perf_counter()
    with pytest.raises(_manifest.BadShipped) as info:
        (results.load if row.study == "tosca" else study_views.load_study)(folder)
    seconds = time.perf_counter() - t0
    msg = one_line(info.value)
    assert "\n" not in str(info.value), str(info.value)
    named = folder / (row.names or (mname if row.manifest else row.file))
    assert str(named) in msg and row.fragment in msg, msg
    assert isinstance(info.value, cli.EXPECTED)   # the command line prints it as one line, exit status 2
    assert seconds < 5, f"{seconds:.1f} s"
    assert _snapshot(folder) == before, "the reader wrote into the study folder"


def test_shipped_readers_accept_the_shipped_tosca_study():
    from lab.experiments.tosca import results

    s = results.load(ROOT / "results" / "tosca")
    assert len(s.runs) and s.manifest["sha256"].keys() == {"runs.csv", "summary.csv"}


@pytest.mark.parametrize("argv", [
    ["--method", "finetune", "--epochs", "1", "--lr", "0.01", "--momentum", "0.5", "--eta-min", "0"],
    ["--method", "layerwise_adapter", "--mode", "augment", "--head-scale", "2", "--epochs", "1"],
    ["--method", "simplecil", "--mode", "cached", "--seed", "3", "--threads", "1"],
    ["--method", "tosca", "--routing", "oracle", "--l1", "0.1", "--epochs", "7", "--engine", "static"],
], ids=lambda a: " ".join(a))
def test_options_the_method_uses_are_accepted(argv, tmp_path, monkeypatch):
    """The other side of the method/option rows: what a method uses passes the checks (nothing runs)."""
    from lab.experiments.tosca import cli as tosca_cli

    monkeypatch.setenv("LAB_RUNS_DIR", str(tmp_path))
    args = cli.build_parser(["tosca"]).parse_args(["tosca", *argv])
    tosca_cli.check_args(args)
    assert set(tosca_cli.given(args)) >= {a[2:].replace("-", "_") for a in argv if a.startswith("--")}


def test_report_never_writes_over_its_source_notebooks_or_the_repository(tmp_path):
    """`lab report --out` refuses the folder of the source notebooks (the repository's or --notebooks'),
    the repository itself and its tracked folders other than reports/; nothing is written."""
    src = tmp_path / "nbs"
    src.mkdir()
    nb = ROOT / "notebooks" / "00_quickstart.ipynb"
    (src / nb.name).write_bytes(nb.read_bytes())
    shipped = nb.read_bytes()
    cases = [(["--notebooks", str(src), "--out", str(src), "-p", "x=2"], "source notebooks"),
             (["--only", "00_quickstart", "--params", "smoke", "--out", str(ROOT / "notebooks")], "source notebooks"),
             (["--only", "00_quickstart", "--out", str(ROOT / "results" / "x")], "tracked folder results/"),
             (["--only", "00_quickstart", "--out", str(ROOT)], "the repository itself")]
    for argv, fragment in cases:
        p = subprocess.run([sys.executable, "-m", "lab", "report", *argv], cwd=tmp_path, capture_output=True, text=True,
                           timeout=60)
        assert p.returncode == 2 and fragment in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert (src / nb.name).read_bytes() == nb.read_bytes() and nb.read_bytes() == shipped
    assert not (ROOT / "results" / "x").exists()
