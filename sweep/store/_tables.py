"""The profile trace and the screen's simulated settings (see ``_columns`` for the building blocks;
the analysis tables derived from trials are in ``_analysis``)."""

from __future__ import annotations


import polars as pl

from sweep.store._columns import GATE_FIELDS, PROVENANCE, Column, Table

PROFILE = Table(
    name="profile",
    partition_by=("model",),
    unit_of_work="one `sweep profile` run (all its prompts)",
    description=(
        "Per-layer trace of greedy full-depth decoding: one row per (prompt, position, layer). "
        "Position p's hidden states predict the token at p+1; `phase` says whether p was part of the "
        "prompt (prefill) or a generated token fed back (decode). Layers are 1-indexed; layer L is full depth. "
        "All positions of a prompt are captured while decoding, by the forwards the engine runs: a prefill of the "
        "prompt, "
        "then one KV-cached step per generated token (the gates' signals are the ones the engine computes, in any "
        "dtype)."
    ),
    columns=PROVENANCE
    + (
        Column("prompt_id", pl.String(), "", "prompt id within its set (chat/3, HumanEval/0, a JSONL id)"),
        Column("prompt_set", pl.String(), "", "chat | humaneval | jsonl"),
        Column("position", pl.Int32(), "tokens", "0-based position in prompt + generation"),
        Column("phase", pl.String(), "", "prefill | decode"),
        Column("layer", pl.Int32(), "", "exit layer l in 1..L (layers 1..l ran)"),
        Column("token_id", pl.Int64(), "", "input token at this position (rebuilds the sequence)"),
        Column(
            "delta", pl.Float64(), "ratio", "saturation delta ||h_l - h_{l-1}||_2 / ||h_l||_2 (h_0 = embedding output)"
        ),
        Column("margin", pl.Float64(), "logits", "gamma_l: top1 - top2 of z_l = lm_head(final_norm(h_l))"),
        Column("top1", pl.Int64(), "", "argmax of z_l"),
        Column("top1_final", pl.Int64(), "", "argmax of z_L (the model's greedy token)"),
        Column("top1_match", pl.Boolean(), "", "top1 == top1_final"),
        Column("residual_inf", pl.Float64(), "logits", "tau_l: ||z_l - z_L||_inf"),
        Column("cos_hidden", pl.Float64(), "", "cosine of final_norm(h_l) and final_norm(h_L)"),
        Column(
            "cos_logits",
            pl.Float64(),
            "",
            "cosine of the mean-centred logits z_l and z_L (softmax ignores a constant shift; raw logit cosines are "
            "dominated by it)",
        ),
        Column("topk_overlap", pl.Float64(), "fraction", "|topK(z_l) & topK(z_L)| / K"),
        Column("topk", pl.Int32(), "tokens", "K of topk_overlap"),
        Column(
            "prob_margin",
            pl.Float64(),
            "probability",
            "top-1 minus top-2 probability of softmax(z_l) (CALM's softmax response)",
            nullable=True,
        ),
        Column("entropy", pl.Float64(), "nats", "entropy of softmax(z_l)", nullable=True),
        Column(
            "cos_prev",
            pl.Float64(),
            "",
            "cosine of h_l and h_{l-1} (CALM's hidden-state saturation; h_0 = embedding output)",
            nullable=True,
        ),
        Column(
            "pca_delta",
            pl.Float64(),
            "ratio",
            "||P n_l - P n_{l-1}|| / ||P n_l||, n = final_norm(h), P = the lm_head's top pca_k principal directions",
            nullable=True,
        ),
        Column("pca_k", pl.Int32(), "directions", "k of pca_delta", nullable=True),
        Column(
            "kl_final",
            pl.Float64(),
            "nats",
            "KL(softmax(z_L) || softmax(z_l)): the logit lens's distance",
            nullable=True,
        ),
        # with profile.readouts (`sweep fit`'s file): the tuned lens and the exit classifiers, as the gates read them
        Column(
            "readouts_id", pl.String(), "", "the readouts the tuned_* and classifier columns come from", nullable=True
        ),
        Column(
            "tuned_top1", pl.Int64(), "", "argmax of the tuned lens t_l = lm_head(final_norm(T_l h_l))", nullable=True
        ),
        Column("tuned_match", pl.Boolean(), "", "tuned_top1 == top1_final", nullable=True),
        Column("tuned_margin", pl.Float64(), "logits", "top1 - top2 of t_l", nullable=True),
        Column(
            "tuned_prob_margin",
            pl.Float64(),
            "probability",
            "top-1 minus top-2 probability of softmax(t_l)",
            nullable=True,
        ),
        Column("tuned_entropy", pl.Float64(), "nats", "entropy of softmax(t_l)", nullable=True),
        Column("tuned_residual_inf", pl.Float64(), "logits", "||t_l - z_L||_inf", nullable=True),
        Column("tuned_kl_final", pl.Float64(), "nats", "KL(softmax(z_L) || softmax(t_l))", nullable=True),
        Column(
            "classifier_prob",
            pl.Float64(),
            "probability",
            "the exit classifier's p(top-1 of the logit lens at l is the final one)",
            nullable=True,
        ),
        Column(
            "tuned_classifier_prob",
            pl.Float64(),
            "probability",
            "the exit classifier's p(top-1 of the tuned lens at l is the final one)",
            nullable=True,
        ),
    ),
)


SIMULATED = Table(
    name="simulated",
    partition_by=("model",),
    unit_of_work="`sweep run search=screen` (every setting of its grid) or `search=bracket` (the thresholds it kept)",
    description=(
        "Settings replayed on a profile trace instead of run: per decision position (each prompt's last prefill "
        "position and its decode positions) the layer where the gate would exit, as the closed-loop engine decides; "
        "agreement is teacher-forced (the trace's context is full depth, so errors that cascade through the cache in "
        "a closed loop are not seen: it is optimistic). `trial_id` is the id the closed-loop trial of the same setting "
        "has in `trials`, for joining simulated against measured."
    ),
    columns=PROVENANCE
    + (
        Column("trial_id", pl.String(), "", "the id of the closed-loop trial of this setting (join key with `trials`)"),
        Column("source", pl.String(), "", "simulated"),
        Column("sweep_name", pl.String(), "", "the screen sweep"),
        Column("trace_run_id", pl.String(), "", "run_id of the profile trace replayed (in the `profile` table)"),
    )
    + GATE_FIELDS
    + (
        Column("kv_policy", pl.String(), "", "the K/V policy the predicted speedup assumes"),
        Column("prompt_set", pl.String(), "", "chat | humaneval | jsonl"),
        Column("n_prompts", pl.Int32(), "prompts", "prompts in the trace"),
        Column("gen_tokens", pl.Int32(), "tokens", "generated tokens per prompt in the trace"),
        Column("positions", pl.Int32(), "tokens", "decision positions replayed"),
        Column(
            "agreement_tf", pl.Float64(), "fraction", "teacher-forced agreement: exited top-1 equals the final top-1"
        ),
        Column("exit_rate", pl.Float64(), "fraction", "decision positions that exit before layer L"),
        Column("mean_exit_layer", pl.Float64(), "layers", "mean exit layer (L when not exited)"),
        Column("speedup_model", pl.Float64(), "ratio", "speedup the measured cost model predicts on decode positions"),
        Column(
            "on_front",
            pl.Boolean(),
            "",
            "on the simulated Pareto front (speedup_model against agreement_tf, per model)",
        ),
        Column("selected", pl.Boolean(), "", "run closed-loop: on the front or next to its knee"),
    ),
)
