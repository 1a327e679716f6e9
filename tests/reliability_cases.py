"""Every class of bad input, the answer ``shardplan`` gives to it, and its exit code.

One catalogue (:data:`CASES`) serves two readers: ``tests/test_reliability_cli.py`` asserts each
case (exit code, no traceback, the message names the problem, ``--json`` prints one document
with an ``error`` object), and ``bench/reliability_table.py`` runs each case and writes the
table of real messages into ``docs/reliability.md`` (section "Bad input"). It lives with the
tests (tests never import ``bench/``; the bench script imports this).

Inputs are generated into a scratch folder by :func:`make_inputs` (the 17 MiB files are sparse)
and every command runs with that folder as the working directory, so messages name short,
relative paths.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent

HUGE_BYTES = 17 * 1024 * 1024  # over the 16 MiB limit of model and cluster files

# A valid native model (the shape of the `tiny` preset) and a small valid cluster whose GPUs have
# room for it: 2 nodes x 4 tiny-gpu with 16 GiB each, so that `plan` finds a plan in ~0.1 s.
MODEL = """\
shardplan_model: 1
name: small
num_layers: 4
hidden_size: 256
num_heads: 8
num_kv_heads: 4
ffn_hidden_size: 512
vocab_size: 1024
seq_len: 128
max_seq_len: 128
"""

CLUSTER = """\
shardplan_cluster: 1
name: small
gpu: tiny-gpu
gpu_overrides:
  memory_gib: 16
gpus_per_node: 4
num_nodes: 2
tiers:
  - name: nvlink
    bandwidth_gbytes_per_s: 50
    latency_us: 1.0
  - name: ethernet
    bandwidth_gbytes_per_s: 5
    latency_us: 5.0
"""

V100_CLUSTER = """\
shardplan_cluster: 1
name: dgx2-v100
gpu: v100-sxm2-32gb
gpus_per_node: 8
num_nodes: 1
tiers:
  - {name: nvswitch, bandwidth_gbytes_per_s: 150, latency_us: 1.0}
  - {name: infiniband, bandwidth_gbytes_per_s: 12.5, latency_us: 5.0}
"""

ANCHORED_MODEL = """\
shardplan_model: 1
name: anchored
num_layers: &depth 4
hidden_size: 256
num_heads: &heads 8
num_kv_heads: *heads
ffn_hidden_size: 512
vocab_size: 1024
seq_len: 128
"""

ANCHORED_CLUSTER = """\
shardplan_cluster: 1
name: anchored
gpu: tiny-gpu
gpu_overrides: {memory_gib: 16}
gpus_per_node: 4
num_nodes: 2
tiers:
  - &link {name: nvlink, bandwidth_gbytes_per_s: 50, latency_us: 1.0}
  - <<: *link
    name: ethernet
    bandwidth_gbytes_per_s: 5
"""

# "Billion laughs": six levels of ten aliases each expand to a million nodes.
ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 10)}]\n" for prev, name in zip("abcde", "bcdef"))


def _replace(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def make_inputs(folder: Path) -> Path:
    """Write every input file the cases name into ``folder``; returns ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    files: dict[str, str | bytes] = {
        "small-model.yaml": MODEL,
        "small-cluster.yaml": CLUSTER,
        "v100-cluster.yaml": V100_CLUSTER,
        "single-gpu.yaml": (ROOT / "bench" / "clusters" / "single-gpu.yaml").read_text(),
        "existing-plan.json": '{"keep": "me"}\n',
        # text that is not the program's: rich markup, control characters
        "cfg[v2].json": json.dumps(yaml.safe_load(MODEL)),
        "model-markup-name.yaml": _replace(MODEL, "name: small", 'name: "tiny [/]"'),
        "model-markup-key.yaml": _replace(MODEL, "num_layers:", '"num_layers[/]":'),
        "model-type-markup.json": json.dumps({"model_type": "[/]", "hidden_size": 256}),
        "model-name-newline.yaml": _replace(MODEL, "name: small", 'name: "tiny\\necho pwned"'),
        "model-name-escape.yaml": _replace(MODEL, "name: small", 'name: "tiny\\e[2J"'),
        "cluster-markup-key.yaml": _replace(CLUSTER, "gpus_per_node:", '"gpus_per_node[/]":'),
        "cluster-name-newline.yaml": _replace(CLUSTER, "name: small", 'name: "a\\nb"'),
        # numbers at the float limits, YAML 1.1 sexagesimal integers
        "cluster-bandwidth-tiny.yaml": _replace(CLUSTER, "bandwidth_gbytes_per_s: 5\n",
                                                "bandwidth_gbytes_per_s: 1.0e-300\n"),
        "cluster-peak-denormal.yaml": _replace(
            CLUSTER, "gpu_overrides:\n  memory_gib: 16\n",
            "gpu_overrides:\n  memory_gib: 16\n  peak_tflops: {bf16: 5.0e-324}\n"),
        "cluster-gpus-per-node-huge.yaml": _replace(CLUSTER, "gpus_per_node: 4",
                                                    "gpus_per_node: 1024"),
        "model-layers-sexagesimal.yaml": _replace(MODEL, "num_layers: 4", "num_layers: 1:00"),
        "cluster-nodes-sexagesimal.yaml": _replace(CLUSTER, "num_nodes: 2", "num_nodes: 0:02"),
        # encodings
        "model-utf16.yaml": MODEL.encode("utf-16"),  # with a byte-order mark
        "model-utf16-nobom.yaml": MODEL.encode("utf-16-le"),
        # model files
        "model-empty.yaml": "",
        "model-binary.json": bytes(range(256)) * 16,
        "model-truncated.json": '{"model_type": "llama", "hidden_size": 4096, "num_hidden',
        "model-truncated.yaml": 'shardplan_model: 1\nname: "small\nnum_layers: 4\n',
        "model-anchors.yaml": ANCHORED_MODEL,
        "model-alias-bomb.yaml": ALIAS_BOMB,
        "model-tabs.yaml": _replace(MODEL, "num_layers: 4", "\tnum_layers: 4"),
        "model-duplicate-key.yaml": MODEL + "num_layers: 40\n",
        "model-unknown-key.yaml": _replace(MODEL, "num_layers:", "num_layerz:"),
        "model-layers-negative.yaml": _replace(MODEL, "num_layers: 4", "num_layers: -4"),
        "model-layers-zero.yaml": _replace(MODEL, "num_layers: 4", "num_layers: 0"),
        "model-layers-fractional.yaml": _replace(MODEL, "num_layers: 4", "num_layers: 2.5"),
        "model-layers-nan.yaml": _replace(MODEL, "num_layers: 4", "num_layers: .nan"),
        "model-layers-inf.yaml": _replace(MODEL, "num_layers: 4", "num_layers: .inf"),
        "model-layers-huge.yaml": _replace(MODEL, "num_layers: 4", f"num_layers: {10**30}"),
        "model-hidden-exponent.yaml": _replace(MODEL, "hidden_size: 256", "hidden_size: 1e300"),
        "model-heads-hidden.yaml": _replace(MODEL, "hidden_size: 256", "hidden_size: 250"),
        # cluster files
        "cluster-empty.yaml": "",
        "cluster-binary.yaml": bytes(range(256)) * 16,
        "cluster-truncated.yaml": CLUSTER.split("  - name: ethernet")[0]
        + "  - {name: ethernet, bandwidth_gbytes_per_s: 5",
        "cluster-anchors.yaml": ANCHORED_CLUSTER,
        "cluster-alias-bomb.yaml": ALIAS_BOMB,
        "cluster-tabs.yaml": _replace(CLUSTER, "  memory_gib: 16", "\tmemory_gib: 16"),
        "cluster-duplicate-key.yaml": CLUSTER + "num_nodes: 4\n",
        "cluster-unknown-key.yaml": _replace(CLUSTER, "gpus_per_node:", "gpus_per_nod:"),
        "cluster-gpus-negative.yaml": _replace(CLUSTER, "gpus_per_node: 4", "gpus_per_node: -8"),
        "cluster-gpus-zero.yaml": _replace(CLUSTER, "gpus_per_node: 4", "gpus_per_node: 0"),
        "cluster-gpus-fractional.yaml": _replace(CLUSTER, "gpus_per_node: 4",
                                                 "gpus_per_node: 2.5"),
        "cluster-memory-nan.yaml": _replace(CLUSTER, "memory_gib: 16", "memory_gib: .nan"),
        "cluster-bandwidth-inf.yaml": _replace(CLUSTER, "bandwidth_gbytes_per_s: 5\n",
                                               "bandwidth_gbytes_per_s: .inf\n"),
        "cluster-nodes-huge.yaml": _replace(CLUSTER, "num_nodes: 2", f"num_nodes: {10**30}"),
        "cluster-unknown-gpu.yaml": _replace(CLUSTER, "gpu: tiny-gpu\ngpu_overrides:\n"
                                             "  memory_gib: 16\n", "gpu: h100-sxn\n"),
    }
    for name, content in files.items():
        path = folder / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
    for name in ("model-huge.yaml", "cluster-huge.yaml"):
        with open(folder / name, "wb") as handle:  # sparse: no 17 MiB actually written
            handle.truncate(HUGE_BYTES)
    (folder / "a-folder").mkdir(exist_ok=True)
    for name, points_to in (("loop-a.yaml", "loop-b.yaml"), ("loop-b.yaml", "loop-a.yaml"),
                            ("dangling.yaml", "no-such-file.yaml"),
                            ("dangling-plan.json", "no-such-plan.json"),
                            ("stdout-link.json", "/proc/self/fd/1")):
        link = folder / name
        if not link.is_symlink():
            link.symlink_to(points_to)
    _make_plans(folder)
    return folder


def _make_plans(folder: Path) -> None:
    """Plan files the plan-file cases read: one for a model named ``tiny [/]``, one holding a
    number beyond the float range (``1e999``, which Python's json reads as inf)."""
    previous = os.getcwd()
    os.chdir(folder)
    try:
        for name, model in (("plan-markup.json", "model-markup-name.yaml"),
                            ("plan-small.json", "small-model.yaml")):
            if not (folder / name).exists():
                code, _, err = run_cli(("plan", "-m", model, "-c", "small-cluster.yaml",
                                        "--global-batch", "8", "-o", name))
                assert code == 0, err
    finally:
        os.chdir(previous)
    text = (folder / "plan-small.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    doc["predicted"]["step_time_s"] = "@HUGE@"
    (folder / "plan-1e999.json").write_text(
        json.dumps(doc, indent=2).replace('"@HUGE@"', "1e999"), encoding="utf-8")


@dataclass(frozen=True)
class Case:
    """One bad input: the command, the exit code it must give and words its message must hold."""

    id: str
    group: str
    what: str
    argv: tuple[str, ...]
    code: int
    needles: tuple[str, ...]
    known_bug: str = ""  # non-empty: a reported bug; the test is an expected failure


def _evaluate(*extra: str, model: str = "tiny", cluster: str = "small-cluster.yaml") -> tuple:
    base = ["evaluate", "-m", model, "-c", cluster, "--global-batch", "8"]
    given = {a for a in extra if a.startswith("--")}
    for option, value in (("--tp", "1"), ("--pp", "1")):
        if option not in given:
            base += [option, value]
    return tuple(base) + extra


def _plan(*extra: str, model: str = "tiny", cluster: str = "small-cluster.yaml") -> tuple:
    base = ("plan", "-m", model, "-c", cluster)
    if "--global-batch" not in extra:
        base += ("--global-batch", "8")
    return base + extra


def _model(path: str) -> tuple:
    return ("inspect", "-m", path)


def _cluster(path: str) -> tuple:
    return _evaluate(cluster=path)


M, C, N, L, O, U, F = ("model file", "cluster file", "numbers on the command line",
                       "unknown names", "output file", "usage", "does not fit")
T, P = "text that is not the program's", "plan file"
LONG_NAME = "p" * 245 + ".json"  # 250 bytes: legal (NAME_MAX is 255), its temp name too

CASES: tuple[Case, ...] = (
    # -- model files ---------------------------------------------------------------------------
    Case("model-empty", M, "empty file", _model("model-empty.yaml"), 2, ("empty",)),
    Case("model-binary", M, "binary file", _model("model-binary.json"), 2, ("not utf-8", "binary")),
    Case("model-truncated-json", M, "truncated JSON", _model("model-truncated.json"), 2,
         ("malformed json", "line 1")),
    Case("model-truncated-yaml", M, "truncated YAML", _model("model-truncated.yaml"), 2,
         ("malformed yaml",)),
    Case("model-huge", M, "huge file (17 MiB)", _model("model-huge.yaml"), 2, ("16 mib",)),
    Case("model-directory", M, "a directory", _model("a-folder"), 2, ("is a directory",)),
    Case("model-missing", M, "a missing path", _model("missing-folder/model.yaml"), 2,
         ("not found", "missing-folder/model.yaml")),
    Case("model-anchors", M, "YAML anchors and aliases (accepted)", _model("model-anchors.yaml"),
         0, ()),
    Case("model-alias-bomb", M, "YAML alias bomb (billion laughs)", _model("model-alias-bomb.yaml"),
         2, ("anchors and aliases",)),
    Case("model-tabs", M, "tab indentation", _model("model-tabs.yaml"), 2,
         ("line 3", "tab")),
    Case("model-duplicate-key", M, "duplicate key", _model("model-duplicate-key.yaml"), 2,
         ("duplicate key", "num_layers")),
    Case("model-unknown-key", M, "unknown key", _model("model-unknown-key.yaml"), 2,
         ("num_layerz", "valid keys", "hidden_size", "did you mean 'num_layers'")),
    Case("model-negative", M, "negative number", _model("model-layers-negative.yaml"), 2,
         ("num_layers", "-4")),
    Case("model-zero", M, "zero", _model("model-layers-zero.yaml"), 2, ("num_layers", "got 0")),
    Case("model-fractional", M, "fractional number", _model("model-layers-fractional.yaml"), 2,
         ("num_layers", "integer", "2.5")),
    Case("model-nan", M, "NaN", _model("model-layers-nan.yaml"), 2, ("num_layers", "nan")),
    Case("model-inf", M, "infinity", _model("model-layers-inf.yaml"), 2, ("num_layers", "inf")),
    Case("model-huge-number", M, "astronomically large number", _model("model-layers-huge.yaml"),
         2, ("num_layers", "implausibly large")),
    Case("model-exponent", M, "exponent notation (a string in YAML 1.1)",
         _model("model-hidden-exponent.yaml"), 2, ("hidden_size", "1e300")),
    Case("model-heads", M, "heads do not divide hidden", _model("model-heads-hidden.yaml"), 2,
         ("250", "not divisible", "num_heads")),
    # -- cluster files -------------------------------------------------------------------------
    Case("cluster-empty", C, "empty file", _cluster("cluster-empty.yaml"), 2, ("empty",)),
    Case("cluster-binary", C, "binary file", _cluster("cluster-binary.yaml"), 2, ("binary",)),
    Case("cluster-truncated", C, "truncated YAML", _cluster("cluster-truncated.yaml"), 2,
         ("malformed yaml",)),
    Case("cluster-huge", C, "huge file (17 MiB)", _cluster("cluster-huge.yaml"), 2, ("16 mib",)),
    Case("cluster-directory", C, "a directory", _cluster("a-folder"), 2, ("is a directory",)),
    Case("cluster-missing", C, "a missing path", _cluster("missing-folder/cluster.yaml"), 2,
         ("not found", "missing-folder/cluster.yaml")),
    Case("cluster-anchors", C, "YAML anchors, aliases and merge keys (accepted)",
         _cluster("cluster-anchors.yaml"), 0, ()),
    Case("cluster-alias-bomb", C, "YAML alias bomb (billion laughs)",
         _cluster("cluster-alias-bomb.yaml"), 2, ("anchors and aliases",)),
    Case("cluster-tabs", C, "tab indentation", _cluster("cluster-tabs.yaml"), 2, ("tab",)),
    Case("cluster-duplicate-key", C, "duplicate key", _cluster("cluster-duplicate-key.yaml"), 2,
         ("duplicate key", "num_nodes")),
    Case("cluster-unknown-key", C, "unknown key", _cluster("cluster-unknown-key.yaml"), 2,
         ("gpus_per_nod'", "valid keys", "num_nodes", "did you mean 'gpus_per_node'")),
    Case("cluster-negative", C, "negative number", _cluster("cluster-gpus-negative.yaml"), 2,
         ("gpus_per_node", "-8")),
    Case("cluster-zero", C, "zero", _cluster("cluster-gpus-zero.yaml"), 2,
         ("gpus_per_node", "got 0")),
    Case("cluster-fractional", C, "fractional number", _cluster("cluster-gpus-fractional.yaml"), 2,
         ("gpus_per_node", "integer", "2.5")),
    Case("cluster-nan", C, "NaN", _cluster("cluster-memory-nan.yaml"), 2, ("memory_gib", "nan")),
    Case("cluster-inf", C, "infinity", _cluster("cluster-bandwidth-inf.yaml"), 2,
         ("bandwidth_gbytes_per_s", "inf")),
    Case("cluster-huge-number", C, "astronomically large number",
         _cluster("cluster-nodes-huge.yaml"), 2, ("num_nodes", "implausibly large")),
    # -- numbers on the command line -----------------------------------------------------------
    Case("cli-tp-zero", N, "`--tp 0`", _evaluate("--tp", "0"), 2,
         ("--tp", "0 is not in the range")),
    Case("cli-batch-negative", N, "`--global-batch -1`",
         ("evaluate", "-m", "tiny", "-c", "small-cluster.yaml", "--global-batch", "-1", "--tp",
          "1", "--pp", "1"), 2, ("--global-batch", "-1")),
    Case("cli-tp-fractional", N, "`--tp 2.5`", _evaluate("--tp", "2.5"), 2, ("--tp", "2.5")),
    Case("cli-tp-nan", N, "`--tp nan`", _evaluate("--tp", "nan"), 2, ("--tp", "nan")),
    Case("cli-tp-inf", N, "`--tp inf`", _evaluate("--tp", "inf"), 2, ("--tp", "inf")),
    Case("cli-nodes-exponent", N, "`--nodes 1e30`", _evaluate("--nodes", "1e30"), 2,
         ("--nodes", "1e30")),
    Case("cli-nodes-huge", N, "`--nodes 10**30`", _evaluate("--nodes", str(10**30)), 2,
         ("nodes", "implausibly large")),
    Case("cli-batch-huge", N, "`--global-batch 10**32` (evaluate)",
         ("evaluate", "-m", "tiny", "-c", "small-cluster.yaml", "--global-batch", str(10**32),
          "--tp", "1", "--pp", "1"), 2, ("--global-batch",)),
    Case("cli-batch-huge-plan", N, "`--global-batch 10**32` (plan)",
         _plan("--global-batch", str(10**32)), 2, ("--global-batch",)),
    Case("cli-seq-huge", N, "`--seq-len 10**20`", _evaluate("--seq-len", str(10**20)), 2,
         ("seq_len", "implausibly large")),
    Case("cli-seq-absurd-plan", N, "`--seq-len` 64 x beyond the model's positions (plan)",
         _plan("--seq-len", str(128 * 64 + 1)), 2, ("sequence length 8193 is absurd",
                                                     "max positions 128")),
    Case("cli-seq-absurd-pools", N, "`--seq-len` 64 x beyond the model's positions (plan-pools)",
         ("plan-pools", "-m", "tiny", "-c", "h100-a100", "--global-batch", "8", "--seq-len",
          str(128 * 64 + 1)), 2, ("sequence length 8193 is absurd",)),
    Case("cli-tp-divides", N, "`--tp 3` on 8 GPUs (does not divide the GPU count)",
         _evaluate("--tp", "3"), 2, ("3", "does not divide the 8 gpus")),
    Case("cli-dp-mismatch", N, "`--dp 3` with tp 1 x pp 1 on 8 GPUs",
         _evaluate("--dp", "3"), 2, ("degrees multiply to 3", "8")),
    Case("cli-batch-divisible", N, "`--global-batch 7` with dp 8 (not divisible)",
         ("evaluate", "-m", "tiny", "-c", "small-cluster.yaml", "--global-batch", "7", "--tp",
          "1", "--pp", "1"), 2, ("global batch 7", "not divisible")),
    Case("cli-tp-heads", N, "`--tp 16` for 8 attention heads",
         _evaluate("--tp", "16", "--nodes", "4"), 2, ("tp 16", "8 attention heads")),
    Case("cli-pp-blocks", N, "`--pp 8` for 4 blocks", _evaluate("--pp", "8"), 2,
         ("pp", "4 blocks")),
    Case("cli-time-limit-zero", N, "`--time-limit 0`", _plan("--time-limit", "0"), 2,
         ("--time-limit",)),
    Case("cli-time-limit-nan", N, "`--time-limit nan`", _plan("--time-limit", "nan"), 2,
         ("--time-limit", "nan")),
    Case("cli-time-limit-inf", N, "`--time-limit inf`", _plan("--time-limit", "inf"), 2,
         ("--time-limit", "inf")),
    Case("cli-pin-junk", N, "`--pin tp=abc`", _plan("--pin", "tp=abc"), 2, ("pin", "abc")),
    Case("cli-pin-unknown", N, "`--pin foo=1`", _plan("--pin", "foo=1"), 2,
         ("unknown pin 'foo'",)),
    Case("cli-v100-bf16", N, "V100 (no bf16) with `--dtype bf16` (evaluate)",
         _evaluate("--dtype", "bf16", cluster="v100-cluster.yaml"), 2, ("v100", "bf16", "fp16")),
    Case("cli-v100-bf16-plan", N, "V100 (no bf16) with `--dtype bf16` (plan)",
         _plan("--dtype", "bf16", cluster="v100-cluster.yaml"), 2, ("v100", "bf16")),
    Case("cli-dtype-unknown", N, "`--dtype fp64`", _evaluate("--dtype", "fp64"), 2,
         ("--dtype", "fp64")),
    # -- unknown names -------------------------------------------------------------------------
    Case("unknown-model", L, "unknown model preset", _model("llama-3.1-8"), 2,
         ("unknown model 'llama-3.1-8'", "did you mean 'llama-3.1-8b'")),
    Case("unknown-cluster", L, "unknown cluster preset", _evaluate(cluster="dgx-h10"), 2,
         ("unknown cluster preset 'dgx-h10'", "did you mean 'dgx-h100'")),
    Case("unknown-gpu", L, "unknown GPU in a cluster file", _cluster("cluster-unknown-gpu.yaml"),
         2, ("unknown gpu preset 'h100-sxn'", "did you mean 'h100-sxm'")),
    # -- output ----------------------------------------------------------------------------------
    Case("output-missing-folder", O, "`-o` into a missing folder",
         _plan("-o", "missing-folder/plan.json"), 2, ("missing-folder", "does not exist")),
    Case("output-under-file", O, "`-o` under a regular file (not writable, even for root)",
         _plan("-o", "small-model.yaml/plan.json"), 2, ("cannot write", "small-model.yaml")),
    Case("output-directory", O, "`-o` naming a directory", _plan("-o", "a-folder"), 2,
         ("a-folder", "is a directory")),
    Case("output-exists", O, "existing output file without `--force`",
         _plan("-o", "existing-plan.json"), 2, ("existing-plan.json", "exists", "--force")),
    Case("output-dangling-symlink", O, "`-o` a dangling symbolic link (without `--force`)",
         _plan("-o", "dangling.yaml"), 2, ("dangling.yaml", "symbolic link", "missing file")),
    Case("output-dev-null", O, "`-o /dev/null --force` (a character device)",
         _plan("-o", "/dev/null", "--force"), 2, ("/dev/null", "character device")),
    Case("output-proc-fd", O, "`--force` onto a symbolic link to /proc/self/fd/1",
         _plan("-o", "stdout-link.json", "--force"), 2, ("stdout-link.json", "symbolic link")),
    Case("output-long-name", O, "`-o` a legal 250-byte file name (accepted)",
         _plan("-o", LONG_NAME, "--force"), 0, ()),
    Case("output-stdout", O, "`-o -` (standard output; accepted)", _plan("-o", "-"), 0, ()),
    Case("output-export-dev-null", O, "`export -o /dev/null --force`",
         ("export", "plan-small.json", "-f", "megatron", "-o", "/dev/null", "--force"), 2,
         ("/dev/null", "character device")),
    # -- text that is not the program's (rich markup, control characters) --------------------
    Case("markup-path", T, "a file name with `[v2]` in it (accepted)", _model("cfg[v2].json"), 0,
         ()),
    Case("markup-missing-path", T, "a missing file name with `[v2]` in it",
         _model("missing[v2].json"), 2, ("missing[v2].json",)),
    Case("markup-preset", T, "a typo'd preset with `[/]`", _model("llama[/]"), 2,
         ("llama[/]",)),
    Case("markup-model-type", T, "a config with `model_type: \"[/]\"`",
         _model("model-type-markup.json"), 2, ("model_type", "[/]")),
    Case("markup-model-key", T, "a native model key with brackets",
         _model("model-markup-key.yaml"), 2, ("num_layers[/]",)),
    Case("markup-cluster-key", T, "a cluster key with brackets",
         _cluster("cluster-markup-key.yaml"), 2, ("gpus_per_node[/]",)),
    Case("markup-name-evaluate", T, "`evaluate` of a model named `tiny [/]` (accepted)",
         _evaluate(model="model-markup-name.yaml"), 0, ()),
    Case("markup-name-show", T, "`show` of a plan for a model named `tiny [/]` (accepted)",
         ("show", "plan-markup.json"), 0, ()),
    Case("markup-name-check", T, "`check` of a plan for a model named `tiny [/]` (accepted)",
         ("check", "plan-markup.json"), 0, ()),
    Case("name-newline", T, "a newline in a model name", _model("model-name-newline.yaml"), 2,
         ("control character", "u+000a")),
    Case("name-escape", T, "a terminal escape sequence in a model name",
         _model("model-name-escape.yaml"), 2, ("control character", "u+001b")),
    Case("cluster-name-newline", T, "a newline in a cluster name",
         _cluster("cluster-name-newline.yaml"), 2, ("name", "control character")),
    # -- more files and numbers ----------------------------------------------------------------
    Case("model-symlink-loop", M, "a symbolic link loop", _model("loop-a.yaml"), 2,
         ("loop-a.yaml", "symlink loop")),
    Case("model-dangling-symlink", M, "a dangling symbolic link", _model("dangling.yaml"), 2,
         ("dangling.yaml", "symbolic link to a missing file")),
    Case("model-utf16", M, "UTF-16 with a byte-order mark (accepted)", _model("model-utf16.yaml"),
         0, ()),
    Case("model-utf16-nobom", M, "UTF-16 without a byte-order mark",
         _model("model-utf16-nobom.yaml"), 2, ("utf-16", "utf-8")),
    Case("model-sexagesimal", M, "YAML 1.1 sexagesimal `num_layers: 1:00` (not 60)",
         _model("model-layers-sexagesimal.yaml"), 2, ("num_layers", "1:00")),
    Case("cluster-sexagesimal", C, "YAML 1.1 sexagesimal `num_nodes: 0:02` (not 2)",
         _cluster("cluster-nodes-sexagesimal.yaml"), 2, ("num_nodes", "0:02")),
    Case("cluster-bandwidth-tiny", C, "bandwidth 1e-300 GB/s", _cluster("cluster-bandwidth-tiny.yaml"),
         2, ("bandwidth_gbytes_per_s", "implausibly small")),
    Case("cluster-peak-denormal", C, "peak 5e-324 TFLOP/s (plan)",
         _plan(cluster="cluster-peak-denormal.yaml"), 2, ("bf16", "implausibly small")),
    Case("cluster-gpus-per-node-huge", C, "1,024 GPUs per node (took minutes per evaluation)",
         _cluster("cluster-gpus-per-node-huge.yaml"), 2, ("gpus_per_node", "implausibly large")),
    Case("cli-nodes-too-many-gpus", N, "`--nodes 1000000` of 8-GPU nodes (8,000,000 GPUs)",
         _evaluate("--nodes", "1000000", cluster="dgx-h100"), 2,
         ("8,000,000 gpus", "more than the 1,048,576")),
    Case("cli-pin-digits", N, "`--pin tp=<5000 digits>`", _plan("--pin", "tp=" + "9" * 5000), 2,
         ("pin tp", "5000-digit")),
    Case("cli-pin-twice", N, "`--pin tp=2 --pin tp=4`", _plan("--pin", "tp=2", "--pin", "tp=4"), 2,
         ("tp", "given twice")),
    Case("cli-pin-alias-twice", N, "`--pin zero=1 --pin zero_stage=2`",
         _plan("--pin", "zero=1", "--pin", "zero_stage=2"), 2, ("zero", "given twice")),
    Case("cli-time-limit-1e999", N, "`--time-limit 1e999`", _plan("--time-limit", "1e999"), 2,
         ("--time-limit", "not a finite number")),
    Case("cli-verify-lr-nan", N, "`verify --lr nan`", ("verify", "plan-small.json", "--lr", "nan"),
         2, ("--lr", "nan")),
    Case("cli-verify-timeout-inf", N, "`verify --timeout inf`",
         ("verify", "plan-small.json", "--timeout", "inf"), 2, ("--timeout", "inf")),
    Case("cli-verify-rtol-nan", N, "`verify --rtol nan`",
         ("verify", "plan-small.json", "--rtol", "nan"), 2, ("--rtol", "nan")),
    Case("plan-1e999-check", P, "a plan number `1e999` (`check --json`)",
         ("check", "plan-1e999.json"), 2, ("1e999", "range of a float")),
    Case("plan-1e999-show", P, "a plan number `1e999` (`show`)", ("show", "plan-1e999.json"), 2,
         ("1e999",)),
    Case("plan-1e999-export", P, "a plan number `1e999` (`export -f json`)",
         ("export", "plan-1e999.json", "-f", "json"), 2, ("1e999",)),
    Case("plan-dangling-symlink", P, "a dangling symbolic link as the plan",
         ("show", "dangling-plan.json"), 2, ("dangling-plan.json", "symbolic link")),
    # -- usage -----------------------------------------------------------------------------------
    Case("usage-command", U, "unknown command", ("frobnicate",), 2,
         ("no such command 'frobnicate'",)),
    Case("usage-option", U, "unknown option", _plan("--frobnicate"), 2,
         ("no such option", "--frobnicate")),
    Case("usage-missing", U, "missing required option", ("evaluate", "-m", "tiny"), 2,
         ("missing option", "--cluster")),
    # -- does not fit ----------------------------------------------------------------------------
    Case("does-not-fit", F, "a model that fits no plan (llama-3.1-405b on the tiny cluster)",
         ("plan", "-m", "llama-3.1-405b", "-c", "tiny", "--global-batch", "8"), 1,
         ("no plan for llama-3.1-405b fits", "gib per gpu", "gib more than")),
    Case("does-not-fit-one-gpu", F, "a model that fits no plan on one GPU (a one-tier cluster)",
         ("plan", "-m", "llama-3.1-8b", "-c", "single-gpu.yaml", "--global-batch", "8"), 1,
         ("no plan for llama-3.1-8b fits", "gib more than")),
)


def run_cli(argv: list[str] | tuple[str, ...]) -> tuple[int, str, str]:
    """Run ``shardplan argv`` in this process: (exit code, stdout, stderr)."""
    from cli.main import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    return code, out.getvalue(), err.getvalue()


