"""Errors with the right words (issue 20, item 11) and small frictions (item 12), each from its reproduction."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from exonet import LocalTrainer, NodeFailure, Scenario, ScenarioError
from exonet.runtime.node import _explain_forward_error
from exonet.scenario.units import parse_rate
from exonet.strategies import DDPStrategy, OptimSpec


class TakesIdxTargets(nn.Module):  # nanoGPT's GPT.forward(idx, targets=None) signature, returning (logits, loss)
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(8, 8)

    def forward(self, idx, targets=None):
        logits = self.emb(idx)
        return logits, F.cross_entropy(logits.view(-1, 8), targets.view(-1)) if targets is not None else None


def test_a_forward_taking_idx_and_targets_is_told_that_model_gets_the_whole_batch():
    model, batch = TakesIdxTargets(), [torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long)]
    with pytest.raises(TypeError) as info:
        try:
            model(batch)
        except (AttributeError, TypeError) as exc:
            _explain_forward_error(model, batch, exc)
            raise
    message = str(info.value)
    assert "exonet calls model(batch) with the whole batch (here a list of 2)" in message
    assert "TakesIdxTargets.forward takes (idx, targets)" in message and "self.model(*batch)[1]" in message


@pytest.mark.slow
def test_a_fit_with_a_gpt_style_forward_names_the_fix():
    data = torch.utils.data.TensorDataset(torch.zeros(32, 3, dtype=torch.long), torch.zeros(32, 3, dtype=torch.long))
    with pytest.raises(NodeFailure, match=r"exonet calls model\(batch\) with the whole batch"):
        LocalTrainer(TakesIdxTargets(), data).fit(DDPStrategy(),
                                  num_nodes=1, max_steps=1, batch_size=8, val_size=0, progress=False)


def test_an_optimizer_torch_would_reject_fails_in_the_parent():
    with pytest.raises(ValueError, match=r"OptimSpec: SGD\(nesterov=True\) is rejected by torch: Nesterov momentum "
                                         r"requires a momentum"):
        OptimSpec("sgd", nesterov=True)
    with pytest.raises(ValueError, match=r"OptimSpec: AdamW\(lr=-1\) is rejected by torch"):
        OptimSpec("adamw", lr=-1)
    assert OptimSpec("sgd", lr=0.7, momentum=0.9, nesterov=True).kwargs["nesterov"] is True


def test_a_rate_without_per_second_suggests_the_rate_meant():
    with pytest.raises(ScenarioError, match=r"unknown rate unit 'mbit' in '100mbit' \(did you mean 'Mbit/s'\?\)"):
        parse_rate("100mbit")
    with pytest.raises(ScenarioError, match=r"\(did you mean 'Gbit/s'\?\)"):
        parse_rate("1 gbit")


def test_replace_names_the_variant_by_what_changed():
    base = Scenario.load("datacenter")
    assert base.replace(bandwidth="100 Mbit/s").name == "datacenter (bandwidth=100 Mbit/s)"
    assert base.replace(compute={"mode": "wall"}, latency="5 ms").name == "datacenter (compute.mode=wall, latency=5 ms)"
    assert base.replace(bandwidth="1 Gbit/s", name="mine").name == "mine"


@pytest.mark.slow
def test_a_dataset_class_the_nodes_cannot_import_is_named_with_its_import_error(tmp_path, monkeypatch):
    import importlib
    import sys

    (tmp_path / "only_in_parent.py").write_text(
        "import torch\n"
        "class Rows(torch.utils.data.Dataset):\n"
        "    def __len__(self):\n        return 32\n"
        "    def __getitem__(self, i):\n        return torch.zeros(8), 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("only_in_parent")
    monkeypatch.setitem(sys.modules, "only_in_parent", module)  # gone again after the test
    rows = module.Rows()  # importable here, so it is pickled by reference
    sys.path.remove(str(tmp_path))  # the nodes start with the parent's sys.path: now without that folder
    from exonet.toy import tiny_mlp

    with pytest.raises(NodeFailure, match=r"train_dataset: the node process cannot import module 'only_in_parent' "
                                          r"\(ModuleNotFoundError"):
        LocalTrainer(tiny_mlp(), rows).fit(DDPStrategy(), num_nodes=2, max_steps=1, batch_size=8, val_size=0,
                                           progress=False)


def test_a_users_code_sent_by_value_keeps_its_file_and_line(tmp_path):
    import io
    import pickle
    import traceback

    from exonet.runtime.transport import NodePickler

    path = tmp_path / "study.py"
    path.write_text("def f(x):\n    return 1 / x\n")
    namespace = {"__name__": "study_not_importable"}  # like __main__: cloudpickle sends its code by value
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    buf = io.BytesIO()
    NodePickler(buf).dump(namespace["f"])
    f = pickle.loads(buf.getvalue())
    assert f.__code__.co_filename == str(path)
    with pytest.raises(ZeroDivisionError) as info:
        f(0)
    assert f'File "{path}", line 2, in f' in "".join(traceback.format_tb(info.tb))
