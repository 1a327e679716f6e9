"""planner/hashing.py: the cached hash is the class's own hash, and is not pickled."""
from __future__ import annotations

import pickle
from dataclasses import replace

from clusters import load_cluster
from models import load_model
from planner.hashing import dataclass_key


def test_cached_hash_is_the_generated_one_and_stays_out_of_pickles():
    model = load_model("tiny")
    layer, cluster = model.layers[1], load_cluster("tiny")
    assert hash(layer) == hash(dataclass_key(layer))  # what @dataclass(frozen=True) hashes
    assert hash(model) == hash(dataclass_key(model))
    assert hash(cluster) == hash((cluster.name, cluster.gpu, cluster.gpus_per_node,
                                  cluster.num_nodes, cluster.tiers, cluster.nics_per_node))
    for obj in (layer, model):  # (a GPU holds a mappingproxy: not picklable anyway)
        hash(obj)
        again = pickle.loads(pickle.dumps(obj))
        assert again == obj and "_hash" not in again.__dict__ and hash(again) == hash(obj)
    renamed = replace(layer, name=layer.name + "x")  # a new object hashes its own fields
    assert hash(renamed) == hash(dataclass_key(renamed)) and renamed != layer
