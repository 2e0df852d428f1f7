"""``partition.name: flwr``: Flower Datasets' partitioners by name give Flower's own partition,
sample for sample. Each peer here is the partitioner itself, built with its arguments written
out, handed the same training labels (shuffled as ``FederatedDataset`` shuffles them, or not)
and read with its ``load_partition(k)``; the index lists are compared exactly, order included."""

from __future__ import annotations

import json
import logging
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import one_line_refusal

import fedrift
from fedrift.data import DATASETS, load_dataset
from fedrift.data.flwr_partition import EXTRA, FlwrParams
from fedrift.data.partition import PARTITIONS, partition_dataset
from fedrift.engine.build import prepare
from fedrift.errors import ConfigError, FedriftError

datasets = pytest.importorskip("datasets")
P = pytest.importorskip("flwr_datasets.partitioner")
# the peers' own notes, made here on purpose (partition_sizes short of the set) or pyarrow's under ShardPartitioner's sort
pytestmark = [pytest.mark.filterwarnings("ignore:The sum of:UserWarning"),
              pytest.mark.filterwarnings("ignore:Specifying null_placement:FutureWarning")]


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", None, DATASETS.get("digits").params())


def peer(partitioner, labels, shuffle_seed=None, **columns) -> list[np.ndarray]:
    """The partitioner's own partition of these rows (``row``: each row's index), read with
    its ``load_partition``; shuffled first as ``FederatedDataset(shuffle=True, seed=...)`` does."""
    table = datasets.Dataset.from_dict({"label": labels, **columns, "row": np.arange(len(labels))})
    if shuffle_seed is not None:
        table = table.shuffle(seed=shuffle_seed)
    partitioner.dataset = table
    return [np.asarray(partitioner.load_partition(k).with_format("numpy")["row"][:], dtype=np.int64)
            for k in range(partitioner.num_partitions)]


def same(train, expected: list[np.ndarray]) -> bool:
    return len(train) == len(expected) and all(np.array_equal(a, b) for a, b in zip(train, expected))


def flwr(dataset, seed=0, **options):
    return partition_dataset(dataset, "flwr", options, seed)


DISTRIBUTION = np.random.default_rng(0).random((10, 2)).round(3).tolist()  # 10 labels x (2 labels x 10 clients / 10)
# (fedrift's options, the peer as a Flower user writes it, at seed 0)
CASES = {
    "dirichlet": ({"partitioner": "DirichletPartitioner", "num_clients": 6, "args": {"alpha": 0.3, "min_partition_size": 5}},
                  lambda: P.DirichletPartitioner(num_partitions=6, partition_by="label", alpha=0.3,
                                                 min_partition_size=5, seed=0)),
    "inner_dirichlet": ({"partitioner": "InnerDirichletPartitioner",
                         "args": {"partition_sizes": [400, 300, 200, 100], "alpha": 0.5}},
                        lambda: P.InnerDirichletPartitioner(partition_sizes=[400, 300, 200, 100], partition_by="label",
                                                            alpha=0.5, seed=0)),
    "shard": ({"partitioner": "ShardPartitioner", "num_clients": 8, "args": {"num_shards_per_partition": 2}},
              lambda: P.ShardPartitioner(num_partitions=8, partition_by="label", num_shards_per_partition=2, seed=0)),
    "pathological": ({"partitioner": "PathologicalPartitioner", "num_clients": 10,
                      "args": {"num_classes_per_partition": 2, "class_assignment_mode": "deterministic"}},
                     lambda: P.PathologicalPartitioner(num_partitions=10, partition_by="label", num_classes_per_partition=2,
                                                       class_assignment_mode="deterministic", seed=0)),
    "iid": ({"partitioner": "IidPartitioner", "num_clients": 7}, lambda: P.IidPartitioner(num_partitions=7)),
    "linear": ({"partitioner": "LinearPartitioner", "num_clients": 5}, lambda: P.LinearPartitioner(num_partitions=5)),
    "size": ({"partitioner": "SizePartitioner", "args": {"partition_sizes": [100, 250, 50]}},
             lambda: P.SizePartitioner(partition_sizes=[100, 250, 50])),
    "square": ({"partitioner": "SquarePartitioner", "num_clients": 4}, lambda: P.SquarePartitioner(num_partitions=4)),
    "exponential": ({"partitioner": "ExponentialPartitioner", "num_clients": 4},
                    lambda: P.ExponentialPartitioner(num_partitions=4)),
    "continuous": ({"partitioner": "ContinuousPartitioner", "num_clients": 5, "args": {"strictness": 0.7}},
                   lambda: P.ContinuousPartitioner(num_partitions=5, partition_by="label", strictness=0.7, seed=0)),
    "distribution": ({"partitioner": "DistributionPartitioner", "num_clients": 10,  # a YAML list for its numpy array
                      "args": {"distribution_array": DISTRIBUTION, "num_unique_labels_per_partition": 2,
                               "preassigned_num_samples_per_label": 5}},
                     lambda: P.DistributionPartitioner(distribution_array=np.asarray(DISTRIBUTION), num_partitions=10,
                                                       num_unique_labels_per_partition=2, partition_by="label",
                                                       preassigned_num_samples_per_label=5, seed=0)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_each_partitioner_gives_its_own_partition_sample_for_sample(digits, case):
    options, make = CASES[case]
    labels = digits.y_train.numpy()
    part = flwr(digits, **options)
    assert same(part.train, peer(make(), labels, shuffle_seed=0))  # shuffled as FederatedDataset shuffles
    if case in ("iid", "size", "shard"):  # the partitioner alone on fedrift's order (contiguous blocks, a sort)
        assert same(flwr(digits, **options, shuffle_dataset=False).train, peer(make(), labels))
    assert part.num_clients == len(part.test) and all(len(t) >= 10 for t in part.test)  # min_local_test


def test_the_seeds_default_to_the_runs_and_are_kept_when_given(digits):
    labels = digits.y_train.numpy()
    options = {"partitioner": "DirichletPartitioner", "num_clients": 5, "args": {"alpha": 0.5}}
    at_3 = flwr(digits, seed=3, **options)
    assert same(at_3.train, peer(P.DirichletPartitioner(num_partitions=5, partition_by="label", alpha=0.5, seed=3),
                                 labels, shuffle_seed=3))
    assert at_3.train == flwr(digits, seed=3, **options).train  # reproducible
    assert at_3.train != flwr(digits, seed=4, **options).train
    given = flwr(digits, seed=3, **{**options, "args": {"alpha": 0.5, "seed": 42}}, shuffle_seed=42)
    assert same(given.train, peer(P.DirichletPartitioner(num_partitions=5, partition_by="label", alpha=0.5),
                                  labels, shuffle_seed=42))  # Flower's defaults: seed 42 both
    assert at_3.options["partitioner_arguments"] == {"num_partitions": 5, "partition_by": "label", "seed": 3, "alpha": 0.5}
    assert at_3.options["shuffle_seed"] == 3


def test_holdout_rows_are_in_no_client_and_the_rest_partitioned_as_the_peer_does(digits):
    part = partition_dataset(digits, "flwr", {"partitioner": "IidPartitioner", "num_clients": 4}, 0, holdout=0.1)
    keep = np.setdiff1d(np.arange(digits.num_train), part.holdout)
    expected = peer(P.IidPartitioner(num_partitions=4), digits.y_train.numpy()[keep], shuffle_seed=0)
    assert same(part.train, [keep[ix] for ix in expected])


def test_natural_ids_on_synthetic_devices_with_their_own_test_samples(capsys, monkeypatch):
    from fedrift.data.notices import SAID

    monkeypatch.delenv(SAID, raising=False)
    prep = prepare({"seed": 0, "data": {"name": "synthetic", "num_devices": 12},
                    "partition": {"name": "flwr", "partitioner": "NaturalIdPartitioner", "args": {"partition_by": "device"}}})
    err = capsys.readouterr().err
    assert "Generating partition_id_to_indices" not in err  # its progress bar, hidden
    assert "natural groups" not in err  # split by the groups: no advice to use partition.name=natural
    ds, part = prep.dataset, prep.partition
    expected = peer(P.NaturalIdPartitioner(partition_by="device"), ds.y_train.numpy(), shuffle_seed=0,
                    device=ds.train_groups)
    assert part.num_clients == 12 and same(part.train, expected)
    for k in range(12):  # device k (ids sorted, as natural numbers them) and its own test samples
        assert set(ds.train_groups[part.train[k]]) == {k}
        assert np.array_equal(part.test[k], np.flatnonzero(ds.test_groups == k))
    grouped = partition_dataset(ds, "flwr", {"partitioner": "GroupedNaturalIdPartitioner", "args": {"group_size": 5}}, 0)
    assert same(grouped.train, peer(P.GroupedNaturalIdPartitioner(partition_by="client_id", group_size=5),
                                    ds.y_train.numpy(), shuffle_seed=0, client_id=ds.train_groups))
    assert grouped.num_clients == 3  # 5 + 5 + 2 devices ("allow-smaller")


def test_natural_ids_of_an_hf_dataset_match_the_peer_on_the_raw_writer_names(tmp_path):
    rng = np.random.default_rng(1)
    writers = np.array(["w-anna", "w-bo", "w-cy", "w-dee", "w-eve"])
    for split, n in (("train", 300), ("test", 100)):
        pq.write_table(pa.table({"x1": rng.normal(size=n), "x2": rng.normal(size=n), "label": rng.integers(0, 3, n),
                                 "writer_id": rng.choice(writers, n)}), tmp_path / f"{split}-00000-of-00001.parquet")
    prep = prepare({"data": {"name": "hf", "root": str(tmp_path), "client_id": "writer_id"},
                    "partition": {"name": "flwr", "partitioner": "NaturalIdPartitioner",
                                  "args": {"partition_by": "writer_id"}, "shuffle_seed": 5}})
    raw = pq.read_table(tmp_path / "train-00000-of-00001.parquet").to_pydict()
    expected = peer(P.NaturalIdPartitioner(partition_by="writer_id"), raw["label"], shuffle_seed=5,
                    writer_id=raw["writer_id"])
    assert same(prep.partition.train, expected)


def test_a_run_trains_on_a_flwr_partition(tiny):
    cfg = tiny(partition={"name": "flwr", "partitioner": "PathologicalPartitioner", "num_clients": 6,
                          "args": {"num_classes_per_partition": 3}}, train={"rounds": 1})
    result = fedrift.run(cfg)
    assert len(result.history) == 1 and 0.0 <= result.history[0]["test_accuracy"] <= 1.0
    saved = json.loads((result.output_dir / "partition.json").read_text())
    assert saved["name"] == "flwr" and saved["num_clients"] == 6
    assert saved["options"]["partitioner_arguments"]["num_classes_per_partition"] == 3


def test_the_partitioners_warnings_are_one_line_each(digits, caplog, monkeypatch):
    monkeypatch.delenv("FEDRIFT_SAID", raising=False)
    with caplog.at_level(logging.WARNING, logger="fedrift"):
        flwr(digits, partitioner="PathologicalPartitioner", num_clients=2, args={"num_classes_per_partition": 2})
    said = [r.getMessage() for r in caplog.records if "PathologicalPartitioner" in r.getMessage()]
    assert len(said) == 1 and "\n" not in said[0] and "will NOT be used" in said[0], said


REFUSALS = [
    ({"partitioner": "Dirichlet"}, "partition.partitioner: unknown partitioner 'Dirichlet'; allowed: ContinuousPartitioner, "
     "DirichletPartitioner, DistributionPartitioner, ExponentialPartitioner, GroupedNaturalIdPartitioner, IidPartitioner, "
     "InnerDirichletPartitioner, LinearPartitioner, NaturalIdPartitioner, PathologicalPartitioner, ShardPartitioner, "
     "SizePartitioner, SquarePartitioner"),
    ({}, "partition.partitioner: partition.name flwr needs one; allowed: ContinuousPartitioner, "),
    ({"partitioner": "VerticalEvenPartitioner"}, "VerticalEvenPartitioner is left out: it splits the columns"),
    ({"partitioner": "IdToSizeFncPartitioner"}, "takes a Python function"),
    ({"partitioner": "Partitioner"}, "partition.partitioner: Partitioner is left out: it is the abstract base class; allowed:"),
    ({"partitioner": "DirichletPartitioner", "args": {"alfa": 0.3}},
     "partition.args.alfa: not an argument of DirichletPartitioner; allowed: DirichletPartitioner's arguments "
     "partition_by, alpha, min_partition_size, self_balancing, shuffle, seed (num_partitions: partition.num_clients)"),
    ({"partitioner": "DirichletPartitioner"}, "partition.args.alpha: DirichletPartitioner needs it (no default)"),
    ({"partitioner": "DirichletPartitioner", "args": {"alpha": 0.3, "num_partitions": 4}},
     "partition.args.num_partitions: fedrift's partition.num_clients sets it; allowed: partition.num_clients=4"),
    ({"partitioner": "DirichletPartitioner", "args": {"alpha": 0.3, "seed": None}}, "partition.args.seed: null draws"),
    ({"partitioner": "DirichletPartitioner", "num_clients": 6, "args": {"alpha": 0.05, "min_partition_size": 200}},
     "partition.args: DirichletPartitioner(num_partitions=6, partition_by='label', seed=0, alpha=0.05, "
     "min_partition_size=200) refused the training set (1438 samples): The max number of attempts (10) was reached."),
    ({"partitioner": "DirichletPartitioner", "args": {"alpha": 0.01, "min_partition_size": 0}},
     "with no training sample; allowed: arguments that give every client one"),
    ({"partitioner": "NaturalIdPartitioner"}, "partition.args.partition_by: NaturalIdPartitioner partitions by "
     "'client_id' (its default here): the dataset's natural groups, and 'digits' has none; allowed: label"),
    ({"partitioner": "ShardPartitioner", "args": {"num_shards_per_partition": "two"}}, "ShardPartitioner("),
]


@pytest.mark.parametrize("options,message", REFUSALS)
def test_refusals_are_one_line_naming_what_is_allowed(digits, options, message):
    with pytest.raises(ConfigError) as err:
        flwr(digits, **options)
    text = str(err.value)
    assert message in text and "\n" not in text, text


def test_a_count_the_partitioner_makes_itself_must_match_num_clients():
    ds = load_dataset("synthetic", None, DATASETS.get("synthetic").params(num_devices=6))
    with pytest.raises(ConfigError, match=r"^partition\.num_clients: 5 but NaturalIdPartitioner\(partition_by='client_id'\) "
                                          r"makes 6 clients; allowed: 6 or null"):
        flwr(ds, partitioner="NaturalIdPartitioner", num_clients=5)
    assert flwr(ds, partitioner="NaturalIdPartitioner", num_clients=6).num_clients == 6


def test_a_missing_extra_is_one_line(digits, monkeypatch):
    monkeypatch.setitem(sys.modules, "flwr_datasets.partitioner", None)  # as if not installed
    with pytest.raises(FedriftError, match=r"^partition\.name: flwr needs the flwr-datasets extra: "
                                           r"pip install 'fedrift\[flwr-datasets\]'$"):
        flwr(digits, partitioner="IidPartitioner")
    assert EXTRA.endswith("pip install 'fedrift[flwr-datasets]'")


def test_the_command_line_sets_args_by_dotted_keys_and_refuses_with_exit_2(capsys, tmp_path):
    from fedrift.cli import main

    out = tmp_path / "p"
    assert main(["partition", "data.name=digits", "partition.name=flwr", "partition.partitioner=DirichletPartitioner",
                 "partition.args.alpha=0.3", "partition.num_clients=4", "--out", str(out)]) == 0
    saved = json.loads((out / "partition.json").read_text())
    assert saved["options"]["partitioner_arguments"]["alpha"] == 0.3 and saved["num_clients"] == 4
    capsys.readouterr()
    one_line_refusal(capsys, ["run", "data.name=digits", "partition.name=flwr", "partition.partitioner=ShardPartitioner",
                              "partition.args.shards=2", f"output.dir={tmp_path / 'r'}"],
                     "partition.args.shards: not an argument of ShardPartitioner; allowed:", "num_shards_per_partition")
    assert not (tmp_path / "r").exists()


def test_the_options_validate_as_a_config_section():
    assert FlwrParams().partitioner is None and FlwrParams().args == {}
    assert PARTITIONS.get("flwr").params is FlwrParams
    with pytest.raises(ConfigError, match=r"partition\.shuffle_seed"):
        partition_dataset(None, "flwr", {"partitioner": "IidPartitioner", "shuffle_seed": -1}, 0)
