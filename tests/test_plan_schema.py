"""The plan file as a contract: schema, exact IR round-trip, strict reading, schema/show CLI."""
from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from clusters import list_cluster_presets, load_cluster
from models import list_presets, load_model
from planner.errors import ErrorKind, PlannerError
from planner.hardware import Cluster, Gpu, NetworkTier
from planner.ir import Attention, Layer, Mlp, ModelGraph
from planner.plan import POOL_SCHEMA_VERSION, SCHEMA_VERSION, content_hash, dumps
from planner.plan_io import load_plan, plan_schema, validate_plan
from planner.serialize import cluster_from_dict, cluster_to_dict, model_from_dict, model_to_dict
from conftest import MIXTRAL, build_plan, edited, run_cli, write

HF_CONFIGS = sorted((Path(__file__).resolve().parents[1] / "models" / "hf_configs").glob("*.json"))


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    """Real plans from `shardplan plan` (short time limits): tiny/tiny and gpt3-1.3b/A100."""
    from cli.main import main

    out = {}
    folder = tmp_path_factory.mktemp("plans")
    for model, cluster, batch in (("tiny", "tiny", 16), ("gpt3-1.3b", "dgx-a100-80g", 64)):
        path = folder / f"{model}.json"
        with pytest.raises(SystemExit) as done:
            main(["plan", "--model", model, "--cluster", cluster, "--global-batch", str(batch),
                  "--time-limit", "5", "--top-k", "2", "-o", str(path)])
        assert done.value.code == 0
        out[model] = path
    return out


def test_schema_is_valid_draft_2020_12():
    schema = plan_schema()
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    # 1: one pool; 2: across pools (parallelism.stage_pools, tests/test_hetero_plan_file.py)
    assert schema["properties"]["schema_version"]["enum"] == [SCHEMA_VERSION, POOL_SCHEMA_VERSION]


def test_searched_plans_validate_and_round_trip(searched):
    for path in searched.values():
        doc = load_plan(path)
        assert json.loads(dumps(doc)) == doc
        model = model_from_dict(doc["inputs"]["model"]["ir"])
        cluster = cluster_from_dict(doc["inputs"]["cluster"]["ir"])
        assert content_hash(model) == doc["inputs"]["model"]["sha256"]
        assert content_hash(cluster) == doc["inputs"]["cluster"]["sha256"]
        assert model == load_model(doc["inputs"]["model"]["spec"])
        assert cluster == load_cluster(doc["inputs"]["cluster"]["spec"])
        assert doc["solver"]["status"] in ("OPTIMAL", "FEASIBLE")


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64, tp=2, pp=4,
         stage_blocks=[5, 7, 7, 5], zero=3),
    dict(model="gpt3-1.3b", cluster="dgx-a100-80g", global_batch=64, pp=4, virtual_stages=2,
         recompute="selective"),
    dict(model=MIXTRAL, cluster="dgx-h100", nodes=2, global_batch=32, tp=2, pp=2, ep=4, cp=2,
         seq_len=4096, recompute="full"),
])
def test_evaluated_plans_validate(kwargs):
    doc = build_plan(**kwargs)
    assert doc["solver"] == {"status": "EVALUATED"}
    assert validate_plan(doc) is doc


@pytest.mark.parametrize("spec", [p.name for p in list_presets()] + [str(p) for p in HF_CONFIGS],
                         ids=lambda s: Path(s).stem)
def test_model_ir_round_trip_is_exact(spec):
    model = load_model(spec)
    data = json.loads(json.dumps(model_to_dict(model), allow_nan=False))
    back = model_from_dict(data)
    assert back == model and model_to_dict(back) == data
    assert content_hash(back) == content_hash(model)


def test_hash_ignores_where_a_description_was_read_from(tmp_path):
    preset = load_model("tiny")
    copy = tmp_path / "elsewhere" / "my-tiny.yaml"
    copy.parent.mkdir()
    copy.write_text((Path(__file__).resolve().parents[1] / "models" / "presets" /
                     "tiny.yaml").read_text())
    from_file = load_model(str(copy))
    assert from_file.source != preset.source
    assert content_hash(from_file) == content_hash(preset)
    assert content_hash(load_model("tiny", seq_len=64)) != content_hash(preset)


@pytest.mark.parametrize("cluster", list_cluster_presets(), ids=lambda c: c.name)
def test_cluster_round_trip_is_exact(cluster):
    data = json.loads(json.dumps(cluster_to_dict(cluster), allow_nan=False))
    back = cluster_from_dict(data)
    assert back == cluster and hash(back) == hash(cluster) and cluster_to_dict(back) == data
    assert content_hash(back) == content_hash(cluster)


def test_cluster_round_trip_keeps_ints_and_floats_apart(tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text("shardplan_cluster: 1\nname: c\ngpu: a100-sxm4-80gb\n"
                    "gpu_overrides: {memory_gib: 64}\ngpus_per_node: 8\nnum_nodes: 2\n"
                    "tiers:\n  - {name: nvlink, bandwidth_gbytes_per_s: 300, latency_us: 2}\n"
                    "  - {name: ib, bandwidth_gbytes_per_s: 25.5, latency_us: 5.0}\n")
    cluster = load_cluster(str(yaml))
    back = cluster_from_dict(json.loads(json.dumps(cluster_to_dict(cluster))))
    assert content_hash(back) == content_hash(cluster)
    assert type(back.gpu.memory_gib) is type(cluster.gpu.memory_gib)


@pytest.mark.parametrize("cls, name", [(ModelGraph, "model_ir"), (Layer, "layer_ir"),
                                       (Attention, "attention_ir"), (Mlp, "mlp_ir"),
                                       (Cluster, "cluster_ir"), (Gpu, "gpu_ir"),
                                       (NetworkTier, "tier_ir")])
def test_schema_describes_every_ir_field(cls, name):
    """The IR objects are open in the schema (serialize decodes them strictly), so a new field
    still validates; this test says when planner/plan_schema.json needs the new field."""
    described = set(plan_schema()["$defs"][name]["properties"])
    assert described == {f.name for f in fields(cls)}, \
        f"update $defs.{name} in planner/plan_schema.json and docs/plan-file.md"


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["inputs"]["model"]["ir"].update(bogus=1), "unknown key 'bogus'"),
    (lambda d: d["inputs"]["model"]["ir"]["layers"][1].update(hidden=True), "expected an integer"),
    (lambda d: d["inputs"]["model"]["ir"]["layers"][1].update(params=2.0), "expected an integer"),
    (lambda d: d["inputs"]["model"]["ir"]["layers"][1]["attention"].update(num_heads=0),
     "must be greater than 0"),
    (lambda d: d["inputs"]["model"]["ir"]["layers"][1].update(kind="blob"), "is not one of"),
    (lambda d: d["inputs"]["model"]["ir"].pop("hidden"), "missing required key 'hidden'"),
])
def test_model_ir_decoding_is_strict(edit, message):
    doc = build_plan()
    bad = edited(doc, edit)["inputs"]["model"]["ir"]
    with pytest.raises(PlannerError) as error:
        model_from_dict(bad, "$.inputs.model.ir")
    assert error.value.kind is ErrorKind.INVALID_INPUT
    assert message in error.value.message and "$.inputs.model.ir" in error.value.message


def test_schema_errors_name_the_json_path():
    doc = build_plan(pp=2)
    bad = edited(doc, lambda d: (d["stages"][1]["memory_gib"].update(total=-1),
                                 d["parallelism"].update(tp=2.0),
                                 d["layers"][3].update(recompute="half")))
    with pytest.raises(PlannerError) as error:
        validate_plan(bad)
    message = error.value.message
    assert "$.stages[1].memory_gib.total: -1 is less than the minimum of 0" in message
    assert "$.parallelism.tp: 2.0 is not of type 'integer'" in message
    assert "$.layers[3].recompute: 'half' is not one of" in message
    assert error.value.exit_code == 2
    assert len(error.value.details["errors"]) == 3


def test_other_schema_version_is_refused_with_the_expected_one():
    doc = edited(build_plan(), lambda d: d.update(schema_version=3))
    with pytest.raises(PlannerError) as error:
        validate_plan(doc)
    assert "schema_version 3 is not supported" in error.value.message
    assert f"reads schema_version {SCHEMA_VERSION}" in error.value.message
    # a one-pool plan relabelled 2 lacks the pool fields version 2 requires
    with pytest.raises(PlannerError, match="'stage_pools' is a required property"):
        validate_plan(edited(build_plan(), lambda d: d.update(schema_version=2)))
    doc = edited(doc, lambda d: d.update(kind="something-else"))
    with pytest.raises(PlannerError, match="not a shardplan plan"):
        validate_plan(doc)


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"{\"a\": 1,}", "malformed JSON"),
    (b"{\"kind\": 1, \"kind\": 2}", "duplicate key 'kind'"),
    (b"{\"x\": NaN}", "malformed JSON"),
    (b"[1, 2]", "expected a JSON object"),
    (b"\xff\xfe\x00junk", "not UTF-8"),
    (b"[" * 100000 + b"]" * 100000, "nested too deeply"),
])
def test_unreadable_files_are_invalid_input(tmp_path, content, message):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    with pytest.raises(PlannerError) as error:
        load_plan(path)
    assert error.value.kind is ErrorKind.INVALID_INPUT
    assert message in error.value.message


def test_missing_directory_and_oversized_files(tmp_path, monkeypatch):
    with pytest.raises(PlannerError, match="not found"):
        load_plan(tmp_path / "nope.json")
    with pytest.raises(PlannerError, match="is a directory"):
        load_plan(tmp_path)
    import planner.plan_io as plan_io

    path = write(build_plan(), tmp_path / "plan.json")
    monkeypatch.setattr(plan_io, "MAX_PLAN_BYTES", 1000)
    with pytest.raises(PlannerError, match="limit is 1,000 bytes"):
        plan_io.load_plan(path)


def test_schema_command_prints_the_shipped_schema(capsys):
    code, out, err = run_cli(["schema"], capsys)
    assert code == 0 and json.loads(out) == plan_schema()


def test_show_renders_a_saved_plan(searched, tmp_path, capsys):
    code, out, err = run_cli(["show", searched["gpt3-1.3b"]], capsys)
    assert code == 0 and out == ""
    for text in ("Memory per GPU", "Step time", "solver:", "Runners-up", "Layers per stage"):
        assert text in err
    code, out, err = run_cli(["show", searched["tiny"], "--json"], capsys)
    assert code == 0 and json.loads(out) == load_plan(searched["tiny"])
    evaluated = write(build_plan(pp=2, block_recompute=["full"] * 4), tmp_path / "e.json")
    code, out, err = run_cli(["show", evaluated], capsys)
    assert code == 0 and "EVALUATED" in err
    code, out, err = run_cli(["show", tmp_path / "missing.json", "--json"], capsys)
    assert code == 2 and json.loads(out)["error"]["kind"] == "invalid_input"
