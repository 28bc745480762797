"""Every command the docs tell a user to run is exercised by a test, a demo test, or (GPU) validated.

Where commands come from (``doc_commands()``):
- README.md and docs/*.md: every line of a ```bash / ```sh block; every ``$ `` line of a ```console (or
  unlabelled) block; every synopsis line of an unlabelled block (``mmrlvr demo [--out ...]``); every inline
  code span that starts with a command (`mmrlvr train --help-config`);
- the header comments of configs/*.yaml (``# Run:  mmrlvr train configs/x.yaml``);
- the module docstrings of demos/*.py (their usage lines).
Continuation lines are joined, shell comments stripped, env-var prefixes kept, whitespace collapsed.

``COMMANDS`` maps each one to how it is exercised and by which tests. ``test_every_doc_command_is_mapped``
fails naming the file and the command when a doc gains a command the table lacks (or the table keeps one
no doc has any more); ``test_every_mapped_test_exists`` fails when a named test function is gone.
``test_doc_commands_name_real_files_and_options`` checks every command's repo paths and ``--options``
against the real parsers (mmrlvr's, the scripts', accelerate's), and the tests below run the commands no
other test runs, shortened only by overrides / flags the command already has.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import runpy
import shlex
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from mmrlvr.cli import main as mmrlvr_main

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
DEMOS = sorted((ROOT / "demos").glob("*.py"))

# how a command is exercised
RUN = "run"                                   # a test runs it (shortened only by overrides/flags it has)
DEMO = "run by a demo test"                   # a demo test runs the same command / the command's demo
SYNOPSIS = "synopsis: options checked"        # a usage line: its options exist (and --help works)
GPU = "validated, not run (needs GPU)"        # the config and overrides resolve (--dry-run); its pipeline
#                                               runs on CPU with a tiny stand-in model (test_gpu_configs_on_cpu)
INSTALL = "validated, not run (needs network)"  # pip: the extras / entry point it installs exist
VERL = "validated, not run (needs verl)"      # verl is not installed here; its reward API is tested

CMD_START = r"(?:[A-Z][A-Z0-9_]*=\S+ +)*(?:mmrlvr|python3?|accelerate launch|pip install|bash) "

# ------------------------------------------------------------------------------------------ the table

T_CLI = "tests/test_cli.py::"
T_RUN_DIR = "tests/test_run_dir.py::"
T_DOC = "tests/test_doc_commands.py::"
T_CFG_LOAD = "tests/test_config.py::test_shipped_configs_load"
T_GPU_CPU = ("tests/test_gpu_configs_on_cpu.py::test_gpu_config_pipeline_runs_on_cpu"
             "[qwen2_5_vl_3b_geometry3k_lora.yaml]",
             "tests/test_gpu_configs_on_cpu.py::test_gpu_config_pipeline_runs_on_cpu"
             "[qwen2_5_vl_7b_geometry3k_lora.yaml]")
T_DRY = T_DOC + "test_doc_train_commands_resolve_with_dry_run"
T_TWO_PROC = "tests/test_train_loop.py::test_two_processes_match_one_process"
T_DIST = "tests/test_distributed.py::"
T_RESUME = "tests/test_train_loop.py::test_kill_and_resume_matches_an_uninterrupted_run"
T_DEMO = "tests/test_demo.py::test_demo_runs_and_writes_table_plots_and_summary"
T_OPTS = T_DOC + "test_doc_commands_name_real_files_and_options"
T_HELP = T_CLI + "test_every_command_has_help"
T_PYPROJECT = T_DOC + "test_install_commands_name_real_extras_and_entry_point"
T_RUBRIC_DEMO = ("tests/test_demos_rubric.py::"
                 "test_rubric_authoring_demo_runs_offline_and_ranks_honest_answers_first")
T_TRANSCRIPTS = T_DOC + "test_rubric_transcripts_reproduce"
T_INSPECT = ("tests/test_inspector_app.py::test_launch_binds_loopback_only",
             "tests/test_inspector_app.py::test_cli_validates_arguments")
T_GROUNDING = "tests/test_demos_grounding.py::test_grounding_demo_trains_and_stores_boxes"
T_TURNS = "tests/test_inspector_turns.py::test_turn_view_shows_calls_zoom_boxes_and_returned_images"
T_SEED_STUDY = "tests/test_seed_methods_train.py::test_seed_study_runs_two_arms_resumes_and_plots"
T_SCREENS = "tests/test_inspector_screens.py::test_browse_view_fits_and_reads_at_a_glance"
T_EXPOSED = ("tests/test_inspector_app.py::test_cli_refuses_an_exposed_host_without_auth",
             "tests/test_inspector_app.py::test_cli_exposed_host_warns_and_passes_the_login",
             "tests/test_inspector_app.py::test_launch_with_auth_requires_the_login")
T_WARM_CLI = "tests/test_models_warmstart.py::test_cli_warm_start_beats_chance_reproduces_the_shipped_build_and_second_call_is_cached"
T_VERL = "tests/test_integrations_verl.py::"
T_TRL = "tests/test_integrations_trl.py::test_doc_example_trains_two_steps_with_our_rewards"
T_VLLM = "tests/test_rollout_vllm.py::"
T_CI_VLLM = "tests/test_doc_commands.py::test_ci_builds_the_vllm_environment_and_runs_its_tests"
T_VLLM_DEMO = "tests/test_vllm_engine.py::test_the_demo_trains_checkpoints_and_resumes_on_vllm"
VLLM_ENV = "run by CI (.ci/run builds the vLLM environment with it, then runs the vllm tests there)"
IN_VLLM_ENV = "run in the vLLM environment by CI (shortened: max_steps 2, then resumed to 3)"


def cfg_run(name: str) -> str:
    """The test that trains ``configs/NAME`` for two steps (one parametrised case)."""
    return f"tests/test_configs_run.py::test_cpu_config_trains_two_steps[{name}]"


QWEN_3B = "mmrlvr train configs/qwen2_5_vl_3b_geometry3k_lora.yaml model.path=/models/Qwen2.5-VL-3B-Instruct"
QWEN_7B = "accelerate launch --num_processes 8 -m mmrlvr.cli train configs/qwen2_5_vl_7b_geometry3k_lora.yaml"
MODEL_7B = "model.path=/models/Qwen2.5-VL-7B-Instruct"
GEO_DATA = "data.train=/data/geometry3k/train.parquet data.eval=/data/geometry3k/test.parquet"
CONSISTENCY = "mmrlvr train configs/consistency-tiny.yaml"
CREDIT = "mmrlvr train configs/credit-vepo-tiny.yaml"
RUBRIC_IO = "- --data scene.jsonl --responses responses.jsonl"
JUDGE_URL = "base_url=http://127.0.0.1:41221/v1"
ON_8_GPUS = GPU + "; the 2-process CPU twin runs"

# command (as extracted) -> (how it is exercised, the tests that do it: "tests/file.py::test_name[case]")
T_STEP1 = "tests/test_sampler_methods.py::test_a_fresh_curriculum_chooses_at_step_0_with_the_probe_and_not_without"
STEP1_SGAC = ("the step-1 measurement (run by hand); its finding tested at step 0 and over 20 steps",
              (T_STEP1, "tests/test_sampler_methods.py::test_disagreement_trains_20_steps_and_resumes_exactly", T_DRY))
STEP1_TRACE = ("the step-1 measurement (run by hand); its finding tested at step 0 and over 20 steps",
               (T_STEP1, "tests/test_sampler_methods.py::"
                "test_budget_trains_20_steps_with_groups_of_several_sizes_and_resumes_exactly", T_DRY))

COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {
    'mmrlvr train configs/demo-tiny.yaml "algo.aux_losses=[{name: forward_ce, weight: 0.1, params: {horizon: 0.25, '
    'rollout: truncated}}]"':
        ("2 steps at horizon 0.25: responses cut at 8 of 32 tokens, every generated token scored",
         ("tests/test_forward_ce.py::test_truncated_rollouts_generate_only_what_the_expert_scores", T_DRY)),
    # ---- README.md
    "python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 && pip install -e . "
    "&& mmrlvr demo": (RUN + " (mmrlvr demo, 3 steps); the install validated", (T_DEMO, T_PYPROJECT)),
    "python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 "
    "&& pip install -q -e \".[test]\" && python -m pytest -q":
        ("run by CI: .ci/run holds it verbatim", (T_DOC + "test_readme_test_command_is_what_ci_runs", T_PYPROJECT)),
    'pip install "mmrlvr[vllm]"':
        (INSTALL + " + GPU", (T_PYPROJECT, T_VLLM + "test_missing_vllm_is_a_clear_user_error")),
    "bash .ci/vllm-env DIR": (VLLM_ENV, (T_CI_VLLM,)),
    "bash .ci/vllm-env ~/.cache/mmrlvr/vllm-env": (VLLM_ENV, (T_CI_VLLM,)),
    "mmrlvr train configs/demo-tiny.yaml rollout.engine=vllm": (IN_VLLM_ENV, (T_VLLM_DEMO,)),
    "mmrlvr train configs/demo-tiny.yaml rollout.engine=vllm max_steps=3": (IN_VLLM_ENV, (T_VLLM_DEMO,)),
    "~/.cache/mmrlvr/vllm-env/bin/mmrlvr train configs/demo-tiny.yaml rollout.engine=vllm max_steps=3":
        (IN_VLLM_ENV, (T_VLLM_DEMO,)),
    QWEN_3B: (GPU, (T_DRY, T_CFG_LOAD, *T_GPU_CPU)),
    QWEN_7B: (ON_8_GPUS, (T_DRY, T_CFG_LOAD, T_TWO_PROC, *T_GPU_CPU)),
    "python -m pytest -q -n 0 -m matrix":
        (RUN + " (by CI after the suite: .ci/run)",
         ("tests/test_multiprocess_matrix.py::test_the_matrix_covers_every_registered_option", T_OPTS)),
    "python -m pytest --record-file-times":
        (RUN + " (rewrites the suite's file times)",
         ("tests/test_file_times.py::test_the_pytest_option_records_the_files_it_ran",
          "tests/test_file_times.py::test_a_parallel_collection_is_ordered_by_the_record")),
    "python -m pytest -q -n 0 -m rebuild":
        (RUN + " (by CI after the suite: .ci/run)",
         (T_WARM_CLI, T_DOC + "test_every_marker_the_suite_deselects_runs_as_its_own_ci_step")),
    "mmrlvr demo [--out runs/demo] [--steps N] [--eval-size N] [--inspect]":
        (SYNOPSIS, (T_OPTS, T_HELP, T_DEMO, "tests/test_demo.py::test_demo_eval_scales_with_steps")),
    "mmrlvr tiny build --family {qwen2_vl,qwen2_5_vl,qwen3_vl} --out DIR [--warm-start]":
        (SYNOPSIS, (T_OPTS, T_HELP, T_WARM_CLI)),
    "mmrlvr data synth --task TASK --split {train,test} --n N --out DIR":
        (SYNOPSIS, (T_OPTS, T_HELP, "tests/test_data_cli.py::test_synth_writes_a_loadable_dataset")),
    "mmrlvr train CONFIG.yaml [key.sub=value ...] [--resume]": (SYNOPSIS, (T_OPTS, T_HELP, T_RESUME)),
    "mmrlvr eval RUN_DIR [--step N] [--k K] [--out FILE.json]":
        (SYNOPSIS, (T_OPTS, T_HELP, "tests/test_evaluation.py::test_eval_run_dir_reproduces_the_runs_final_eval_exactly")),
    "mmrlvr export RUN_DIR [--step N] --out DIR [--merge] [--dtype bf16] [--push-to-hub REPO]":
        (SYNOPSIS, (T_OPTS, T_HELP, "tests/test_export.py::test_lora_merged_export_is_a_plain_model",
                    "tests/test_export.py::test_full_finetuning_export_and_bf16",
                    "tests/test_export.py::test_push_to_hub_with_hub_access_off_is_one_clear_message")),
    "mmrlvr eval RUN_DIR": (RUN, ("tests/test_evaluation.py::test_eval_run_dir_reproduces_the_runs_final_eval_exactly",)),
    "mmrlvr export RUN_DIR --out DIR --merge": (RUN, ("tests/test_export.py::test_lora_merged_export_is_a_plain_model",)),
    "mmrlvr eval --model DIR --data DIR [--k K] [--out FILE.json]":
        (SYNOPSIS, (T_OPTS, T_HELP, T_CLI + "test_eval_writes_json_and_applies_a_lora_checkpoint")),
    "mmrlvr rubric {validate,preview,score,agreement} ...": (SYNOPSIS, (T_OPTS, T_HELP, T_TRANSCRIPTS)),
    "mmrlvr inspect RUN_DIR [--host 127.0.0.1] [--port 7860]": (SYNOPSIS, (T_OPTS, T_HELP, *T_INSPECT)),
    "mmrlvr inspect RUN_DIR [--host 127.0.0.1] [--port 7860] [--auth USER:PASS | --insecure]":
        (SYNOPSIS, (T_OPTS, T_HELP, *T_INSPECT)),
    # ---- docs/data.md
    "mmrlvr data inspect PATH [--format FORMAT] [--rows N] [--max-prompt-length N]":
        (SYNOPSIS, (T_OPTS, T_HELP, "tests/test_data_inspect.py::test_inspect_shows_layout_rendered_rows_and_tokens",
                    "tests/test_data_inspect.py::test_inspect_broken_file_names_row_and_field_of_each_problem")),
    "mmrlvr train --help-config": (RUN, (T_DOC + "test_help_config_lists_the_keys_the_docs_override",)),
    "mmrlvr train configs/demo-tiny.yaml --dry-run":
        (RUN, ("tests/test_methods.py::test_dry_run_prints_the_plan_every_kind_with_reason_and_parameters", T_DRY)),
    # ---- docs/consistency.md (and configs/consistency-tiny.yaml's header)
    CONSISTENCY: (RUN + " (2 steps)", (cfg_run("consistency-tiny.yaml"), T_DRY)),
    CONSISTENCY + " rewards.2.params.variant=follow_correct_thinking":
        (RUN + " (2 steps)", (T_DOC + "test_consistency_follow_correct_thinking_variant_trains",)),
    CONSISTENCY + " consistency.split_advantage=true":
        (RUN + " (2 steps)", (T_DOC + "test_consistency_answer_scoped_splitting_trains",)),
    CONSISTENCY + " consistency.split_advantage=true consistency.scope=all":
        (RUN + " (2 steps)", (T_DOC + "test_consistency_cora_splitting_trains",)),
    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/consistency_study.py":
        (RUN + " (1 arm, 2 steps)", (T_DOC + "test_consistency_study_runs_one_arm",)),
    "OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 python benchmarks/consistency_study.py":
        (RUN + " (1 arm, 2 steps)", (T_DOC + "test_consistency_study_runs_one_arm",)),
    # ---- docs/architecture.md
    "python tests/stage_goldens.py --add-machine": ("the CLI parsed and the filing rule run on a temporary golden file",
        ("tests/test_stage_goldens.py::test_the_golden_script_takes_its_modes_from_the_command_line",
         "tests/test_stage_goldens.py::test_add_machine_files_rounding_and_refuses_a_changed_result")),
    'mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/median_advantage.py]" algo.advantage=group_median '
    'max_steps=2': (RUN + " (2 steps)", ("tests/test_stage_plugins.py::test_documented_plugin_example_trains",)),
    # ---- docs/extending.md (each example plug-in trains 2 steps on a smaller batch, then resumes exactly)
    'mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/passk_advantage.py]" algo.advantage=my_pass_at_k '
    '"algo.advantage_params={k: 4}" max_steps=2':
        (RUN + " (2 steps, 4 prompts x 4 rollouts, k 2)",
         ("tests/test_examples_plugins.py::test_pass_at_k_trains_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/clipped_pg_loss.py]" '
    'algo.loss=neg_weighted_ppo_clip "algo.loss_params={neg_weight: 0.5}" max_steps=2':
        (RUN + " (2 steps, 4 prompts x 4 rollouts)",
         ("tests/test_examples_plugins.py::test_clipped_pg_loss_trains_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/success_rate_sampler.py]" '
    'rollout.sampler=success_rate "rollout.sampler_params={ema: 0.5, prior: 0.5}" max_steps=2':
        (RUN + " (2 steps, 4 prompts x 4 rollouts, prior 0.2)",
         ("tests/test_examples_plugins.py::test_success_rate_sampler_trains_and_resumes_exactly_and_its_state_changes"
          "_the_draw", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/reward_gate.py]" "stages.shape=[gate_on_accuracy]" '
    'max_steps=2':
        (RUN + " (2 steps, 4 prompts x 4 rollouts)",
         ("tests/test_examples_plugins.py::test_reward_gate_trains_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/first_solve_bonus.py]" '
    '"stages.shape=[first_solve_bonus]" max_steps=2':
        (RUN + " (2 steps, 4 prompts x 4 rollouts, 4 training prompts)",
         ("tests/test_examples_plugins.py::test_first_solve_bonus_trains_and_resumes_exactly_and_its_state_matters",
          T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml "plugins=[docs/examples/group_agreement.py]" rewards.1.name=group_agreement '
    'max_steps=2':
        (RUN + " (2 steps, 2 prompts x 4 rollouts)",
         ("tests/test_example_group_agreement.py::test_trains_two_steps_and_resumes_exactly", T_DRY)),
    # ---- docs/analysis.md (each sub-command runs on a tiny run with checkpoints; the demo run's figures in the doc
    # were measured on `mmrlvr demo --save-every 20 --keep-all`)
    "mmrlvr demo --save-every 20 --keep-all": (RUN + " (3 steps, --save-every 1)", (T_DEMO,)),
    "mmrlvr analyze {trajectory,taskvec,tensors,tokens,prefix,saturation,sensitivity} ...":
        (SYNOPSIS, (T_OPTS, T_HELP, "tests/test_analysis_checkpoints.py::test_every_analysis_is_a_subcommand_with_help")),
    "mmrlvr analyze trajectory runs/demo --extrapolate 300":
        (RUN + " (a tiny run)", ("tests/test_analysis_trajectory.py::"
                                 "test_cli_on_a_tiny_run_writes_numbers_plots_and_a_model_eval_and_export_take",)),
    "mmrlvr analyze taskvec BASE SFT RL [--merge]":
        (SYNOPSIS, (T_HELP, "tests/test_analysis_taskvec.py::test_merge_end_to_end_on_tiny_folders")),
    "mmrlvr analyze tensors runs/demo/checkpoints/step-00000020 runs/demo --forget synth:count":
        (RUN + " (two tiny checkpoints)", ("tests/test_analysis_tensors.py::test_cli_on_two_tiny_checkpoints",)),
    "mmrlvr analyze tokens runs/demo/checkpoints/step-00000180 runs/demo/checkpoints/step-00000200 --run runs/demo":
        (RUN + " (a tiny DelTA run)", ("tests/test_analysis_tokens.py::test_cli_on_a_tiny_delta_run",)),
    "mmrlvr analyze prefix runs/demo":
        (RUN + " (a tiny run, --limit 2 --samples 2)",
         ("tests/test_analysis_prefix.py::test_cli_on_a_tiny_run_writes_the_redundancy_per_checkpoint",)),
    "mmrlvr analyze saturation runs/demo":
        (RUN + " (a tiny run)", ("tests/test_analysis_saturation.py::test_cli_on_a_tiny_run",)),
    "mmrlvr analyze sensitivity runs/demo":
        (RUN + " (a tiny run, --limit 4)",
         ("tests/test_analysis_sensitivity.py::test_cli_on_a_tiny_run_writes_flip_rates_per_checkpoint",)),
    # ---- docs/methods.md (each option trains 20 steps on the tiny VLM with the same keys)
    "mmrlvr train configs/demo-tiny.yaml model.lora.enabled=true model.lora.init=rlpo":
        ("the option trains 20 steps (tiny run, same keys)",
         ("tests/test_seed_methods_train.py::test_lora_init_trains_20_steps", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml algo.clip=acpo algo.epochs=2":
        ("the option trains 20 steps (tiny run, same keys)",
         ("tests/test_seed_methods_train.py::test_acpo_trains_20_steps_and_logs_offpolicy_diagnostics", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml credit.scheme=delta":
        ("the option trains 20 steps (tiny run, same keys)",
         ("tests/test_seed_methods_train.py::test_delta_credit_trains_20_steps", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml algo.loss=popo algo.kl_coef=0":
        ("the option trains 20 steps (tiny run, same keys)",
         ("tests/test_seed_methods_train.py::test_popo_trains_20_steps_and_counts_groups_without_a_positive", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml algo.loss=clip_cov max_steps=2":
        (RUN + " (2 steps, 4 prompts x 8 rollouts, 16 tokens; resumed exactly)",
         ("tests/test_losses_cov.py::test_trains_through_the_trainer_and_resumes_exactly", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml algo.loss=kl_cov algo.epochs=2 max_steps=2":
        (RUN + " (2 steps, 4 prompts x 8 rollouts, 16 tokens; resumed exactly)",
         ("tests/test_losses_cov.py::test_trains_through_the_trainer_and_resumes_exactly", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml algo.advantage=poise rollout.group_size=2":
        ("the option trains 20 steps (tiny run, same keys)",
         ("tests/test_seed_methods_train.py::test_poise_trains_20_steps_with_group_size_two_and_logs_probe_quality",
          T_DRY)),
    'mmrlvr train configs/grounding-tiny.yaml rewards.1.name=majority_vote "rewards.1.params={coords: absolute}"':
        ("the option trains 2 steps on box votes and resumes exactly (tiny run, same keys)",
         ("tests/test_majority_boxes.py::test_the_grounding_config_trains_on_box_votes_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml rewards.1.name=majority_vote "rewards.1.params={votes: 16}"':
        ("the option trains 2 steps (tiny run, same keys, votes 8 for G 4: 4 rows per prompt trained, the vote "
         "over 8) and resumes exactly; 2 processes train as 1",
         ("tests/test_ttrl_votes.py::test_two_steps_train_group_size_rows_and_resume_exactly",
          "tests/test_ttrl_votes.py::test_two_processes_train_as_one", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml rewards.1.name=cocov":
        ("the documented pairing moves the explorer's advantage (hand-computed group) and trains (tiny run)",
         ("tests/test_methods_combined.py::test_cocov_bonus_moves_the_documented_pairings_advantages",
          "tests/test_label_free_and_passk.py::test_trains_20_steps_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml rewards.1.name=cocov algo.advantage=pass_at_k "algo.advantage_params={k: 4}"':
        ("the option trains 20 steps (tiny run, same keys, k 2 for G 4) and resumes exactly",
         ("tests/test_label_free_and_passk.py::test_trains_20_steps_and_resumes_exactly", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml output_dir=runs/ahead max_steps=60":
        ("the first run of the recipe (a tiny run; the test trains 4 steps ahead)",
         ("tests/test_npo_guide.py::test_guide_trains_20_steps_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml output_dir=runs/guided max_steps=40 '
    '"rollout.guide={from: runs/ahead/checkpoints/step-00000060}"':
        ("the guided run trains 20 steps from a later checkpoint and resumes exactly; 2 ranks in the matrix",
         ("tests/test_npo_guide.py::test_guide_trains_20_steps_and_resumes_exactly",)),
    'mmrlvr train configs/demo-tiny.yaml rollout.strategy=tree "rollout.strategy_params={depth: 2, branching: 2}"':
        ("the option trains 20 steps (tiny run, 24 tokens) and resumes exactly; 2 ranks in the matrix",
         ("tests/test_tree_rollouts.py::test_tree_trains_20_steps_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml "rollout.summarize={at_tokens: 1000}" rollout.max_turns=3 '
    'rollout.max_new_tokens=14':
        ("the same options train 4 steps (tiny run) with summarised segments and resume exactly",
         ("tests/test_multiturn_train.py::test_resum_trains_segments_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml "rollout.guide={from: auto, delta: 10}"':
        ("the automatic guide trains (8 steps, delta 2) and resumes exactly",
         ("tests/test_npo_guide.py::test_automatic_guide_runs_the_same_run_delta_steps_ahead_and_resumes_exactly",
          T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml rollout.sampler=budget "rollout.sampler_params={g_min: 2, g_max: 16}"':
        ("the option trains 20 steps (tiny run, G 4) with groups of several sizes and resumes exactly; 2 ranks in "
         "the matrix", ("tests/test_sampler_methods.py::"
                        "test_budget_trains_20_steps_with_groups_of_several_sizes_and_resumes_exactly", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml rollout.sampler=disagreement "rollout.sampler_params={selector: learned, '
    'pool: 2, probe_samples: 2}"':
        ("the defaults train 20 steps (tiny run), choose from step 1 and resume exactly; 2 ranks in the matrix; the "
         "selector by hand", ("tests/test_sampler_methods.py::test_disagreement_trains_20_steps_and_resumes_exactly",
                              "tests/test_sampler_methods.py::test_selector_features_and_the_learned_ranking_by_hand",
                              T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml rollout.sampler=disagreement "rollout.sampler_params={selector: entropy, '
    'floor: 0.05, probe_samples: 0}"':
        ("the entropy draw's probabilities counted, state and refill rounds (the same parameters)",
         ("tests/test_sampler_methods.py::test_unseen_prompts_come_first_then_draws_follow_the_normalised_entropy",
          "tests/test_sampler_methods.py::test_state_round_trip_and_refill_rounds_draw_other_prompts", T_DRY)),
    # the step-1 measurement of docs/methods.md (run by hand, 2 CPU cores): what it shows — the curriculum chooses
    # from step 1 with the probe and not at all without it — is tested at step 0 and in 20-step runs
    'mmrlvr train configs/demo-tiny.yaml output_dir=runs/probe-sgac data.train_size=2000 max_steps=20 '
    'eval.at_start=false eval.every=0 eval.at_end=false progress=false '
    'rollout.sampler=disagreement': STEP1_SGAC,
    'mmrlvr train configs/demo-tiny.yaml output_dir=runs/noprobe-sgac data.train_size=2000 max_steps=20 '
    'eval.at_start=false eval.every=0 eval.at_end=false progress=false '
    'rollout.sampler=disagreement "rollout.sampler_params={probe_samples: 0}"': STEP1_SGAC,
    'mmrlvr train configs/demo-tiny.yaml output_dir=runs/probe-trace data.train_size=2000 max_steps=20 '
    'eval.at_start=false eval.every=0 eval.at_end=false progress=false '
    'rollout.sampler=budget': STEP1_TRACE,
    'mmrlvr train configs/demo-tiny.yaml output_dir=runs/noprobe-trace data.train_size=2000 max_steps=20 '
    'eval.at_start=false eval.every=0 eval.at_end=false progress=false '
    'rollout.sampler=budget "rollout.sampler_params={probe_samples: 0}"': STEP1_TRACE,
    "mmrlvr train configs/demo-tiny.yaml output_dir=runs/opd-teacher max_steps=60":
        ("the recipe's first run (a tiny run; the test trains its teacher 2 steps)",
         ("tests/test_opd.py::test_two_steps_with_the_students_own_earlier_checkpoint_as_teacher", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml output_dir=runs/opd algo.advantage=opd "algo.advantage_params={teacher: '
    'runs/opd-teacher/checkpoints/step-00000060}" algo.kl_coef=0':
        ("the option trains 2 steps with the student's own earlier checkpoint as teacher (and with a larger tiny "
         "teacher); the advantages recomputed from the records",
         ("tests/test_opd.py::test_two_steps_with_the_students_own_earlier_checkpoint_as_teacher",
          "tests/test_opd.py::test_two_steps_with_a_larger_teacher_of_the_family", T_DRY)),
    'mmrlvr train configs/demo-tiny.yaml "algo.aux_losses=[{name: forward_ce, weight: 0.1, params: '
    '{horizon: progressive}}]"':
        ("the option trains 20 steps (tiny run, same keys, horizon_steps 20) and resumes exactly",
         ("tests/test_label_free_and_passk.py::test_trains_20_steps_and_resumes_exactly", T_DRY)),
    "OMP_NUM_THREADS=1 python benchmarks/seed_study.py --task count --steps 20 --seeds 0 1 2 --eval-size 100 --k 4 "
    "--arms lr0 grpo acpo grpo_epochs2 delta popo poise lora_default lora_rlpo lora_rlmo lora_milora":
        ("run by hand (docs/methods.md table); the script runs two arms, resumes and plots in a test; options "
         "checked; every arm's option trains in tests", (T_SEED_STUDY, T_OPTS)),
    "OMP_NUM_THREADS=1 python benchmarks/seed_study.py --task count --steps 40 --seeds 0 1 2 --eval-size 300 --k 8 "
    "--arms lr0 grpo majority_vote cocov cocov_verify pass_at_k gated_process forward_ce forward_ce@wall "
    "forward_ce_h25 forward_ce_prog":
        ("run by hand (docs/methods.md tables); the script runs two arms, resumes, plots and pairs in tests; every "
         "arm's option trains 20 steps in tests", (T_SEED_STUDY, T_OPTS)),
    "OMP_NUM_THREADS=1 python benchmarks/seed_study.py --task count --steps 40 --seeds 0 1 2 --eval-size 300 --k 8 "
    "--train-size 128 --arms lr0 grpo disagreement budget tree tree@2xprompts npo":
        ("run by hand (docs/methods.md tables); the script runs two arms, resumes, plots and pairs in tests; every "
         "arm's option trains 20 steps in tests", (T_SEED_STUDY, T_OPTS)),
    "OMP_NUM_THREADS=1 python benchmarks/seed_study.py --task count_chatter --steps 20 --seeds 0 1 2 --eval-size 100 "
    "--k 4 --arms lr0 grpo delta popo poise":
        ("run by hand (docs/methods.md table); the script is tested on count", (T_SEED_STUDY, T_OPTS)),
    "python benchmarks/acpo_offpolicy.py --steps 8":
        ("run by hand (docs/methods.md figures); options checked, the diagnostics tested",
         (T_OPTS, "tests/test_acpo.py::test_offpolicy_diagnostics_per_old_probability_bin_hand_worked")),
    # ---- docs/credit.md (and configs/credit-vepo-tiny.yaml's header)
    CREDIT: (RUN + " (2 steps)", (cfg_run("credit-vepo-tiny.yaml"), T_DRY)),
    CREDIT + " credit.scheme=vppo": (RUN + " (2 steps)", (T_DOC + "test_credit_vppo_scheme_trains",)),
    "python benchmarks/credit_study.py":
        (RUN + " (1 arm, 2 steps, cold model)", ("tests/test_credit_study.py::test_study_runs_one_arm_two_steps",)),
    "python demos/credit_study.py": (RUN + " (2 steps)", (T_DOC + "test_credit_study_demo_runs",)),
    "python benchmarks/reward_agreement.py":  # docs/rewards.md; its corpus table is tests/test_rewards_corpus.py
        (RUN + " (cost and nesting tables, 1 pass)", ("tests/test_rewards_corpus.py::test_agreement_benchmark_runs",)),
    "python benchmarks/zoom_no_tool.py":  # docs/multiturn.md: run by hand (its figures are there); ~8 min on 2 cores
        ("the one-turn warm start of a tool task it builds is tested (2 steps)",
         ("tests/test_models_warmstart.py::test_a_short_tool_task_warm_start_samples_with_its_tool",)),
    "python benchmarks/credit_overhead.py --settings shape_true":  # 40 min on 2 cores: run by hand
        ("its measured steps run for every arm and the memory figure moves by a planted tensor's size",
         ("tests/test_credit_benchmark.py::test_a_measured_step_reports_the_tensor_peak_and_where_it_was",
          "tests/test_tensor_memory.py::test_a_planted_tensor_moves_a_real_trainer_steps_peak_by_its_size")),
    "python benchmarks/credit_overhead.py":  # the harness (one subprocess per arm for memory) is run by hand
        ("its timed trainer steps run for every arm",
         ("tests/test_credit_benchmark.py::test_every_arm_runs_the_same_rollouts_with_its_credit",)),
    CREDIT + ' "plugins=[my_credit.py]" credit.scheme=lowest_entropy "credit.scheme_params={rho: 0.3}"':
        (RUN + " (2 steps, my_credit.py from the doc)", (T_DOC + "test_credit_plugin_example_trains",)),
    "mmrlvr inspect": ("the inspector's CLI and server are tested", T_INSPECT),
    # ---- docs/performance.md (benchmarks run by hand: tens of minutes at real shapes; their parts are tested)
    "mmrlvr demo --seed S": ("run by hand, seeds 0-3, old and new code side by side; the demo runs in a test and "
                             "--seed is one of its options", (T_OPTS, T_DEMO)),
    "python benchmarks/demo_stages.py --out DIR": ("run by hand, old and new code one after the other; it wraps the "
                                                  "demo, which runs in a test", (T_DEMO,)),
    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/step_vs_trl.py":
        ("run by hand; options checked, the stand-ins and fused path tested",
         (T_OPTS, "tests/test_train_fused_logprobs.py::test_shape_true_standin_equals_todays_path")),
    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/step_vs_trl.py --shape qwen2_5_vl_3b "
    "--image-tokens 256 --new-tokens 128 --steps 2 --rounds 1":
        ("run by hand; options checked, the stand-ins and fused path tested",
         (T_OPTS, "tests/test_train_fused_logprobs.py::test_shape_true_standin_equals_todays_path")),
    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/optim_step.py":
        ("run by hand; options checked, the optimiser tested",
         (T_OPTS, "tests/test_train_optim.py::test_fused_on_cpu_and_close_to_the_unfused_numerics")),
    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/prefix_sharing.py":
        ("run by hand; options checked, the shared pass tested",
         (T_OPTS, "tests/test_train_fused_logprobs.py::test_shared_prefix_reference_pass_equals_the_full_pass")),
    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/prefix_sharing.py --grad":
        ("run by hand; options checked, the shared policy pass tested",
         (T_OPTS, "tests/test_train_fused_logprobs.py::"
                  "test_policy_pass_with_a_shared_prefix_has_the_whole_rows_values_and_gradients",
          "tests/test_train_prefix_sharing.py::test_a_step_with_shared_prefixes_equals_the_whole_row_step")),
    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/checkpointing_memory.py --shape qwen2_5_vl_3b "
    "--layers 2 --rows 2":
        ("run by hand; options checked, checkpointing tested",
         (T_OPTS, "tests/test_models_checkpointing.py::test_checkpointing_recomputes_layers_with_the_same_gradients")),
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/stage_memory.py --shape qwen2_5_vl_3b --image-tokens 256 "
    "--new-tokens 128":
        ("run by hand; options checked, the memory changes it reports tested",
         (T_OPTS, "tests/test_models_tied_embedding.py::test_the_backward_no_longer_allocates_a_second_vocabulary_sized_gradient",
          "tests/test_train_fused_logprobs.py::test_head_gradient_in_vocabulary_blocks_is_bit_identical")),
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/stage_memory.py --shape qwen2_5_vl_3b --image-tokens 256 "
    "--new-tokens 128 --heap-mmap-threshold-mib 0":
        ("run by hand (A/B of the policy pass's allocator setting); options checked, the setting tested",
         (T_OPTS, "tests/test_train_host_memory.py::test_freed_activations_stay_resident_by_default_and_go_back_in_the_policy_pass",
          "tests/test_train_host_memory.py::test_a_pass_computes_the_same_bits_with_mapped_buffers")),
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/generate_speed.py --shape qwen2_5_vl_3b --image-tokens 256 "
    "--new-tokens 128 --rounds 2":
        ("run by hand (3B stand-in); options checked, the sampler's stream tested",
         (T_OPTS, "tests/test_rollout_hf.py::test_noise_drawn_ahead_is_the_per_position_stream")),
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/cpu_linear.py":
        ("run by hand (1.2 GB weights); options checked, what it times tested",
         (T_OPTS, "tests/test_algos_cpu_linear.py::test_linear_takes_onednn_and_matches",
          "tests/test_algos_cpu_linear.py::test_strided_inputs_and_matmul")),
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/fused_head_memory.py":
        ("run by hand (3B widths); a test runs it at small shapes",
         (T_OPTS, "tests/test_bench_fused_head_memory.py::test_small_shapes_print_the_transient")),
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/head_roofline.py":
        ("run by hand; a test runs it at small shapes",
         (T_OPTS, "tests/test_bench_head_roofline.py::test_small_shapes_print_the_floors_from_the_measured_figures")),
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/checkpointing_memory.py --shape qwen2_5_vl_3b --layers 4 --rows 8 --lora":
        ("run by hand; options checked, checkpointing with LoRA and the frozen-head gradient tested",
         (T_OPTS, "tests/test_models_checkpointing.py::test_checkpointing_recomputes_layers_with_the_same_gradients",
          "tests/test_train_fused_logprobs.py::"
          "test_frozen_head_gradient_equals_the_logits_path_and_never_rereads_the_head")),
    "python benchmarks/checkpointing_memory.py --shape qwen2_5_vl_3b --layers 4 --rows 8 --image-tokens 256 "
    "--new-tokens 512":
        ("run on a GPU by benchmarks/gpu_check.sh (part ckpt); options checked, checkpointing tested",
         (T_OPTS, "tests/test_models_checkpointing.py::test_checkpointing_recomputes_layers_with_the_same_gradients",
          "tests/test_gpu_check_script.py::test_gpu_check_without_cuda_says_so_and_exits_2")),
    "OMP_WAIT_POLICY=PASSIVE DIR/bin/python benchmarks/generate_speed.py --engine vllm --shape qwen2_5_vl_3b "
    "--rounds 2": ("run by hand in the vLLM environment (3B stand-in); options checked", (T_OPTS, T_VLLM_DEMO)),
    "OMP_WAIT_POLICY=PASSIVE DIR/bin/python benchmarks/generate_speed.py --engine vllm --rounds 3":
        ("run by hand in the vLLM environment; options checked, the engine's parts tested there",
         (T_OPTS, T_VLLM_DEMO)),
    "OMP_WAIT_POLICY=PASSIVE python benchmarks/generate_speed.py":
        ("run by hand; options checked, the sampler's stream tested",
         (T_OPTS, "tests/test_rollout_hf.py::test_noise_drawn_ahead_is_the_per_position_stream")),
    # ---- docs/inspector.md, docs/training.md
    "mmrlvr train CONFIG.yaml [key=value ...] [--resume]": (SYNOPSIS, (T_OPTS, T_RESUME)),
    "mmrlvr train CONFIG --resume": (RUN, (T_RESUME,)),
    "mmrlvr train configs/demo-tiny.yaml algo.loss=ppo credit.scheme=vep rollout.top_p=2 --dry-run":
        (RUN, (T_CLI + "test_doc_dry_run_reports_every_problem",)),
    "mmrlvr train configs/qwen2_5_vl_3b_geometry3k_lora.yaml --dry-run --config-only": (RUN, (T_DRY,)),
    "mmrlvr train configs/demo-tiny.yaml max_steps=500 --resume":
        (RUN + " (shortened: max_steps 2 on a tiny run)",
         (T_RUN_DIR + "test_real_run_no_secret_refused_rerun_resume_overwrite", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml --overwrite":
        (RUN + " (on a tiny run)", (T_RUN_DIR + "test_real_run_no_secret_refused_rerun_resume_overwrite", T_DRY)),
    "mmrlvr train configs/demo-tiny.yaml --resume --allow-config-change seed=1":
        (RUN + " (checked without training)",
         (T_RUN_DIR + "test_resume_refuses_changes_that_break_exactness", T_DRY)),
    # ---- docs/scaling.md
    "torchrun --nproc_per_node 2 -m mmrlvr.cli train configs/demo-tiny.yaml":
        (RUN + " (shortened: 2 steps of the config itself, and of a small one)",
         ("tests/test_distributed_demo.py::test_demo_tiny_on_two_ddp_ranks_exports_what_one_process_exports",
          T_TWO_PROC, T_OPTS)),
    "python -m pytest -q -n 0 -m matrix tests/test_multiprocess_matrix.py":
        (RUN + " (by CI after the suite: .ci/run)",
         ("tests/test_multiprocess_matrix.py::test_the_matrix_covers_every_registered_option", T_OPTS)),
    "torchrun --nproc_per_node 2 -m mmrlvr.cli train configs/demo-tiny.yaml distributed.strategy=fsdp2":
        (RUN + " (shortened: 2 steps of a tiny config)", (T_DIST + "test_fsdp2_training_run_on_two_ranks_equals_one_process",
                                                         T_OPTS)),
    "torchrun --nnodes 2 --nproc_per_node 1 --node_rank 0 --master_addr 127.0.0.1 --master_port 29500 "
    "-m mmrlvr.cli train configs/demo-tiny.yaml":
        (RUN + " (with node 1's command; shortened)", (T_DIST + "test_two_nodes_of_one_process_over_loopback_equal_one_process",
                                                      T_OPTS)),
    "torchrun --nnodes 2 --nproc_per_node 1 --node_rank 1 --master_addr 127.0.0.1 --master_port 29500 "
    "-m mmrlvr.cli train configs/demo-tiny.yaml":
        (RUN + " (with node 0's command; shortened)", (T_DIST + "test_two_nodes_of_one_process_over_loopback_equal_one_process",
                                                      T_OPTS)),
    "accelerate launch --config_file accelerate_cpu2.yaml -m mmrlvr.cli train configs/demo-tiny.yaml":
        (RUN + " (the file as the doc shows it; shortened)",
         (T_DIST + "test_accelerate_launch_with_a_config_file_starts_two_processes", T_OPTS)),
    "mmrlvr export runs/demo --out exports/demo --merge":
        (RUN + " (on a sharded checkpoint)", (T_DIST + "test_fsdp2_two_ranks_hold_half_of_each_tensor_and_train_like_one_process",
                                            "tests/test_export.py::test_lora_merged_export_is_a_plain_model")),
    "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/scaling.py --shape qwen2_5_vl_3b --layers 1 "
    "--vocab 8192 --steps 3":
        ("run by hand; options checked, FSDP2 sharding and state bytes tested",
         (T_OPTS, T_DIST + "test_fsdp2_two_ranks_hold_half_of_each_tensor_and_train_like_one_process")),
    "python benchmarks/scaling.py --paper": (RUN, (T_OPTS, T_DIST + "test_paper_memory_table")),
    "python benchmarks/scaling.py --prefix-sharing --steps 8 --rounds 2":  # run by hand: ~2 min, figures in the doc
        ("run by hand; what it times (2 ranks keep prefix sharing and equal one process) is tested",
         (T_DIST + "test_two_ranks_keep_prefix_sharing_and_equal_one_process",)),
    # what not to run: a lone process of these launches stops with exit 2 instead of training a copy
    "accelerate launch --num_processes 2 --cpu":
        (RUN + " (refused: exit 2, one message)",
         (T_DIST + "test_accelerate_cpu_launch_of_two_processes_stops_instead_of_training_a_copy",)),
    "accelerate launch --num_processes N --cpu":
        (RUN + " (N = 2; refused: exit 2, one message)",
         (T_DIST + "test_accelerate_cpu_launch_of_two_processes_stops_instead_of_training_a_copy",)),
    "accelerate launch --cpu --num_machines 2 ...":
        (RUN + " (refused: the parent's flags are read)",
         (T_DIST + "test_a_lone_process_of_a_multi_process_launch_stops_with_the_launch_that_works",)),
    "mmrlvr export": (RUN, (T_DIST + "test_fsdp2_two_ranks_hold_half_of_each_tensor_and_train_like_one_process",)),
    # ---- docs/integrations.md
    'MMRLVR_VERL=$(python -c "import mmrlvr.integrations.verl as m; print(m.__file__)")':
        (RUN, (T_DOC + "test_verl_reward_path_command_prints_the_module",)),
    "python3 -m verl.trainer.main_ppo ... custom_reward_function.path=$MMRLVR_VERL "
    "custom_reward_function.name=compute_score +custom_reward_function.reward_kwargs.reward=auto_accuracy "
    "+custom_reward_function.reward_kwargs.params.template=boxed":
        (VERL, (T_VERL + "TestNaiveManager::test_geo3k_style_row_with_boxed_answers",
                T_VERL + "test_doc_reward_file_loads_and_scores_like_verl")),
    "reward_model.reward_manager=batch custom_reward_function.path=$MMRLVR_VERL "
    "custom_reward_function.name=compute_score_batch +custom_reward_function.reward_kwargs.reward=consistency "
    "+custom_reward_function.reward_kwargs.params.variant=care +custom_reward_function.reward_kwargs.params.judge=rule":
        (VERL, (T_VERL + "TestBatchManager::test_groups_follow_the_prompt_not_the_position",)),
    "pip install trl": (INSTALL + "; TRL is installed here and its GRPOTrainer runs our rewards", (T_TRL,)),
    "mmrlvr tiny build --family qwen2_5_vl --out runs/tiny-vlm --warm-start": (RUN, (T_WARM_CLI,)),
    "mmrlvr tiny build --family qwen2_5_vl --out DIR --warm-start --force": (RUN, (T_WARM_CLI,)),
    # ---- docs/real-checkpoint.md (and the Qwen configs' headers)
    "pip install torch": (INSTALL + " + GPU (a CUDA build)", (T_PYPROJECT,)),
    QWEN_3B + " " + GEO_DATA: (GPU, (T_DRY, T_CFG_LOAD, *T_GPU_CPU)),
    QWEN_7B + " " + MODEL_7B + " data.train=... data.eval=...": (ON_8_GPUS, (T_DRY, T_CFG_LOAD, T_TWO_PROC, *T_GPU_CPU)),
    QWEN_7B + " " + MODEL_7B + " " + GEO_DATA: (ON_8_GPUS, (T_DRY, T_CFG_LOAD, T_TWO_PROC, *T_GPU_CPU)),
    "bash benchmarks/gpu_check.sh": (GPU + "; the script exists, the vLLM engine's CPU parts are tested",
                                     (T_OPTS, T_VLLM + "test_merged_state_dict_uses_base_names_and_merges_lora",
                                      "tests/test_gpu_check_script.py::test_gpu_check_without_cuda_says_so_and_exits_2")),
    "bash benchmarks/gpu_check.sh tests vllm": (GPU + "; without CUDA it says so and exits 2",
                                                ("tests/test_gpu_check_script.py::"
                                                 "test_gpu_check_without_cuda_says_so_and_exits_2",)),
    # ---- docs/rubric-rewards.md, docs/rubrics.md
    "mmrlvr rubric validate|preview|score|agreement": (SYNOPSIS, (T_OPTS, T_TRANSCRIPTS)),
    "mmrlvr rubric score": (RUN, (T_TRANSCRIPTS, "tests/test_rubric_cli.py::test_score_table")),
    "mmrlvr rubric agreement": (RUN, (T_TRANSCRIPTS, "tests/test_rubric_cli.py::test_agreement")),
    "mmrlvr rubric": (RUN, (T_TRANSCRIPTS,)),
    "python demos/rubric_authoring.py --out /tmp/rubric-demo": (DEMO, (T_RUBRIC_DEMO,)),
    "mmrlvr rubric validate FILE [FILE ...]": (SYNOPSIS, (T_OPTS, T_TRANSCRIPTS)),
    "mmrlvr rubric preview FILE --data DATA [--sample ROW] [--response TEXT]": (SYNOPSIS, (T_OPTS, T_TRANSCRIPTS)),
    "mmrlvr rubric score FILE --responses R.jsonl [--data DATA] [--judge NAME --judge-param K=V ...] [--votes K] "
    "[--cache judge.sqlite] [--aggregation rar|hierarchical] [--json OUT] [--quiet]":
        (SYNOPSIS, (T_OPTS, T_TRANSCRIPTS, "tests/test_rubric_cli.py::test_score_table")),
    "mmrlvr rubric agreement FILE --responses R.jsonl [--data DATA] --judge NAME [--judge-param K=V ...] "
    "[--judge2 NAME --judge2-param K=V ...] [--votes K]": (SYNOPSIS, (T_OPTS, T_TRANSCRIPTS)),
    "mmrlvr rubric validate rubrics/chart_qa.yaml /tmp/rt/chart_qa_typo.yaml": (RUN + ", output compared",
                                                                                 (T_TRANSCRIPTS,)),
    "mmrlvr rubric preview - --data scene.jsonl --sample 0 "
    '--response "<think>I see 3 yellow.</think><answer>3</answer>"': (RUN + ", output compared", (T_TRANSCRIPTS,)),
    f"mmrlvr rubric score {RUBRIC_IO} --aggregation hierarchical --judge openai --judge-param {JUDGE_URL} "
    "--judge-param model=rule": (RUN + ", output compared", (T_TRANSCRIPTS,)),
    f"mmrlvr rubric agreement {RUBRIC_IO} --votes 3 --judge openai --judge-param {JUDGE_URL} --judge-param model=rule "
    f"--judge2 openai --judge2-param {JUDGE_URL} --judge2-param model=coin":
        (RUN + ", output compared", (T_TRANSCRIPTS,)),
    # ---- configs/*.yaml headers (the rest are above)
    "mmrlvr train configs/demo-tiny.yaml": (RUN + " (2 steps)", (cfg_run("demo-tiny.yaml"), T_DRY)),
    "mmrlvr demo": (RUN + " (3 steps)", (T_DEMO,)),
    "mmrlvr train configs/demo-tiny.yaml max_steps=50 seed=1":
        (RUN + " (2 steps); the overrides resolve", (cfg_run("demo-tiny.yaml"), T_DRY)),
    "mmrlvr train configs/grounding-tiny.yaml": (RUN + " (2 steps)", (cfg_run("grounding-tiny.yaml"), T_GROUNDING)),
    "mmrlvr inspect runs/grounding-tiny":
        ("the inspector's CLI, server and a browser on boxes are tested",
         (*T_INSPECT, "tests/test_inspector_browser.py::test_browser_navigates_to_a_sample_with_boxes_and_heatmap")),
    "mmrlvr train configs/rubric-tiny.yaml": (RUN + " (2 steps)", (cfg_run("rubric-tiny.yaml"), T_DRY)),
    # ---- docs/multiturn.md, configs/zoom-tiny.yaml
    "mmrlvr train configs/zoom-tiny.yaml": (RUN + " (2 steps, from the count warm start: tests/test_configs_run.py)",
                                            (cfg_run("zoom-tiny.yaml"), T_DRY)),
    "OMP_NUM_THREADS=1 python benchmarks/seed_study.py --config configs/zoom-tiny.yaml --task zoom --steps 100 "
    "--seeds 6 7 8 --lr 1e-4 --k 4 --eval-size 400 --arms lr0 grpo vepo --out runs/zoom_study":
        ("run by hand (docs/multiturn.md table, ~50 min on 2 cores, two runs at a time); the script runs two arms, "
         "resumes and plots in a test; the config trains two steps", (T_SEED_STUDY, cfg_run("zoom-tiny.yaml"))),
    "OMP_NUM_THREADS=1 python benchmarks/zoom_breakdown.py runs/zoom_study/grpo-seed6 runs/zoom_study/vepo-seed6 "
    "--control runs/zoom_study/grpo-seed6":
        (RUN + " (--limit 2 --k 2, on a one-step run of the config)",
         ("tests/test_zoom_breakdown.py::test_breakdown_runs_on_a_real_run_and_its_control",)),
    "mmrlvr inspect runs/zoom-tiny": ("the inspector's turn view in a browser on a real tool run is tested",
                                      (*T_INSPECT, T_TURNS)),
    "mmrlvr inspect runs/zoom-tiny: the turn view": ("the inspector's turn view in a browser on a real tool run",
                                                     (*T_INSPECT, T_TURNS)),
    "mmrlvr train CONFIG --dry-run": (SYNOPSIS, (T_DRY,)),
    "mmrlvr train configs/rubric-tiny.yaml max_steps=50 seed=1":
        (RUN + " (2 steps); the overrides resolve", (cfg_run("rubric-tiny.yaml"), T_DRY)),
    # ---- demos/*.py docstrings
    "python demos/credit_study.py [--steps 20] [--out runs/demo-credit] [any credit_study.py option]":
        (RUN + " (--steps 2 ...)", (T_DOC + "test_credit_study_demo_runs", T_OPTS)),
    "python demos/grounding_inspector.py [--steps 60] [--out runs/demo-grounding] [--no-control] [--no-inspect]":
        (DEMO + " (--steps 2 --no-control --no-inspect)", (T_GROUNDING, T_OPTS)),
    "python demos/grounding_inspector.py --steps 60 --no-inspect":
        ("run by hand (the figures in the demo's docstring); " + DEMO + " (--steps 2 --no-control --no-inspect)",
         (T_GROUNDING, T_OPTS)),
    # ---- docs/inspector.md
    "mmrlvr demo --steps 40": (RUN + " (mmrlvr demo, 3 steps)", (T_DEMO,)),
    "mmrlvr inspect runs/demo": ("the inspector's CLI, server and its screens in a browser are tested",
                                 (*T_INSPECT, T_SCREENS)),
    "mmrlvr inspect runs/demo --host 0.0.0.0 --auth ann:correct-horse":
        ("the CLI (launch stubbed) and a server with a login are tested", T_EXPOSED),
    "MMRLVR_INSPECT_AUTH=ann:correct-horse mmrlvr inspect runs/demo --host 0.0.0.0":
        ("the CLI (launch stubbed) reads the variable", T_EXPOSED),
    "mmrlvr inspect runs/demo --host 0.0.0.0 --insecure": ("the CLI (launch stubbed) is tested", T_EXPOSED),
    "OMP_NUM_THREADS=1 python benchmarks/inspector_scale.py --out /tmp/bench --keep":
        ("a timing benchmark (run by hand); its file and options checked", (T_OPTS,)),
    "python demos/rubric_authoring.py [--out DIR]": (DEMO, (T_RUBRIC_DEMO, T_OPTS)),
}


# ------------------------------------------------------------------------------------------ extraction

def _strip_comment(line: str) -> str:
    """``line`` without a shell comment (a ``#`` at the start or after whitespace, outside quotes)."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _norm(cmd: str) -> str:
    return " ".join(cmd.split())


def _logical_lines(lines: list[str]) -> list[str]:
    """Join backslash continuations (after stripping comments)."""
    out, buf = [], ""
    for raw in lines:
        s = _strip_comment(raw).rstrip()
        if s.endswith("\\"):
            buf += s[:-1] + " "
            continue
        out.append(buf + s)
        buf = ""
    if buf:
        out.append(buf)
    return [_norm(x) for x in out if x.strip()]


def _block_commands(lang: str, body: str) -> list[tuple[str, str]]:
    """(kind, command) for one fenced block."""
    lines = body.splitlines()
    if lang in ("bash", "sh", "shell", "zsh"):
        return [("bash", c) for c in _logical_lines(lines)]
    if lang not in ("console", "", "text"):
        return []
    transcript = lang == "console" or any(line.startswith("$ ") for line in lines)
    found: list[tuple[str, str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):  # a prompt line, and its continuations (the rest is output)
            cont = [line[2:]]
            while cont[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                cont.append(lines[i])
            found += [("console", c) for c in _logical_lines(cont)]
        elif not transcript and re.match(CMD_START, line):  # a synopsis line; indented lines continue it
            parts = [line]
            while i + 1 < len(lines) and lines[i + 1].startswith(" ") and lines[i + 1].strip():
                i += 1
                parts.append(lines[i])
            found.append(("synopsis", _synopsis(" ".join(parts))))
        i += 1
    return found


def _synopsis(line: str) -> str:
    """A usage line without its trailing description (after 3+ spaces, starting with a lowercase word)."""
    pieces = re.split(r" {3,}", line)
    keep = [pieces[0]]
    for piece in pieces[1:]:
        if re.match(r"[a-z][a-z]+ ", piece):
            break
        keep.append(piece)
    return _norm(" ".join(keep))


INLINE_RE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
PROSE_RE = re.compile(r"(?<![\w/.-])(" + CMD_START + r"[^`()]*?)(?= {3,}|[`()]|$)")


def md_commands(path: Path) -> list[tuple[str, str]]:
    text = path.read_text(encoding="utf-8")
    found = []
    for m in re.finditer(r"^```(\w*)[^\n]*\n(.*?)^```", text, re.M | re.S):
        found += _block_commands(m.group(1), m.group(2))
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    for m in INLINE_RE.finditer(prose):
        if re.match(CMD_START, m.group(1)):  # a command with arguments, not a bare program name
            found.append(("inline", _norm(m.group(1))))
    return found


def _prose_commands(lines: list[str]) -> list[str]:
    joined, buf = [], ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1].strip() + " "
            continue
        joined.append(buf + line.strip())
        buf = ""
    return [_norm(m.group(1)) for line in joined for m in PROSE_RE.finditer(line)]


def config_commands(path: Path) -> list[tuple[str, str]]:
    comments = [line.split("#", 1)[1] for line in path.read_text(encoding="utf-8").splitlines()
                if line.lstrip().startswith("#")]
    return [("comment", c) for c in _prose_commands(comments)]


def demo_commands(path: Path) -> list[tuple[str, str]]:
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return [("docstring", c) for c in _prose_commands(doc.splitlines())]


@lru_cache(maxsize=1)
def doc_commands() -> tuple[tuple[str, str, str], ...]:
    """(file relative to the repo, kind, command) for every command in the docs, configs and demos."""
    out = []
    for path, fn in [*((p, md_commands) for p in DOCS), *((p, config_commands) for p in CONFIGS),
                     *((p, demo_commands) for p in DEMOS)]:
        rel = str(path.relative_to(ROOT))
        out += [(rel, kind, cmd) for kind, cmd in fn(path)]
    return tuple(out)



# ------------------------------------------------------------------------------------------ the table holds

def test_extraction_finds_commands_in_every_kind_of_place():
    found = {(f, c) for f, _, c in doc_commands()}
    # one of each: a bash block, a console transcript, a synopsis, an inline span, a config header, a docstring
    assert ("docs/credit.md", "mmrlvr train configs/credit-vepo-tiny.yaml credit.scheme=vppo") in found
    assert any(f == "docs/rubrics.md" and c.startswith("mmrlvr rubric score - --data scene.jsonl") for f, c in found)
    assert ("README.md", "mmrlvr inspect RUN_DIR [--host 127.0.0.1] [--port 7860] [--auth USER:PASS | --insecure]") in found
    assert ("README.md", "mmrlvr train --help-config") in found
    assert ("configs/demo-tiny.yaml", "mmrlvr demo") in found
    assert ("demos/rubric_authoring.py", "python demos/rubric_authoring.py [--out DIR]") in found
    # comments go, env-var prefixes and continuation lines stay
    assert ("docs/consistency.md", "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE python benchmarks/consistency_study.py") \
        in found
    assert any(c.endswith("data.eval=/data/geometry3k/test.parquet") and f == "docs/real-checkpoint.md"
               for f, c in found)


def test_every_doc_command_is_mapped():
    found = doc_commands()
    unmapped = [f"{f}: {c}" for f, _, c in found if c not in COMMANDS]
    assert not unmapped, ("doc commands with no entry in COMMANDS (tests/test_doc_commands.py): add a test "
                          "that runs each, or map it to the test that does:\n  " + "\n  ".join(unmapped))
    stale = sorted(set(COMMANDS) - {c for _, _, c in found})
    assert not stale, "COMMANDS entries no doc has any more:\n  " + "\n  ".join(stale)


def _defined(path: Path, chain: list[str]) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    for name in chain:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name), None)
        if node is None:
            return False
        body = node.body
    return True


def test_every_mapped_test_exists():
    missing = []
    for cmd, (how, tests) in COMMANDS.items():
        assert how and tests, cmd
        for ref in tests:
            file, *chain = re.sub(r"\[[^\]]*\]$", "", ref).split("::")  # a parametrised case: its function
            if not file.startswith("tests/") or not chain or not (ROOT / file).is_file() \
                    or not _defined(ROOT / file, chain):
                missing.append(f"{ref}  (for: {cmd})")
    assert not missing, "tests named in COMMANDS that do not exist:\n  " + "\n  ".join(missing)


# ------------------------------------------------------------------------------------------ files and options

OPTION_RE = re.compile(r"(?<![\w-])--[A-Za-z][\w-]*")
REPO_PATH_RE = re.compile(r"(?<![\w/.-])((?:configs|demos|benchmarks|docs|rubrics|tests)/[\w.-]+(?:/[\w.-]+)*)")


def _captured(fn) -> str:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            fn()
        except SystemExit:
            pass
    return buf.getvalue()


@lru_cache(maxsize=None)
def _mmrlvr_help(*words: str) -> str:
    return _captured(lambda: mmrlvr_main([*words, "--help"]))


@lru_cache(maxsize=None)
def _script_help(script: str) -> str:
    def run():
        argv = sys.argv
        sys.argv = [script, "--help"]
        try:
            runpy.run_path(str(ROOT / script), run_name="__main__")
        finally:
            sys.argv = argv
    return _captured(run)


@lru_cache(maxsize=None)
def _accelerate_options() -> frozenset[str]:
    from accelerate.commands.launch import launch_command_parser

    return frozenset(o for a in launch_command_parser()._actions for o in a.option_strings)


def _torchrun_options() -> frozenset[str]:
    from torch.distributed.run import get_args_parser

    return frozenset(o for a in get_args_parser()._actions for o in a.option_strings)


def _mmrlvr_problems(cmd: str) -> list[str]:
    words = cmd.split()[1:]
    if not words:
        return []
    sub = words[0]
    help_text = _mmrlvr_help(sub)
    if "usage" not in help_text.lower():
        return [f"`mmrlvr {sub} --help` printed no usage"]
    where = [sub]
    # a sub-command of the sub-command (tiny build, data synth, rubric score): listed in the help
    if len(words) > 1 and re.fullmatch(r"[a-z][a-z_-]*", words[1]) \
            and re.search(rf"^ {{2,}}{words[1]}( |$)|[{{,]{words[1]}[,}}]", help_text, re.M):
        where.append(words[1])
        help_text = _mmrlvr_help(sub, words[1])
    return [f"`mmrlvr {' '.join(where)}` has no option {o}" for o in OPTION_RE.findall(cmd) if o not in help_text]


def command_problems(cmd: str) -> list[str]:
    """What is wrong with a documented command: repo paths that do not exist, options no parser has."""
    problems = [f"no such file {p}" for p in REPO_PATH_RE.findall(cmd) if not (ROOT / p).exists()]
    for seg in (s.strip() for s in cmd.split("&&")):
        seg = re.sub(r"^(?:[A-Z][A-Z0-9_]*=\S+ +)+", "", seg)
        words = seg.split()
        if not words:
            continue
        if words[0] == "mmrlvr":
            problems += _mmrlvr_problems(seg)
        elif words[:2] == ["accelerate", "launch"]:
            own, _, rest = seg.partition(" -m ")
            problems += [f"`accelerate launch` has no option {o}" for o in OPTION_RE.findall(own)
                         if o not in _accelerate_options()]
            if rest.startswith("mmrlvr.cli "):
                problems += _mmrlvr_problems("mmrlvr " + rest[len("mmrlvr.cli "):])
        elif words[0] == "torchrun":
            own, _, rest = seg.partition(" -m ")
            problems += [f"`torchrun` has no option {o}" for o in OPTION_RE.findall(own) if o not in _torchrun_options()]
            if rest.startswith("mmrlvr.cli "):
                problems += _mmrlvr_problems("mmrlvr " + rest[len("mmrlvr.cli "):])
        elif words[0] in ("python", "python3") and len(words) > 1 and words[1].endswith(".py"):
            if (ROOT / words[1]).is_file():
                help_text = _script_help(words[1])
                problems += [f"`{words[1]}` has no option {o}" for o in OPTION_RE.findall(seg) if o not in help_text]
    return problems


def test_doc_commands_name_real_files_and_options():
    bad = [f"{f}: {c}\n      " + "; ".join(p) for f, _, c in doc_commands() if (p := command_problems(c))]
    assert not bad, "doc commands with a missing file or an option the command does not have:\n  " + "\n  ".join(bad)


def test_option_check_catches_a_wrong_option_and_a_wrong_path():
    assert command_problems("mmrlvr tiny build --family qwen2_5_vl --out x --warm-start") == []
    assert command_problems("mmrlvr tiny build --famly qwen2_5_vl") == ["`mmrlvr tiny build` has no option --famly"]
    assert command_problems("python demos/credit_study.py --stepz 2") == [
        "`demos/credit_study.py` has no option --stepz"]
    assert command_problems("accelerate launch --num_proc 2 -m mmrlvr.cli train configs/nope.yaml --resume") == [
        "no such file configs/nope.yaml", "`accelerate launch` has no option --num_proc"]


# ------------------------------------------------------------------------------------------ validated commands

def _dotted(cfg: dict, key: str):
    node = cfg
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def _train_args(cmd: str) -> list[str] | None:
    """The ``mmrlvr train`` arguments of a concrete doc command (None for usage lines and other commands)."""
    words = shlex.split(re.sub(r"^(?:[A-Z][A-Z0-9_]*=\S+ +)+", "", cmd))
    if words[:2] == ["mmrlvr", "train"]:
        args = words[2:]
    elif words[:2] == ["accelerate", "launch"] and "mmrlvr.cli" in words:
        args = words[words.index("mmrlvr.cli") + 2:] if words[words.index("mmrlvr.cli") + 1] == "train" else None
    else:
        return None
    if not args or not args[0].endswith(".yaml") or not (ROOT / args[0]).is_file():
        return None
    return args


#: doc commands that show an error on purpose (their own tests check the error)
DOC_BAD_INPUT_EXAMPLES = {"mmrlvr train configs/demo-tiny.yaml algo.loss=ppo credit.scheme=vep rollout.top_p=2 --dry-run"}


def test_doc_train_commands_resolve_with_dry_run(capsys, monkeypatch):
    """Every concrete ``mmrlvr train`` line (GPU ones too) loads its config, and each override lands."""
    monkeypatch.chdir(ROOT)
    checked = 0
    for f, _, cmd in doc_commands():
        args = _train_args(cmd)
        if args is None or cmd in DOC_BAD_INPUT_EXAMPLES:
            continue
        # --config-only: GPU configs name /models and /data folders this machine lacks
        assert mmrlvr_main(["train", *args, "--dry-run", "--config-only"]) == 0, \
            f"{f}: {cmd}\n{capsys.readouterr().err}"
        cfg = yaml.safe_load(capsys.readouterr().out)
        for override in [a for a in args[1:] if not a.startswith("--")]:  # flags mix with overrides
            key, value = override.split("=", 1)
            try:
                expected = yaml.safe_load(value)
            except yaml.YAMLError:  # a placeholder such as data.train=... stays a string
                expected = value
            assert _dotted(cfg, key) == expected, f"{f}: {cmd}: {key}"
        checked += 1
    assert checked >= 15  # the CPU configs, their variants and the Qwen2.5-VL 3B / 7B lines


def test_help_config_lists_the_keys_the_docs_override(capsys):
    assert mmrlvr_main(["train", "--help-config"]) == 0
    # the config keys come first; the methods and their parameters follow (mmrlvr.methods.help_lines)
    lines = capsys.readouterr().out.split("\nmethods and their parameters")[0].splitlines()
    listed = {line.split(" = ")[0] for line in lines if " = " in line}
    doc_keys = {o.split("=")[0] for _, _, c in doc_commands() if (a := _train_args(c)) for o in a[1:]
                if not o.startswith("--")}
    doc_keys = {k for k in doc_keys if not re.search(r"\.\d+\.", k)}  # list items (rewards.2...) have no line
    assert {"credit.scheme", "consistency.split_advantage", "model.path", "data.train", "max_steps"} <= doc_keys
    assert doc_keys <= listed, doc_keys - listed
    assert all("  # " in line for line in lines if " = " in line)  # each key with its help


def test_install_commands_name_real_extras_and_entry_point():
    import tomllib
    from importlib.metadata import entry_points

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["mmrlvr"] == "mmrlvr.cli:main"
    (ep,) = entry_points(group="console_scripts", name="mmrlvr")
    assert ep.load() is mmrlvr_main
    # `pip install torch` (your CUDA build) then mmrlvr: torch is a dependency left unpinned for that
    torch_req = next(d for d in project["dependencies"] if re.match(r"torch\b", d))
    assert "==" not in torch_req
    extras = set(project["optional-dependencies"])
    used = {e for _, _, c in doc_commands() if "pip install" in c
            for group in re.findall(r"(?:mmrlvr|\.)\[([\w,-]+)\]", c) for e in group.split(",")}
    assert used == {"vllm", "test"} and used <= extras


def test_readme_test_command_is_what_ci_runs():
    readme_bash = [c for f, k, c in doc_commands() if f == "README.md" and k == "bash"]
    test_cmd = next(c for c in readme_bash if c.endswith("python -m pytest -q"))
    assert test_cmd in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_marker_the_suite_deselects_runs_as_its_own_ci_step():
    """The suite's addopts leave some markers out to keep it under its time budget; each must still run in CI."""
    import tomllib

    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    left_out = re.findall(r"not (\w+)", re.search(r"-m '([^']*)'", addopts).group(1))
    assert set(left_out) == {"matrix", "rebuild"}
    ci = (ROOT / ".ci" / "run").read_text()
    for marker in left_out:
        assert re.search(rf"^\. \.venv/bin/activate && .*python -m pytest -q -n 0 -m {marker}$", ci, re.M), marker


def test_ci_builds_the_vllm_environment_and_runs_its_tests():
    """.ci/run builds the environment with vLLM and runs the tests marked vllm there, where a skip is an error."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r'^bash \.ci/vllm-env "\$VLLM_ENV"$', ci, re.M)
    assert re.search(r'^MMRLVR_REQUIRE_VLLM=1 "\$VLLM_ENV/bin/python" -m pytest -q -n 0 -m vllm tests/test_vllm_engine\.py$',
                     ci, re.M)
    assert os.access(ROOT / ".ci" / "vllm-env", os.R_OK)


def test_verl_reward_path_command_prints_the_module():
    (cmd,) = [c for _, _, c in doc_commands() if c.startswith("MMRLVR_VERL=")]
    inner = shlex.split(re.fullmatch(r"MMRLVR_VERL=\$\((.*)\)", cmd).group(1))
    assert inner[0] == "python"
    out = subprocess.run([sys.executable, *inner[1:]], capture_output=True, text=True, check=True, timeout=120)
    path = Path(out.stdout.strip())
    assert path == ROOT / "mmrlvr" / "integrations" / "verl.py"
    import mmrlvr.integrations.verl as verl_module

    # the names the verl config points custom_reward_function.name at
    assert callable(verl_module.compute_score) and callable(verl_module.compute_score_batch)


# ------------------------------------------------------------------------------------------ commands run here

SHORT = ["max_steps=2", "eval.at_start=false", "eval.at_end=false", "eval.every=0", "save_every=0",
         "progress=false", "tensorboard=false"]


def _doc_command(doc: str, start: str) -> list[str]:
    """The one command in ``doc`` that starts with ``start``, as argv."""
    (cmd,) = {c for f, _, c in doc_commands() if f == doc and c.startswith(start)}
    return shlex.split(cmd)


def _train(argv: list[str], out: Path, capsys) -> list[dict]:
    """Run a documented ``mmrlvr train`` argv in this process, two steps into ``out``; its metrics rows."""
    assert argv[:2] == ["mmrlvr", "train"]
    assert mmrlvr_main([*argv[1:], f"output_dir={out}", *SHORT]) == 0
    printed = capsys.readouterr().out
    assert f"run directory: {out}" in printed and json.loads(printed[:printed.index("run directory")]) == \
        {"skipped_steps": 0}
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    return rows


def _records(out: Path) -> list:
    from mmrlvr.store.reader import RolloutReader

    reader = RolloutReader(out)
    return [r for step in (1, 2) for r in reader.read_step(step)]


def test_consistency_follow_correct_thinking_variant_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = _doc_command("docs/consistency.md", "mmrlvr train configs/consistency-tiny.yaml rewards.2")
    rows = _train(argv, tmp_path / "run", capsys)
    assert all(0.0 <= r["inconsistency_rate"] <= 1.0 for r in rows)
    run_cfg = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert run_cfg["rewards"][2]["params"]["variant"] == "follow_correct_thinking"
    records = _records(tmp_path / "run")
    assert len(records) == 2 * 16 * 8  # 2 steps x 16 prompts x G 8
    for r in records:
        c = r.consistency
        # think_credit 0.5: 0.5 + 0.5 * p where the thinking is right, else 0 (whatever the answer)
        expected = 0.5 + 0.5 * (c["p_consistent"] or 0.0) if c["thinking_correct"] else 0.0
        assert r.reward_components["consistency"] == pytest.approx(expected)
    # what this variant adds over the default: right thinking + wrong answer still earns 0.5 (the
    # inconsistent warm start has many; accurate_only would pay 0 there)
    assert any(r.consistency["thinking_correct"] and not r.consistency["answer_correct"]
               and r.reward_components["consistency"] == 0.5 for r in records)


def test_consistency_cora_splitting_trains(tmp_path, capsys, monkeypatch):
    import torch

    from mmrlvr.algos import ADVANTAGES, split_advantages

    monkeypatch.chdir(ROOT)
    argv = _doc_command("docs/consistency.md",
                        "mmrlvr train configs/consistency-tiny.yaml consistency.split_advantage=true consistency.scope")
    _train(argv, tmp_path / "run", capsys)
    records = sorted(_records(tmp_path / "run"), key=lambda r: (r.step, r.prompt_id, r.sample_index))
    step1 = [r for r in records if r.step == 1]
    ids = sorted({r.prompt_id for r in step1})
    group = torch.tensor([ids.index(r.prompt_id) for r in step1])
    total = torch.tensor([r.reward for r in step1])
    cons = torch.tensor([r.reward_components["consistency"] for r in step1])
    stored = torch.tensor([r.advantage for r in step1])
    # A = alpha * grpo(task) + beta * grpo(consistency); task = total - 0.5 * consistency (the reward's weight),
    # alpha 1.0, beta 0.5 (no warm-up) from configs/consistency-tiny.yaml
    torch.testing.assert_close(stored, split_advantages(total - 0.5 * cons, cons, group, 1.0, 0.5), atol=1e-5, rtol=0)
    assert (stored - ADVANTAGES.get("grpo")(total, group)).abs().max() > 1e-3  # not the plain GRPO advantage


def test_consistency_answer_scoped_splitting_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    (cmd,) = {c for f, _, c in doc_commands() if f == "docs/consistency.md" and c == CONSISTENCY
              + " consistency.split_advantage=true"}  # exactly this command, not the scope=all one
    argv = shlex.split(cmd)
    _train(argv, tmp_path / "run", capsys)
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["consistency"]["scope"] == "answer"
    split_rows = 0
    for r in _records(tmp_path / "run"):
        toks, adv = r.response_tokens, r.token_advantage
        if "<answer>" not in toks:
            assert len(set(adv)) <= 1
            continue
        k = len(toks) - 1 - toks[::-1].index("<answer>")  # the *final* answer (answer_char_start: rfind)
        assert len(set(adv[:k])) == 1 and len(set(adv[k:])) == 1  # thinking: A_task; answer: + beta * A_cons
        split_rows += adv[0] != adv[k]
    assert split_rows > 0


def test_credit_vppo_scheme_trains(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = _doc_command("docs/credit.md", "mmrlvr train configs/credit-vepo-tiny.yaml credit.scheme=vppo")
    rows = _train(argv, tmp_path / "run", capsys)
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())["credit"]["scheme"] == "vppo"
    for r in rows:  # VPPO's own metrics (docs/credit.md): the advantage scale has mean 1, so min <= 1 <= max
        assert r["credit/adv_scale_min"] <= 1.0 <= r["credit/adv_scale_max"]
        assert r["credit/dependency_mean"] > 0
    records = _records(tmp_path / "run")
    # VPPO's S_t is stored per token as the vision sensitivity
    assert all(len(r.token_vision_sensitivity) == len(r.response_tokens) > 0 for r in records)


def test_credit_plugin_example_trains(tmp_path):
    """The doc's ``my_credit.py`` and its command, through the real entry point, from the plugin's folder."""
    import math

    code = re.search(r"```python\n(# my_credit\.py\n.*?)```", (ROOT / "docs" / "credit.md").read_text(), re.S).group(1)
    (tmp_path / "my_credit.py").write_text(code)
    argv = _doc_command("docs/credit.md", 'mmrlvr train configs/credit-vepo-tiny.yaml "plugins=')
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "mmrlvr.cli", *argv[1:2], str(ROOT / argv[2]), *argv[3:],
                           "output_dir=run", *SHORT], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        # every kept token is below its response's median entropy; ~30% kept (ceil(0.3 T) of T per response)
        assert r["credit/selected_low_entropy_share"] == 1.0
        assert 0.3 <= r["credit/selected_fraction"] < 0.45
    for rec in _records(tmp_path / "run"):
        kept = sum(w > 0 for w in rec.token_credit_weight)
        assert kept == math.ceil(0.3 * len(rec.response_tokens) - 1e-9), rec.response_tokens


def test_consistency_study_runs_one_arm(tmp_path, capsys, monkeypatch):
    out = tmp_path / "study"
    monkeypatch.setattr(sys, "argv", ["consistency_study.py", "--steps", "2", "--arms", "accurate_only",
                                      "--out", str(out), "data.eval_size=4", "rollout.prompts_per_step=4",
                                      "eval.k=2"])
    runpy.run_path(str(ROOT / "benchmarks" / "consistency_study.py"), run_name="__main__")
    printed = capsys.readouterr().out
    assert "[accurate_only/seed0]" in printed and "acceptance of the default variant (accurate_only)" in printed
    payload = json.loads((out / "results.json").read_text())
    res = payload["results"]["accurate_only/seed0"]
    assert res["steps"] == 2 and 0.0 <= res["after"]["sampled/inconsistency_rate"] <= 1.0
    assert set(payload["acceptance"]["accurate_only/seed0"]) >= {"ir_lowered", "thinking_ok", "pass"}
    table = (out / "results.md").read_text()
    assert "| warm start (seed 0) |" in table and "| accurate_only (seed 0, 2 steps) |" in table


def test_credit_study_demo_runs(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("credit_study_demo", ROOT / "demos" / "credit_study.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    out = tmp_path / "demo-credit"
    # --task count: the warm start the demo and config tests share (the default task has its own, built once)
    assert demo.main(["--steps", "2", "--schemes", "vepo", "--eval-size", "4", "--k", "2", "--probe-prompts", "2",
                      "--task", "count", "--out", str(out)]) == 0
    assert f"wrote {out / 'results.md'}" in capsys.readouterr().out
    payload = json.loads((out / "results.json").read_text())
    assert list(payload["results"]) == ["vepo/seed0"]  # the demo's one seed
    res = payload["results"]["vepo/seed0"]
    assert res["steps"] == 2 and payload["start"]["n"] == 4 and res["after"]["n"] == 4
    assert 0.2 <= res["train"]["credit/selected_fraction"] < 1.0  # VEPO keeps ceil(20%) of each response
    assert payload["probe"]["rollouts"] == 2 * 8  # 2 prompts x G 8 of configs/demo-tiny.yaml
    assert "| vepo |" in (out / "results.md").read_text()
    assert (out / "credit_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _transcripts() -> list[tuple[str, list[str]]]:
    """(command, expected output lines) for each ``$`` line of docs/rubrics.md's console blocks."""
    text = (ROOT / "docs" / "rubrics.md").read_text(encoding="utf-8")
    found = []
    for body in re.findall(r"^```console\n(.*?)^```", text, re.M | re.S):
        lines = body.splitlines()
        cmd, expected = [lines[0][2:]], []
        rest = lines[1:]
        while cmd[-1].rstrip().endswith("\\"):
            cmd.append(rest.pop(0))
        for line in rest:
            assert not line.startswith("$ "), "one command per console block"
            if line.strip() and line.strip() != "..." and "[...]" not in line:  # "..." / "[...]": elided
                expected.append(" ".join(line.split()))
        found.append((_logical_lines(cmd)[0], expected))
    return found


def test_rubric_transcripts_reproduce(tmp_path, capsys, monkeypatch):
    """docs/rubrics.md's validate / preview / score / agreement sessions, rerun on the demo's files against
    the test judge server: every output line the page shows (bar elisions) comes out, in order."""
    from mmrlvr.testing.judge_server import JudgeServer

    spec = importlib.util.spec_from_file_location("rubric_demo", ROOT / "demos" / "rubric_authoring.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    demo.write_scene(tmp_path)  # scene.png + scene.jsonl, as `python demos/rubric_authoring.py --out DIR`
    (tmp_path / "responses.jsonl").write_text("".join(json.dumps({"row": 0, "name": n, "response": r}) + "\n"
                                                      for n, r in demo.RESPONSES.items()))
    (tmp_path / "rubrics").mkdir()
    chart = (ROOT / "rubrics" / "chart_qa.yaml").read_text()
    (tmp_path / "rubrics" / "chart_qa.yaml").write_text(chart)
    (tmp_path / "chart_qa_typo.yaml").write_text(chart.replace("category: important", "catagory: important", 1))
    monkeypatch.chdir(tmp_path)
    transcripts = _transcripts()
    assert [shlex.split(c)[2] for c, _ in transcripts] == ["validate", "preview", "score", "agreement"]
    with JudgeServer() as server:
        def local(s: str) -> str:
            return s.replace("/tmp/rt/", f"{tmp_path}/").replace("http://127.0.0.1:41221/v1", server.base_url)

        for cmd, expected in transcripts:
            argv = shlex.split(local(cmd))
            rc = mmrlvr_main(argv[1:])
            captured = capsys.readouterr()
            got = [" ".join(line.split()) for line in (captured.out + captured.err).splitlines()]
            assert rc == (2 if any("error:" in e for e in expected) else 0), cmd
            at = 0
            for line in map(local, expected):
                line = " ".join(line.split())
                assert line in got[at:], f"{cmd}\nexpected (in order): {line}\ngot:\n" + "\n".join(got)
                at = got.index(line, at) + 1
