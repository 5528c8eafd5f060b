"""In-memory datasets travel to the nodes once, in shared memory
(exonet.data.shared through exonet.runtime.transport)."""

from __future__ import annotations

import io
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from exonet import LocalTrainer
from exonet.bench import memory
from exonet.data.shared import BIG, Shipment
from exonet.runtime.batches import epoch_indices
from exonet.runtime.transport import ByValue, pickle_model, shared_by_value, shared_bytes
from exonet.strategies import DDPStrategy, OptimSpec
from exonet.toy import tiny_mlp


def roundtrip(*objs: object) -> list:
    """What a node unpickles, here in this process (the parent's descriptors are reachable through /proc/self)."""
    return [pickle.loads(pickle.dumps(sent)) for sent in shared_by_value(*objs)]


def test_a_large_storage_moves_into_shared_memory_in_place_and_the_node_maps_the_same_pages():
    x = torch.arange(BIG // 4, dtype=torch.float32).reshape(-1, 16)
    (got,) = roundtrip(TensorDataset(x, x[:, 0]))
    assert x.untyped_storage().is_shared()  # the parent's own tensor now lives in shared memory: no second copy
    assert torch.equal(got.tensors[0], x) and torch.equal(got.tensors[1], x[:, 0])
    got.tensors[0][3, 5] = -1.0  # the node's tensor is a view of the parent's pages
    assert x[3, 5] == -1.0
    views = [t.untyped_storage().data_ptr() for t in got.tensors]
    assert views[0] == views[1]  # views of one storage stay views of one storage


def test_small_tensors_share_one_arena_and_keep_their_values_dtypes_and_views():
    xs = [torch.randn(3, generator=torch.Generator().manual_seed(i)) for i in range(2000)]
    base = torch.arange(10, dtype=torch.int16)
    (got,) = roundtrip({"xs": xs, "view": base[2:5], "base": base, "grad": torch.ones(2, requires_grad=True)})
    assert all(torch.equal(a, b) for a, b in zip(got["xs"], xs))
    assert got["view"].dtype == torch.int16 and got["view"].tolist() == [2, 3, 4]
    got["base"][3] = 99
    assert got["view"][1] == 99 and base[3] == 3  # one storage in the node as in the parent; the parent's is untouched
    assert got["grad"].requires_grad


def test_numpy_arrays_travel_through_shared_memory_once_per_fit():
    big = np.arange(BIG // 8 * 2, dtype=np.float64).reshape(-1, 4)
    frozen = np.arange(6, dtype=np.int32)
    frozen.flags.writeable = False
    objects = np.array([{"a": 1}, None], dtype=object)
    train, val = roundtrip({"x": big, "frozen": frozen, "obj": objects, "fortran": np.asfortranarray(big[:8])},
                           {"x": big})
    assert np.array_equal(train["x"], big) and train["x"].dtype == big.dtype
    train["x"][0, 0] = -5.0  # train and val map one shared copy; the parent's array is its own
    assert val["x"][0, 0] == -5.0 and big[0, 0] == 0.0
    assert np.array_equal(train["frozen"], frozen) and not train["frozen"].flags.writeable
    assert train["obj"][0] == {"a": 1} and np.array_equal(train["fortran"], big[:8])


def test_a_memory_mapped_array_travels_as_its_file_and_shares_its_page_cache(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(1000, dtype=np.float32).reshape(100, 10))
    ro, rw = np.load(path, mmap_mode="r"), np.load(path, mmap_mode="r+")
    (got,) = roundtrip({"ro": ro, "rows": ro[10:20], "rw": rw, "cow": np.load(path, mmap_mode="c")})
    assert isinstance(got["rows"], np.memmap) and str(got["rows"].filename) == str(ro.filename)
    assert np.array_equal(got["ro"], ro) and np.array_equal(got["rows"], ro[10:20])
    got["rw"][10, 3] = -1.0  # the node's map and the parent's are the same pages of the file
    assert rw[10, 3] == -1.0 and got["rows"][0, 3] == -1.0 and not got["ro"].flags.writeable
    assert not isinstance(got["cow"], np.memmap) and got["cow"][10, 3] == 103.0  # copy-on-write: by shared memory


def test_no_room_in_shared_memory_is_a_clear_error_before_any_node_starts(monkeypatch):
    def full(*args):
        raise RuntimeError("unable to write to file </torch_1_2_3>: No space left on device (28)")

    monkeypatch.setattr(torch.UntypedStorage, "_share_fd_cpu_", full)
    monkeypatch.setattr(torch.UntypedStorage, "_new_shared", classmethod(full))
    with pytest.raises(RuntimeError, match=r"cannot place 1 MiB of the datasets in shared memory \(/dev/shm: .* free; "
                                           r"unable to write.*--shm-size.*factory"):
        roundtrip(torch.zeros(BIG // 4))


def test_the_model_travels_in_shared_memory_so_that_a_node_start_stays_small(monkeypatch):
    """A start larger than the pipe's buffer made the parent wait for each node in turn to read its copy."""
    model = torch.nn.Linear(512, 512)  # 1 MiB of weights
    blob = pickle_model(model)
    sent = shared_bytes(blob)  # held, as the supervisor holds it: its shared memory lives as long
    wire = pickle.dumps(sent)
    assert len(wire) < 4096 < len(blob)
    got = torch.load(io.BytesIO(pickle.loads(wire)), weights_only=False)
    assert torch.equal(got.weight, model.weight) and torch.equal(got.bias, model.bias)

    def full(*args):
        raise RuntimeError("unable to write to file </torch_1_2_3>: No space left on device (28)")

    monkeypatch.setattr(torch.UntypedStorage, "_new_shared", classmethod(full))
    assert shared_bytes(blob) is blob  # no room in /dev/shm: the bytes travel in each start, as before


def test_each_dataset_is_pickled_once_for_all_nodes():
    sent = ByValue(TensorDataset(torch.zeros(4, 2)), shipment=Shipment())
    assert sent.__reduce__()[1][0] is sent.__reduce__()[1][0]


@pytest.mark.parametrize("n", [10, 11, 1001])
@pytest.mark.parametrize("shuffle", [True, False])
def test_epoch_order_is_distributed_samplers_without_its_list_of_all_indices(n, shuffle):
    for k in (1, 3, 8):
        for rank in range(k):
            sampler = DistributedSampler(range(n), num_replicas=k, rank=rank, shuffle=shuffle, seed=7, drop_last=True)
            sampler.set_epoch(2)
            assert epoch_indices(n, rank, k, 7, 2, shuffle, shared=True) == list(sampler)


def test_a_dataset_of_thousands_of_tensors_reaches_the_nodes():
    """torch's reducers passed one descriptor per storage, and a process start carries at most 256."""
    g = torch.Generator().manual_seed(0)
    samples = [(torch.randn(8, generator=g), torch.tensor(i % 4)) for i in range(3000)]
    result = LocalTrainer(tiny_mlp(), samples).fit(DDPStrategy(OptimSpec("sgd", lr=0.1)), num_nodes=2, max_steps=3,
                                                   batch_size=8, device="cpu", progress=False)
    assert len(result.history["train_loss"]) == 3


@pytest.mark.slow
def test_a_64_mb_tensor_dataset_costs_one_copy_for_four_nodes_not_four():
    rows = 64 * 2**20 // memory.ROW_BYTES
    tiny = memory.measure_fresh("tensor", 1024, nodes=4, steps=40)
    large = memory.measure_fresh("tensor", rows, nodes=4, steps=40)
    extra = large["steady"] - tiny["steady"]  # K copies would cost 4 times the dataset (5 with the parent's)
    assert extra < 2 * rows * memory.ROW_BYTES, f"extra PSS {extra / 2**20:.0f} MiB for a 64 MiB dataset at K=4"
