"""The field's methods: bit-packed codecs and their wire bytes; SparseLoCo, NoLoCo and MuLoCo against plain
re-derivations."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from exonet import LocalTrainer
from exonet.estimate import estimate
from exonet.strategies import DiLoCoStrategy, MuLoCoStrategy, NoLoCoStrategy, OptimSpec, SparseLoCoStrategy
from exonet.strategies.codecs import StatQuantizer, TopKChunks, pack_bits, packed_nbytes, unpack_bits
from exonet.strategies.muloco import hidden_matrices
from exonet.strategies.muon import MuonAdamW
from exonet.strategies.noloco import gossip_peer
from exonet.toy import Classifier, ShardFactory
from exonet.trace import Collective, Wait

K, STEPS, H, BATCH, LR = 4, 6, 2, 8, 0.1


# ------------------------------------------------------------------ codecs, no processes
@given(bits=st.integers(1, 16), count=st.integers(1, 300), seed=st.integers(0, 2**16))
def test_packed_codes_round_trip_in_exactly_their_bits(bits, count, seed):
    codes = torch.randint(0, 1 << bits, (count,), generator=torch.Generator().manual_seed(seed))
    wire = pack_bits(codes, bits)
    assert wire.dtype == torch.uint8 and wire.numel() == packed_nbytes(count, bits) == math.ceil(count * bits / 8)
    assert torch.equal(unpack_bits(wire, bits, count), codes)


def test_two_bit_codes_pack_four_to_a_byte_least_significant_first():
    assert pack_bits(torch.tensor([1, 2, 3, 0, 3]), 2).tolist() == [1 | 2 << 2 | 3 << 4, 3]


@pytest.mark.parametrize("bits", [1, 2, 4, 8])
def test_a_quantizer_puts_its_formula_on_the_wire_and_decodes_what_it_reports(bits):
    q = StatQuantizer(bits)
    values = torch.randn(1001, generator=torch.Generator().manual_seed(bits))
    wire, decoded = q.encode(values)
    assert wire.numel() == q.wire_nbytes(1001) == math.ceil(1001 * bits / 8) + 4 * (1 + 2**bits)
    assert torch.equal(q.decode(wire, 1001), decoded)


def test_two_bit_values_round_trip_within_one_bin_and_each_code_is_its_bins_mean():
    """Uniform values on [-1, 1] lie inside the 4 bins (6σ wide, σ ≈ 0.58): each decodes within one bin width
    (the scale) of itself, and to the mean of the values that share its code."""
    q = StatQuantizer(2)
    values = torch.rand(4000, generator=torch.Generator().manual_seed(0)) * 2 - 1
    codes, header = q.quantize(values)
    scale = 6 * (values - values.mean()).norm().item() / math.sqrt(3999) / 4
    decoded = q.dequantize(codes, header)
    assert (decoded - values).abs().max().item() <= scale
    for code in codes.unique():
        chosen = codes == code
        assert torch.allclose(decoded[chosen], values[chosen].mean().expand(int(chosen.sum())), atol=1e-6)


@pytest.mark.parametrize(("shape", "tiles", "k", "index_bits"), [
    ((256, 256), 16, 64, 12),  # 64×64 tiles keep top_k
    ((10, 64), 1, 10, 10),  # a 10×64 tile keeps round(640·64/4096)
    ((96,), 2, 1, 6),  # 1-D: chunks of 48, k = max(1, round(48·64/4096))
    ((8, 3, 4, 4), 1, 6, 9),  # a conv weight as one 8×48 tile of 384 entries
])
def test_topk_tiles_follow_the_references_sizes_and_their_bytes_the_formula(shape, tiles, k, index_bits):
    codec = TopKChunks(shape, top_k=64, chunk=64, quantizer=StatQuantizer(2))
    assert (codec.tiles, codec.k, codec.index_bits) == (tiles, k, index_bits)
    kept = tiles * k
    expect = math.ceil(kept * index_bits / 8) + math.ceil(kept * 2 / 8) + 4 * 5
    wire, dense = codec.encode(torch.randn(shape))
    assert wire.numel() == codec.wire_nbytes() == expect
    idx, values = codec.decode_sparse(wire)
    rows = codec.tiles_of(dense)
    assert torch.equal(torch.gather(rows, -1, idx), values) and int((rows != 0).sum()) <= kept


def test_topk_keeps_the_largest_magnitudes_of_each_tile():
    codec = TopKChunks((4, 8), top_k=2, chunk=4)  # fp32 values, two 4×4 tiles, 2 kept each
    x = torch.zeros(4, 8)
    x[0, 0], x[3, 3], x[1, 1] = 5.0, -7.0, 1.0  # left tile: -7 and 5 beat 1
    x[2, 6], x[0, 7] = 3.0, -2.0
    wire, dense = codec.encode(x)
    assert wire.numel() == codec.wire_nbytes() == 2 + 4 * 4  # 4 indices at 4 bits, 4 fp32 values
    expect = x.clone()
    expect[1, 1] = 0.0
    assert torch.equal(dense, expect)


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"bits": 0}, "bits"), ({"bits": 17}, "bits"), ({"top_k": 4097}, "top_k"), ({"top_k": 17, "chunk": 4}, "top_k"),
    ({"error_decay": 1.5}, "error_decay"), ({"outer_lr": 0}, "outer_lr"), ({"chunk": 0}, "chunk"),
])
def test_sparseloco_refuses_a_bad_codec_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SparseLoCoStrategy(**kwargs)


def test_noloco_needs_an_even_number_of_nodes_and_pairs_each_with_one_peer():
    with pytest.raises(ValueError, match=r"even number of nodes \(or one\), got 3"):
        NoLoCoStrategy().check_world(3)
    for steps in (50, 100, 150):
        peers = [gossip_peer(r, 8, steps) for r in range(8)]
        assert all(peers[peers[r]] == r != peers[r] for r in range(8))
    assert [gossip_peer(r, 8, 50) for r in range(8)] != [gossip_peer(r, 8, 100) for r in range(8)]


# ------------------------------------------------------- runs against re-derivations
def small_model() -> Classifier:
    """A 2-D weight cut into 4×4 tiles, a bias in 1-D chunks, and an output layer."""
    torch.manual_seed(0)
    return Classifier(nn.Sequential(nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 4)))


FACTORY = ShardFactory(n=256, dim=16, classes=4)


def batches() -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    shards = [FACTORY(rank, K, True).tensors for rank in range(K)]
    return [[(x[s * BATCH:(s + 1) * BATCH], y[s * BATCH:(s + 1) * BATCH]) for s in range(STEPS)] for x, y in shards]


def inner_steps(model: nn.Module, theta: list[torch.Tensor], data: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """H steps of plain SGD from ``theta`` (updated in place)."""
    params = list(model.parameters())
    for batch in data:
        with torch.no_grad():
            for p, t in zip(params, theta):
                p.copy_(t)
        model.zero_grad()
        model(batch).backward()
        with torch.no_grad():
            for t, p in zip(theta, params):
                t.sub_(LR * p.grad)


def fit(strategy):
    return LocalTrainer(small_model(), FACTORY).fit(strategy, num_nodes=K, max_steps=STEPS, batch_size=BATCH,
                                                   shuffle=False, progress=False)


def plain_quantize(v: torch.Tensor) -> torch.Tensor:
    """The reference's 2-bit statistical quantizer (``TopKCompressor._quantize`` then ``_dequantize``)."""
    shift = v.mean()
    c = v - shift
    scale = 6 * (c.norm() / math.sqrt(v.numel() - 1)) / 4 if v.numel() > 1 else torch.tensor(0.0)
    q = (c / (scale if scale > 0 else 1) + 2).round().clamp(0, 3)
    table = [c[q == b].mean() if (q == b).any() else torch.tensor(0.0) for b in range(4)]
    return torch.stack([table[int(b)] for b in q]) + shift


def plain_sparseloco(top_k: int, chunk: int, decay: float) -> nn.Module:
    """SparseLoCo written out tile by tile from the reference's ``SparseLoCo.step`` (outer lr 1)."""
    model = small_model()
    data = batches()
    anchor = [p.detach().clone() for p in model.parameters()]
    error = [[torch.zeros_like(t) for t in anchor] for _ in range(K)]
    for r in range(STEPS // H):
        thetas = []
        for rank in range(K):
            theta = [t.clone() for t in anchor]
            inner_steps(model, theta, data[rank][r * H:(r + 1) * H])
            thetas.append(theta)
        for i, a in enumerate(anchor):
            mat = a.reshape(1, -1) if a.dim() == 1 else a
            rows, cols = mat.shape
            h = 1 if a.dim() == 1 else max(d for d in range(1, min(rows, chunk) + 1) if rows % d == 0)
            w = max(d for d in range(1, min(cols, chunk) + 1) if cols % d == 0)
            k = max(1, round(h * w * top_k / chunk**2))
            sums, counts = torch.zeros(rows, cols), torch.zeros(rows, cols)
            for rank in range(K):
                e = error[rank][i].mul_(decay).add_(a - thetas[rank][i]).view(rows, cols)
                picks, kept = [], []
                for y in range(0, rows, h):
                    for x in range(0, cols, w):
                        tile = e[y:y + h, x:x + w].reshape(-1)
                        top = tile.abs().topk(k).indices
                        picks += [(y + int(j) // w, x + int(j) % w) for j in top]
                        kept.append(tile[top])
                sent = plain_quantize(torch.cat(kept))
                for (y, x), value in zip(picks, sent):
                    e[y, x] -= value
                    sums[y, x] += value
                    counts[y, x] += 1
            a.sub_((sums / counts.clamp(min=1)).view_as(a))
    with torch.no_grad():
        for p, a in zip(model.parameters(), anchor):
            p.copy_(a)
    return model


@pytest.fixture(scope="module")
def sparseloco_run():
    return fit(SparseLoCoStrategy(OptimSpec("sgd", lr=LR), H=H, top_k=3, chunk=4, bits=2, error_decay=0.9))


def test_sparseloco_equals_a_plain_rederivation_of_the_reference_after_3_outer_steps(sparseloco_run):
    want = plain_sparseloco(top_k=3, chunk=4, decay=0.9)
    for (name, got), expected in zip(sparseloco_run.model.named_parameters(), want.parameters()):
        assert torch.allclose(got, expected, rtol=0, atol=1e-5), name


def test_sparseloco_sends_one_all_gather_of_its_codecs_bytes_per_round(sparseloco_run):
    """Per round each node all-gathers the packed message: for the 8×16 weight, 8 tiles × 3 entries at 4-bit
    indices and 2-bit codes; the bias, 2 chunks × 1; the 4×8 weight, 2 tiles × 3; the last bias, 1 chunk × 1
    (k = max(1, round(4·3/16))); each tensor adds its 20-byte header."""
    per_tensor = [(24, 4), (2, 2), (6, 4), (1, 2)]
    message = sum(math.ceil(n * b / 8) + math.ceil(n * 2 / 8) + 20 for n, b in per_tensor)
    trace = sparseloco_run.trace
    for rank in range(K):
        colls = [e for e in trace.events[rank] if isinstance(e, Collective)]
        assert [(c.op, c.nbytes, c.dtype) for c in colls] == [("all_gather", message, "uint8")] * (STEPS // H)
    assert trace.payload_per_trainer() == message * STEPS // H


def plain_noloco(alpha: float, beta: float) -> nn.Module:
    """NoLoCo from the reference's ``outer_step``: pairs (perm[j], perm[j + K/2]) from
    ``default_rng(step + 1)``, m ← βm + α(d̄ + φ̄ − φ), φ ← φ + m."""
    model = small_model()
    data = batches()
    start = [p.detach().clone() for p in model.parameters()]
    phi = [[t.clone() for t in start] for _ in range(K)]
    momentum = [[torch.zeros_like(t) for t in start] for _ in range(K)]
    for r in range(STEPS // H):
        thetas = []
        for rank in range(K):
            theta = [t.clone() for t in phi[rank]]
            inner_steps(model, theta, data[rank][r * H:(r + 1) * H])
            thetas.append(theta)
        perm = np.random.default_rng((r + 1) * H + 1).permutation(K)
        new_phi = copy.deepcopy(phi)
        for j in range(K // 2):
            pair = (int(perm[j]), int(perm[j + K // 2]))
            for i in range(len(start)):
                phi_mean = sum(phi[q][i] for q in pair) / 2
                d_mean = sum(thetas[q][i] - phi[q][i] for q in pair) / 2
                for q in pair:
                    momentum[q][i] = beta * momentum[q][i] + alpha * (d_mean + phi_mean - phi[q][i])
                    new_phi[q][i] = phi[q][i] + momentum[q][i]
        phi = new_phi
    return phi


@pytest.fixture(scope="module")
def noloco_run():
    return fit(NoLoCoStrategy(OptimSpec("sgd", lr=LR), H=H, outer_lr=0.7, outer_momentum=0.5))


def test_noloco_equals_a_plain_rederivation_of_the_reference_after_3_outer_steps(noloco_run):
    """The run's result is the node-averaged model; each node's parameters are its outer weights after the last
    outer step. The replicas differ (a pair averages only with itself), so the mean of all four is checked."""
    phi = plain_noloco(alpha=0.7, beta=0.5)
    assert not torch.allclose(phi[0][0], phi[1][0], atol=1e-3)
    for i, (name, got) in enumerate(noloco_run.model.named_parameters()):
        expected = sum(phi[rank][i] for rank in range(K)) / K
        assert torch.allclose(got, expected, rtol=0, atol=1e-5), name


def test_noloco_sends_its_outer_weights_and_pseudo_gradient_to_one_peer_per_round(noloco_run):
    params = sum(p.numel() for p in small_model().parameters())
    trace = noloco_run.trace
    for rank in range(K):
        sends = [e for e in trace.events[rank] if isinstance(e, Collective) and e.op == "send"]
        peers = [gossip_peer(rank, K, (r + 1) * H) for r in range(STEPS // H)]
        assert [(e.group, e.nbytes) for e in sends] == [(tuple(sorted((rank, p))), 8 * params) for p in peers]
        assert not [e for e in trace.events[rank] if isinstance(e, Collective) and e.op not in ("send", "recv")]


def test_estimate_prices_sparseloco_and_noloco_by_their_messages():
    """On meta tensors the estimate's payload is the codec's bytes (SparseLoCo: 256 tiles × 64 entries at 12 + 2
    bits, plus 20) and 8 bytes per parameter to one peer (NoLoCo), per round."""
    model = lambda: nn.Linear(1024, 1024, bias=False)  # noqa: E731
    sparse = estimate("sparseloco:H=10", model=model, num_nodes=4, max_steps=20, step_time=0.1)
    message = math.ceil(256 * 64 * 12 / 8) + math.ceil(256 * 64 * 2 / 8) + 20
    assert TopKChunks((1024, 1024), 64, 64, StatQuantizer(2)).wire_nbytes() == message
    assert sparse.trace.payload_per_trainer() == 2 * message
    gossip = estimate("noloco:H=10", model=model, num_nodes=4, max_steps=20, step_time=0.1)
    assert gossip.trace.payload_per_trainer() == 2 * 8 * 1024 * 1024


# ------------------------------------------------------------------- MuLoCo and Muon
def test_muon_takes_the_hidden_matrices_and_adamw_the_rest():
    model = nn.Sequential(nn.Embedding(10, 8), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Linear(8, 3))
    hidden = hidden_matrices(model)
    assert hidden == {id(model[1].weight), id(model[3].weight)}  # not the embedding, a bias or the head


def test_muon_adamw_steps_as_torchs_muon_and_adamw_side_by_side_and_resumes():
    torch.manual_seed(0)
    w, b = torch.randn(6, 4, requires_grad=True), torch.randn(4, requires_grad=True)
    twins = [t.detach().clone().requires_grad_() for t in (w, b)]
    ours = MuonAdamW([w, b], lr=0.05, adamw_lr=0.01)
    muon = torch.optim.Muon([twins[0]], lr=0.05, momentum=0.95, nesterov=True, weight_decay=0.01)
    adamw = torch.optim.AdamW([twins[1]], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(ours, lambda step: 0.5 ** step)
    for step in range(3):
        grads = torch.randn(6, 4), torch.randn(4)
        for t, g in zip((w, b, *twins), grads * 2):
            t.grad = g.clone()
        ours.step()
        muon.step(), adamw.step()
        schedule.step()
        for opt in (muon, adamw):
            for group in opt.param_groups:
                group["lr"] *= 0.5
    assert torch.equal(w, twins[0]) and torch.equal(b, twins[1])
    resumed = MuonAdamW([w.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()])
    resumed.load_state_dict(ours.state_dict())
    assert [g["lr"] for g in resumed.param_groups] == [0.05 / 8, 0.01 / 8]
    with pytest.raises(ValueError, match="2-D parameters only"):
        MuonAdamW([{"params": [b], "muon": True}])


def plain_muloco() -> list[torch.Tensor]:
    """DiLoCo by hand with torch's Muon on the hidden matrix and AdamW on the rest, outer Nesterov SGD."""
    model = small_model()
    data = batches()
    params = list(model.parameters())
    hidden = hidden_matrices(model)
    anchor = [p.detach().clone() for p in params]
    states = [None] * K
    outer_param = torch.cat([a.reshape(-1) for a in anchor]).requires_grad_()
    outer = torch.optim.SGD([outer_param], lr=0.7, momentum=0.6, nesterov=True)
    for r in range(STEPS // H):
        finals = []
        for rank in range(K):
            with torch.no_grad():
                for p, a in zip(params, anchor):
                    p.copy_(a)
            inner = MuonAdamW([{"params": [p for p in params if id(p) in hidden], "muon": True},
                               {"params": [p for p in params if id(p) not in hidden], "muon": False}])
            if states[rank] is not None:
                inner.load_state_dict(states[rank])
            for batch in data[rank][r * H:(r + 1) * H]:
                model.zero_grad()
                model(batch).backward()
                inner.step()
            states[rank] = inner.state_dict()
            finals.append(torch.cat([p.detach().reshape(-1) for p in params]))
        outer_param.grad = outer_param.detach() - sum(finals) / K
        outer.step()
        anchor = [t.view_as(a).clone() for t, a in zip(outer_param.detach().split([a.numel() for a in anchor]),
                                                        anchor)]
    return anchor


def test_muloco_equals_diloco_by_hand_with_torchs_muon_inside():
    result = fit(MuLoCoStrategy(H=H))
    for (name, got), expected in zip(result.model.named_parameters(), plain_muloco()):
        assert torch.allclose(got, expected, rtol=0, atol=1e-5), name


def plain_quantized_diloco(bits: int, decay: float) -> list[torch.Tensor]:
    """DiLoCo by hand with MuLoCo's quantized exchange: e ← decay·e + Δ per node, each tensor quantized on its own
    (``StatQuantizer``, the reference's statistics), e minus what was sent, the mean of what everyone sent as the
    outer gradient (Nesterov SGD lr 0.7, momentum 0.9)."""
    model = small_model()
    data = batches()
    anchor = [p.detach().clone() for p in model.parameters()]
    error = [[torch.zeros_like(a) for a in anchor] for _ in range(K)]
    flat = torch.cat([a.reshape(-1) for a in anchor]).requires_grad_()
    outer = torch.optim.SGD([flat], lr=0.7, momentum=0.9, nesterov=True)
    q = StatQuantizer(bits)
    for r in range(STEPS // H):
        sent = [[] for _ in anchor]
        for rank in range(K):
            theta = [a.clone() for a in anchor]
            inner_steps(model, theta, data[rank][r * H:(r + 1) * H])
            for i, (a, t) in enumerate(zip(anchor, theta)):
                e = error[rank][i].mul_(decay).add_(a - t)
                codes, header = q.quantize(e.reshape(-1))
                decoded = q.dequantize(codes, header).view_as(e)
                e.sub_(decoded)
                sent[i].append(decoded)
        flat.grad = torch.cat([(sum(s) / K).reshape(-1) for s in sent])
        outer.step()
        anchor = [t.view_as(a).clone() for t, a in zip(flat.detach().split([a.numel() for a in anchor]), anchor)]
    return anchor


@pytest.fixture(scope="module")
def quantized_diloco_run():
    return fit(DiLoCoStrategy(OptimSpec("sgd", lr=LR), H=H, quantize_bits=2, error_decay=0.9))


def test_two_bit_diloco_equals_a_plain_rederivation_of_mulocos_quantized_exchange(quantized_diloco_run):
    for (name, got), expected in zip(quantized_diloco_run.model.named_parameters(), plain_quantized_diloco(2, 0.9)):
        assert torch.allclose(got, expected, rtol=0, atol=1e-5), name


def test_two_bit_diloco_all_gathers_its_packed_codes_once_per_round(quantized_diloco_run):
    sizes = [p.numel() for p in small_model().parameters()]  # 128, 8, 32, 4
    message = sum(math.ceil(n * 2 / 8) + 4 * 5 for n in sizes)
    for rank in range(K):
        colls = [e for e in quantized_diloco_run.trace.events[rank] if isinstance(e, Collective)]
        assert [(c.op, c.nbytes, c.dtype) for c in colls] == [("all_gather", message, "uint8")] * (STEPS // H)


def test_quantized_diloco_refuses_what_its_exchange_cannot_do():
    with pytest.raises(ValueError, match="quantize_bits"):
        DiLoCoStrategy(quantize_bits=17)
    with pytest.raises(ValueError, match="replica_size > 1, deadline_s or elastic"):
        DiLoCoStrategy(quantize_bits=2, elastic=True)


def plain_overlapped_diloco(overlap: str) -> list[torch.Tensor]:
    """DiLoCo by hand with the outer all-reduce one round late (arXiv 2502.12996): each node m keeps its own θ_m and
    Nesterov SGD (lr 0.7, momentum 0.9); at the end of round t it steps on Δ̄_{t−1} ("delayed") or on
    Δ̄_{t−1} − Δ_m,t−1/K + Δ_m,t/K ("eager"); the run's model is the nodes' mean."""
    model = small_model()
    data = batches()
    start = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    shapes = [p.shape for p in model.parameters()]
    flats = [start.clone().requires_grad_() for _ in range(K)]
    outers = [torch.optim.SGD([f], lr=0.7, momentum=0.9, nesterov=True) for f in flats]
    previous: list[torch.Tensor] | None = None
    for r in range(STEPS // H):
        deltas = []
        for rank in range(K):
            theta = [t.view(shape).clone() for t, shape in zip(flats[rank].detach().split([s.numel() for s in shapes]),
                                                              shapes)]
            inner_steps(model, theta, data[rank][r * H:(r + 1) * H])
            deltas.append(flats[rank].detach() - torch.cat([t.reshape(-1) for t in theta]))
        for rank in range(K):
            if overlap == "delayed":
                grad = None if previous is None else sum(previous) / K
            else:
                grad = deltas[rank] / K + (0 if previous is None else (sum(previous) - previous[rank]) / K)
            if grad is not None:
                flats[rank].grad = grad
                outers[rank].step()
        previous = deltas
    mean = sum(f.detach() for f in flats) / K
    return [t.view(shape) for t, shape in zip(mean.split([s.numel() for s in shapes]), shapes)]


@pytest.fixture(scope="module", params=["eager", "delayed"])
def overlapped_run(request):
    return request.param, fit(DiLoCoStrategy(OptimSpec("sgd", lr=LR), H=H, overlap=request.param))


def test_overlapped_diloco_equals_a_plain_rederivation_of_delayed_and_eager_outer_steps(overlapped_run):
    overlap, run = overlapped_run
    for (name, got), expected in zip(run.model.named_parameters(), plain_overlapped_diloco(overlap)):
        assert torch.allclose(got, expected, rtol=0, atol=1e-5), (overlap, name)


def test_overlapped_diloco_waits_on_each_rounds_all_reduce_one_round_later(overlapped_run):
    """The same bytes as DiLoCo (P fp32 values per round), but issued async and waited at the next round's end,
    so the replay overlaps them with its H inner steps; the last lands at the end of the run."""
    _, run = overlapped_run
    nbytes = 4 * sum(p.numel() for p in small_model().parameters())
    for rank in range(K):
        ops = [("wait", e.cid) if isinstance(e, Wait) else (e.op, e.nbytes, e.async_op, e.cid)
               for e in run.trace.events[rank] if isinstance(e, (Collective, Wait))]
        assert ops == [("all_reduce", nbytes, True, 0), ("all_reduce", nbytes, True, 1), ("wait", 0),
                       ("all_reduce", nbytes, True, 2), ("wait", 1), ("wait", 2)]


def test_overlap_refuses_what_a_round_late_all_reduce_cannot_do():
    with pytest.raises(ValueError, match="overlap must be None, 'delayed' or 'eager', got 'lazy'"):
        DiLoCoStrategy(overlap="lazy")
    with pytest.raises(ValueError, match="overlap: .* participation < 1"):
        DiLoCoStrategy(overlap="eager", participation=0.5)
    with pytest.raises(ValueError, match="overlap: .*quantize_bits"):
        DiLoCoStrategy(overlap="delayed", quantize_bits=2)
