"""Errors with the right words (issue 20, item 11) and small frictions (item 12), each from its reproduction."""

from __future__ import annotations

import os
import subprocess
import sys

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


def test_checking_an_optimizer_does_not_import_torch_dynamo():
    """The check is torch's own, on an empty parameter list: it stops before ``add_param_group`` imports
    ``torch._dynamo`` (0.8 s in a parent that never steps an optimizer); a real optimizer still imports it."""
    code = ("import sys\nfrom exonet.strategies import OptimSpec\n"
            "specs = [OptimSpec(name, lr=1e-3) for name in ('adamw', 'sgd', 'adam', 'rmsprop')]\n"
            "print('torch._dynamo' in sys.modules)\n"
            "import torch\nspecs[0].build([torch.zeros(1, requires_grad=True)])\n"
            "print('torch._dynamo' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "EXONET_WARM_UP": "0"})
    assert out.stdout.split() == ["False", "True"], out.stderr


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


class SkipsInit(DDPStrategy):
    def __init__(self, lr: float = 1e-3):  # forgets super().__init__()
        self.lr = lr


class SkipsSetup(DDPStrategy):
    def setup(self, model, comm, ctx):  # forgets super().setup(...)
        self.extra = 1


def test_a_strategy_that_skips_the_base_init_fails_in_the_parent_naming_the_fix():
    from exonet.toy import synthetic_classification, tiny_mlp

    with pytest.raises(TypeError, match=r"fit: SkipsInit.__init__ did not call super\(\).__init__\(...\)"):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4)).fit(SkipsInit(), num_nodes=2, max_steps=1,
                                                                           progress=False)


@pytest.mark.slow
def test_a_strategy_that_skips_the_base_setup_is_named_by_its_node():
    from exonet.toy import synthetic_classification, tiny_mlp

    with pytest.raises(NodeFailure, match=r"SkipsSetup.setup did not call super\(\).setup\(model, comm, ctx\)"):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4)).fit(SkipsSetup(), num_nodes=1, max_steps=1,
                                                                           batch_size=8, progress=False)


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"timeout_s": 0}, ValueError, r"fit: timeout_s must be > 0, got 0"),
    ({"timeout_s": -5}, ValueError, r"fit: timeout_s must be > 0"),
    ({"timeout_s": "10"}, TypeError, r"fit: timeout_s must be a number, got '10'"),
    ({"shuffle": "no"}, TypeError, r"fit: shuffle must be True or False, got 'no'"),
    ({"count_flops": "yes"}, TypeError, r"fit: count_flops must be True or False"),
    ({"run_dir": __file__}, ValueError, r"fit: run_dir must be a folder .* got the file"),
])
def test_fit_arguments_are_checked_before_any_node_starts(kwargs, error, match):
    from exonet.toy import synthetic_classification, tiny_mlp

    with pytest.raises(error, match=match):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4)).fit(DDPStrategy(), num_nodes=2, max_steps=1,
                                                                           progress=False, **kwargs)


class StallsRankOne(DDPStrategy):
    def step(self):
        if self.rank == 1 and self.local_step == 1:
            import time

            time.sleep(6)  # in its own code, not in a collective: its peer's all-reduce times out
        super().step()


@pytest.mark.slow
def test_a_collective_that_times_out_names_the_rank_that_was_not_in_one():
    from exonet.toy import synthetic_classification, tiny_mlp

    with pytest.raises(NodeFailure, match=r"(?s)node 0 failed: .*Timed out.*\(exonet: a collective waited longer "
                                          r"than fit's timeout_s=2 s for its peers; rank 1 was not in a collective"):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4)).fit(StallsRankOne(), num_nodes=2, max_steps=3,
                                                                           batch_size=8, timeout_s=2, progress=False)


class PassesUnequalSizes(DDPStrategy):
    def step(self):
        self.comm.all_reduce(torch.zeros(4 if self.rank == 0 else 8))  # gloo aborts the process it reaches
        super().step()


@pytest.mark.slow
def test_a_node_gloo_aborts_for_unequal_sizes_is_told_what_to_check():
    from exonet.toy import synthetic_classification, tiny_mlp

    with pytest.raises(NodeFailure, match=r"killed by signal SIGABRT \(gloo aborts a node whose peers pass a different "
                                          r"size to one collective: check that every rank passes the same shape"):
        LocalTrainer(tiny_mlp(), synthetic_classification(64, 8, 4)).fit(PassesUnequalSizes(), num_nodes=2,
                                                                           max_steps=2, batch_size=8, progress=False)
