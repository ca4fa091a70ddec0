"""batch_size is the global batch: gathered embeddings, GradCache micro-batches, sharded sampling, equivalence."""
from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from pacs.metric.common.errors import InputError
from pacs.metric.training.config import LossOptions
from pacs.metric.training.data import ShardedEpochBatches, split_micro_batches
from pacs.metric.training.encoding import loss_on_embeddings
from pacs.metric.training.grad_cache import grad_cache_step
from pacs.metric.training.losses import positive_augmented_loss, symmetric_infonce
from pacs.metric.training.trainer import MetricTrainConfig, micro_batch_size

from .metric_train_driver import GLOBAL_BATCH, STEPS, run, tiny_backbone

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent


class _DropoutEncoder(nn.Module):
    """A toy dual encoder with dropout: ([v, t, v', t'] normalised embeddings, learnable temperature)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.image = nn.Linear(6, 4)
        self.text = nn.Linear(5, 4)
        self.drop = nn.Dropout(0.3)
        self.log_scale = nn.Parameter(torch.tensor(1.2))

    def forward(self, batch):
        images, texts, gen_images, gen_texts = batch
        embed = [self.image(self.drop(images)), self.text(self.drop(texts)), self.image(self.drop(gen_images)),
                 self.text(self.drop(gen_texts))]
        return [F.normalize(e, dim=-1) for e in embed], self.log_scale.exp()


class _SigmoidDropoutEncoder(_DropoutEncoder):
    """The same toy encoder with SigLIP's temperature: ``[exp(log_scale), bias]`` (both learnable)."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.tensor(-2.0))

    def forward(self, batch):
        embeddings, scale = super().forward(batch)
        return embeddings, torch.stack([scale, self.bias])


def _toy_batch(n: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(11)
    return (torch.randn(n, 6, generator=generator), torch.randn(n, 5, generator=generator),
            torch.randn(n, 6, generator=generator), torch.randn(n, 5, generator=generator))


def _loss(embeddings, scale):
    return positive_augmented_loss(*embeddings, scale, lambda_v=0.3, lambda_t=0.2, relative_weight=0.5,
                                   margin_weight=0.5)


def _sigmoid_loss(embeddings, temperature):
    """The PAC-S++ loss with SigLIP's sigmoid terms (temperature = [scale, bias]) and every extra term."""
    return loss_on_embeddings(embeddings, temperature, LossOptions(kind="sigmoid", lambda_v=0.3, lambda_t=0.2,
                                                                   relative_weight=0.5, margin_weight=0.5))


@pytest.mark.parametrize(("encoder", "loss"), [(_DropoutEncoder, _loss), (_SigmoidDropoutEncoder, _sigmoid_loss)],
                         ids=["infonce", "sigmoid"])
def test_grad_cache_gives_the_full_batch_gradient_with_dropout_replayed(encoder, loss):
    batch = _toy_batch(8)
    micro = [tuple(part[i:i + 2] for part in batch) for i in range(0, 8, 2)]
    # direct: the same micro-batches encoded with a graph in the same order (same dropout draws), one loss, one backward
    direct_model = encoder()
    torch.manual_seed(0)
    parts = [direct_model(m) for m in micro]
    embeddings = [torch.cat([p[0][k] for p in parts]) for k in range(4)]
    expected = loss(embeddings, parts[-1][1])
    expected.total.backward()
    model = encoder()
    torch.manual_seed(0)
    terms = grad_cache_step(micro, model, loss, lambda t: t.backward())
    assert float(terms.total.detach()) == pytest.approx(float(expected.total.detach()), abs=1e-6)
    for (name, got), want in zip(model.named_parameters(), direct_model.parameters()):
        assert torch.allclose(got.grad, want.grad, atol=1e-6), name
    assert model.log_scale.grad.abs() > 1e-3 and float(terms.relative.detach()) > 0 and float(terms.margin.detach()) > 0
    if encoder is _SigmoidDropoutEncoder:  # the bias is trained through the cache too
        assert model.bias.grad.abs() > 1e-3
    # the RNG goes on as after one pass over the micro-batches (the replay draws nothing extra)
    next_draw = torch.rand(1)
    torch.manual_seed(0)
    with torch.no_grad():
        for m in micro:
            direct_model(m)
    assert torch.equal(next_draw, torch.rand(1))


def _hand_infonce(img: list[list[float]], txt: list[list[float]], scale: float) -> float:
    """Symmetric InfoNCE, both directions averaged, with plain python loops."""
    n = len(img)
    sims = [[scale * sum(a * b for a, b in zip(img[i], txt[j])) for j in range(n)] for i in range(n)]
    rows = sum(-sims[i][i] + math.log(sum(math.exp(s) for s in sims[i])) for i in range(n)) / n
    cols = sum(-sims[j][j] + math.log(sum(math.exp(sims[i][j]) for i in range(n))) for j in range(n)) / n
    return (rows + cols) / 2


def _gather_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist

    from pacs.metric.training.distributed import gather_with_grad

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    img, txt = _unit_pairs()
    local_img = img[2 * rank:2 * rank + 2].clone().requires_grad_()
    local_txt = txt[2 * rank:2 * rank + 2].clone().requires_grad_()
    loss = symmetric_infonce(gather_with_grad(local_img), gather_with_grad(local_txt), 2.0)
    loss.backward()
    # under DDP (averaging over the 2 ranks): this rank's 4 of the 8 toy pairs as 2 micro-batches (GradCache)
    # and as one micro-batch (the direct path)
    share = tuple(part[4 * rank:4 * rank + 4] for part in _toy_batch(8))
    results = {"loss": loss.detach(), "img": local_img.grad, "txt": local_txt.grad}
    for kind, encoder, loss in (("", _DropoutEncoder, _loss), ("sigmoid_", _SigmoidDropoutEncoder, _sigmoid_loss)):
        for name, micro in (("cache", [tuple(part[i:i + 2] for part in share) for i in (0, 2)]), ("direct", [share])):
            model = encoder()
            model.drop.p = 0.0
            ddp = nn.parallel.DistributedDataParallel(model)
            terms = grad_cache_step(micro, ddp, loss, lambda t: t.backward(), ddp.no_sync, averaged_over=2)
            results[f"{kind}{name}_loss"] = terms.total.detach()
            results[f"{kind}{name}_grads"] = {key: param.grad for key, param in model.named_parameters()}
    torch.save(results, f"{out}/rank{rank}.pt")
    dist.destroy_process_group()


def _unit_pairs() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(5)
    return (F.normalize(torch.randn(4, 3, generator=generator), dim=-1),
            F.normalize(torch.randn(4, 3, generator=generator), dim=-1))


def test_gathered_loss_and_ddp_grad_cache_on_two_processes_give_the_full_batch_ones(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(_gather_worker, args=(port, str(tmp_path)), nprocs=2)
    img, txt = _unit_pairs()
    expected = _hand_infonce(img.tolist(), txt.tolist(), 2.0)
    full_img, full_txt = img.clone().requires_grad_(), txt.clone().requires_grad_()
    symmetric_infonce(full_img, full_txt, 2.0).backward()  # one process, whole batch
    for rank in (0, 1):
        got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
        assert float(got["loss"]) == pytest.approx(expected, abs=1e-6)
        assert torch.allclose(got["img"], full_img.grad[2 * rank:2 * rank + 2], atol=1e-6)
        assert torch.allclose(got["txt"], full_txt.grad[2 * rank:2 * rank + 2], atol=1e-6)
    for kind, encoder, loss in (("", _DropoutEncoder, _loss), ("sigmoid_", _SigmoidDropoutEncoder, _sigmoid_loss)):
        model = encoder()  # the DDP GradCache gradients: those of one process on the whole toy batch
        model.drop.p = 0.0
        full = loss(*model(_toy_batch(8)))
        full.total.backward()
        for rank in (0, 1):
            got = torch.load(tmp_path / f"rank{rank}.pt", weights_only=True)
            for path in ("cache", "direct"):
                assert float(got[f"{kind}{path}_loss"]) == pytest.approx(float(full.total.detach()), abs=1e-6)
                for name, param in model.named_parameters():
                    assert torch.allclose(got[f"{kind}{path}_grads"][name], param.grad, atol=1e-6), (rank, path, name)
    local_only = _hand_infonce(img[:2].tolist(), txt[:2].tolist(), 2.0)
    assert abs(local_only - expected) > 1e-2  # what a process saw before: its own pairs only


def test_every_process_takes_its_share_of_the_same_global_batch():
    one = ShardedEpochBatches(21, 8, seed=4, epoch=1)
    shards = [ShardedEpochBatches(21, 8, seed=4, epoch=1, rank=r, processes=2) for r in (0, 1)]
    assert len(one) == 2 and one.dropped == 5 and all(len(b) == 8 for b in one)
    assert [a + b for a, b in zip(*shards)] == list(one)
    assert len({i for batch in one for i in batch}) == 16
    assert list(ShardedEpochBatches(21, 8, seed=4, epoch=1, start=1, rank=1, processes=2)) == [one.batches[1][4:]]
    assert list(ShardedEpochBatches(6, 2, 0, 0, shuffle=False, rank=1, processes=2)) == [[1], [3], [5]]
    with pytest.raises(InputError, match=r"batch_size \(8\) must be a positive multiple of the number of processes"):
        ShardedEpochBatches(21, 8, 0, 0, processes=3)
    batch = (torch.arange(4).float(), ["a", "b", "c", "d"], -torch.arange(4).float(), ["A", "B", "C", "D"])
    halves = split_micro_batches(batch, 2)
    assert [h[1] for h in halves] == [["a", "b"], ["c", "d"]] and halves[1][2].tolist() == [-2.0, -3.0]
    with pytest.raises(InputError, match=r"micro_batch_size \(3\) must divide the batch of 4"):
        split_micro_batches(batch, 3)


def test_micro_batch_size_defaults_to_the_process_share_and_must_divide_it():
    assert micro_batch_size(MetricTrainConfig(batch_size=8), 2) == 4
    assert micro_batch_size(MetricTrainConfig(batch_size=8, micro_batch_size=2), 2) == 2
    with pytest.raises(InputError, match=r"batch_size \(8\) must be a multiple of the number of processes \(3\)"):
        micro_batch_size(MetricTrainConfig(batch_size=8), 3)
    with pytest.raises(InputError, match=r"micro_batch_size \(4\) must divide .* = 2\)"):
        micro_batch_size(MetricTrainConfig(batch_size=8, micro_batch_size=4), 4)


def _driver_on_two_processes(out: Path, micro: int) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", HF_HUB_OFFLINE="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               str(HERE / "metric_train_driver.py"), str(out), str(micro)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=500, check=False)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.mark.slow
def test_one_process_two_processes_and_micro_batches_train_the_same_global_batch(tmp_path):
    """1 process x 8, 2 gloo processes x 4, 1 process x 4 micro-batches of 2: same losses and weights (1e-5)."""
    run(str(tmp_path / "one"), GLOBAL_BATCH)
    run(str(tmp_path / "quarter"), GLOBAL_BATCH // 4)
    _driver_on_two_processes(tmp_path / "two", GLOBAL_BATCH // 4 * 2)
    logs = {name: json.loads((tmp_path / name / "train_log.json").read_text()) for name in ("one", "quarter", "two")}
    weights = {name: load_file(str(tmp_path / name / "checkpoint.safetensors")) for name in logs}
    reference = logs["one"]
    assert len(reference["train_losses"]) == STEPS and reference["best_step"] == STEPS  # trained weights kept
    assert reference["train_losses"][-1] < reference["train_losses"][0]
    for name in ("quarter", "two"):
        for a, b in zip(reference["train_losses"], logs[name]["train_losses"], strict=True):
            assert abs(a - b) <= 1e-5, (name, reference["train_losses"], logs[name]["train_losses"])
        for a, b in zip(reference["history"], logs[name]["history"], strict=True):
            assert abs(a["val_total"] - b["val_total"]) <= 1e-5, name
        assert weights[name].keys() == weights["one"].keys()
        for key, value in weights["one"].items():
            assert (value - weights[name][key]).abs().max() <= 1e-5, (name, key)
    base = tiny_backbone().model.state_dict()  # LoRA deltas merged, temperature trained
    for key in ("visual.conv1.weight", "logit_scale"):
        assert not torch.equal(weights["one"][key], base[key])
