"""The functions return the CLI's --json value for the same flags, bit for bit
(json floats round-trip exactly), except the host fields. Every expected
value comes from an independent run of the `shardlab` tool."""
import pytest

import shardlab
from shardlab.commands import _flag_args

from conftest import cli_json, without_host_fields

CASES = [
    ("train", dict(model="tiny", steps=3)),
    ("train", dict(model="tiny", steps=2, tp=2, pp=2, micro_batches=2, schedule="1f1b")),
    ("train", dict(model="tiny", steps=2, dp=2, zero=1, data="synthetic:markov")),
    ("train", dict(model="tiny-moe", steps=1, dp=2, ep=2, recompute_modules="moe_act,layernorm")),
    ("train", dict(model="tiny-moe", steps=1, dp=2, ep=2, pp=2, schedule="interleaved", vpp=2, micro_batches=4,
                   batch=16, overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)),
    ("train", dict(model="tiny-llama", steps=1, tp=2, sp=True, kv_heads=4, kv_lora_rank=16, q_lora_rank=24,
                   qk_rope_head_dim=4, recompute_modules="mla_up_proj")),
    ("verify", dict(model="tiny", steps=2, tp=2, dp=2)),
    ("collectives", dict(op="all_reduce", ranks=8, min_bytes="1KiB", max_bytes="64KiB")),
    ("generate", dict(model="tiny", prompt_tokens="1,2,3", max_new_tokens=4, tp=2)),
    ("serve", dict(model="tiny", requests=6, prompt_len=16, output_len=4, tp=2)),
    ("generate", dict(model="tiny-llama", prompt_tokens="1,2,3", max_new_tokens=4, tp=2, kv_heads=4, kv_lora_rank=16,
                      qk_rope_head_dim=4)),
    ("serve", dict(model="tiny-llama", requests=6, prompt_len=16, output_len=4, kv_heads=4, kv_lora_rank=16,
                   qk_rope_head_dim=4)),
    ("generate", dict(model="tiny", profile="h100-nvlink", prompt_tokens="1,2,3", max_new_tokens=4, tp=2,
                      precision="fp8", kv_cache_dtype="fp8")),
    ("serve", dict(model="tiny", profile="h100-nvlink", requests=6, prompt_len=16, output_len=4, precision="fp8",
                   kv_cache_dtype="fp8")),
    ("p2p", dict(src=0, dst=1, max_bytes="64KiB")),
]


@pytest.mark.parametrize("command,kwargs", CASES, ids=[f"{c}-{i}" for i, (c, _) in enumerate(CASES)])
def test_result_equals_cli_json(shardlab_bin, command, kwargs):
    result = getattr(shardlab, command)(**kwargs)
    code, expected = cli_json(_flag_args(command, kwargs))
    assert code == 0
    assert without_host_fields(result.json) == without_host_fields(expected)


def test_sweep_equals_cli_json(shardlab_bin, tmp_path):
    kwargs = dict(model="tiny", steps=2, jobs=1, metric=["virtual_step_s", "mfu"])
    result = shardlab.sweep({"tp": [1, 2], "pp": [1, 2]}, **kwargs)
    _, expected = cli_json(_flag_args("sweep", dict(vary=["tp=1,2", "pp=1,2"], out=str(tmp_path), **kwargs)))
    assert without_host_fields(result.json) == without_host_fields(expected)
    points = result.points
    assert sorted(zip(points["tp"], points["pp"])) == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")]
    assert points["error"].isna().all()


def test_profiles_equal_cli_json(shardlab_bin):
    _, expected = cli_json(["profiles", "--json"])
    table = shardlab.profiles().table
    assert shardlab.profiles().json["profiles"] == expected
    assert list(table["name"]) == [p["name"] for p in expected]


def test_report_views_match_its_json():
    r = shardlab.train(model="tiny", steps=3, dp=2)
    assert "virtual_step_s" in str(r.summary)
    assert list(r.steps.index) == [0, 1, 2]
    assert list(r.steps["loss"]) == [s["loss"] for s in r.json["steps"]]
    assert list(r.devices.index) == [0, 1]
    by_kind = r.memory
    for d in r.json["devices"]:
        assert by_kind.loc[d["rank"]].to_dict() == d["peak_bytes_by_kind"]
    # A device's peak is at most the sum of its peaks by kind (they peak at different times).
    assert (r.devices["peak_bytes"] <= by_kind.sum(axis=1)).all()


def test_train_passes_only_when_the_data_parallel_copies_agree(shardlab_bin):
    ok = shardlab.train(model="tiny", steps=2, dp=2)
    assert ok.passed
    assert ok["replicas"]["identical"] and ok["replicas"]["data_parallel_copies"] == 2
    # dp rank 1's copy perturbed after the last step (the tool's testing aid): exit 1, as the tool's.
    args = dict(model="tiny", steps=2, dp=2, corrupt_shard="transformer.ln_f.bias:1")
    bad = shardlab.train(**args)
    code, expected = cli_json(_flag_args("train", args))
    assert code == 1 and not bad.passed
    assert bad["replicas"] == expected["replicas"]
    assert bad["replicas"]["first_difference"] == "transformer.ln_f.bias on dp rank 1"


def test_collectives_table_has_one_row_per_size():
    t = shardlab.collectives(ranks=4, min_bytes="1KiB", max_bytes="8KiB").table
    assert list(t["bytes"]) == [1024, 2048, 4096, 8192]
    # algbw = bytes / time: 1 KiB in time_us microseconds, in GB/s (1e3 bytes per us).
    assert t["algbw_GBps"].iloc[0] == pytest.approx(1024 / t["time_us"].iloc[0] / 1e3, rel=1e-9)


def test_a_switch_set_to_false_is_its_negation_where_the_tool_has_one(shardlab_bin):
    # False was dropped: tie_embeddings=False trained a tied tiny (the GPT
    # family's default), prefetch=False prefetched. Each is checked against
    # the tool's own run with the negation spelled out.
    assert _flag_args("train", dict(tie_embeddings=False)) == ["train", "--no-tie-embeddings", "--json"]
    assert _flag_args("train", dict(prefetch=False, sp=False, no_overlap=True)) == [
        "train", "--no-prefetch", "--no-overlap", "--json"]
    untied = shardlab.train(model="tiny", steps=1, tie_embeddings=False)
    tied = shardlab.train(model="tiny", steps=1)
    _, expected = cli_json(["train", "--model=tiny", "--steps=1", "--no-tie-embeddings", "--json"])
    assert untied.json["summary"]["n_params"] == expected["summary"]["n_params"]
    assert untied.json["summary"]["n_params"] == tied.json["summary"]["n_params"] + 512 * 128  # the LM head of its own


@pytest.mark.parametrize("kwargs, message", [
    (dict(tp=True), "tp=True: --tp takes a value, not True or False"),
    (dict(sp="yes"), "sp='yes': --sp is a switch: True or False"),
    (dict(prefetch=1), "prefetch=1: --prefetch is a switch: True or False"),
])
def test_a_bool_where_a_value_belongs_and_the_reverse_are_config_errors(kwargs, message):
    # Before: "--tp: \"--json\" is not a number" and CLI11's "disallowed flag override".
    with pytest.raises(shardlab.ConfigError) as info:
        shardlab.train(model="tiny", steps=1, **kwargs)
    assert str(info.value) == message
