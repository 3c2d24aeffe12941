"""The lab's GPT on the paths a fast GPU run takes (issue 47), held on a CPU.

- The vocabulary padded to a multiple of 64 (50,257 -> 50,304): the output layer multiplies at the
  padded width, the logits are the real vocabulary's, equal to an unpadded model's on the same
  weights (so a padding id never wins, whatever its row holds), and so are the loss and gradients.
- The FLOP count is the model's (PaLM's convention): the padded model counts as the unpadded one,
  and the FLOPs the padding adds are exactly the output layer's extra columns.
- Attention is `scaled_dot_product_attention` with `is_causal` and no mask, which the flash kernel
  takes (run here under the flash backend alone).
- The optimizer (sgd or adamw) is built with `fused=True` on CUDA and not on a CPU
  (`scaling.train.optimizer.use_fused`, with the device named rather than present).
- The GPU configs' datasets are held on the device: a training batch copies nothing to it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from scaling.instrument.flops import training_flops_per_sample
from scaling.models import build_model
from scaling.models.gpt import GPT, GPT2_TINY, GPTShape, padded_vocab_size
from tests.one_thread import one_torch_thread  # noqa: F401  (autouse: one intra-op thread)

SHAPE = GPTShape(layers=2, heads=2, width=32, context=16)
VOCAB = 250  # padded to 256


def _pair(vocab: int = VOCAB) -> tuple[GPT, GPT]:
    """A padded model and an unpadded one holding the same weights (the padded one's real rows)."""
    torch.manual_seed(0)
    padded = GPT(SHAPE, vocab)
    plain = GPT(SHAPE, vocab, pad_to=1)
    state = padded.state_dict()
    state = {k: (v[:vocab] if k in ("tokens.weight", "head.weight") else v) for k, v in state.items()}
    plain.load_state_dict(state)
    return padded, plain


def test_gpt2_vocabulary_is_padded_to_50304_and_its_real_parameters_are_gpt2s():
    assert padded_vocab_size(50257) == 50304 and padded_vocab_size(256) == 256 and padded_vocab_size(7, 1) == 7
    with torch.device("meta"):
        model = build_model("gpt2-small", 50257)
    assert model.vocab == 50257 and model.padded_vocab == 50304
    assert model.head.weight.shape == (50304, 768) and model.head.weight is model.tokens.weight
    total = sum(p.numel() for p in model.parameters())
    assert total - model.padding_parameters == 124_439_808 and model.padding_parameters == 47 * 768


def test_padded_logits_are_the_unpadded_models_and_a_padding_id_never_wins():
    padded, plain = _pair()
    with torch.no_grad():
        # a padding row that would win every position if its logit reached the output
        padded.tokens.weight[VOCAB:] = 1e3 * padded.norm.weight.sign()
    widths = []
    padded.head.register_forward_hook(lambda _m, _i, out: widths.append(out.shape[-1]))
    ids = torch.randint(0, VOCAB, (3, 12))
    logits = padded(ids)
    assert widths == [256]  # the multiply ran at the padded width
    assert logits.shape == (3, 12, VOCAB)
    torch.testing.assert_close(logits, plain(ids))
    assert int(logits.argmax(-1).max()) < VOCAB


def test_loss_and_gradients_equal_the_unpadded_models_and_padding_rows_get_none():
    padded, plain = _pair()
    ids = torch.randint(0, VOCAB, (4, 16))
    targets = torch.randint(0, VOCAB, (4, 16))
    losses = []
    for model in (padded, plain):
        loss = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten(), label_smoothing=0.1)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    grad = padded.tokens.weight.grad
    torch.testing.assert_close(grad[:VOCAB], plain.tokens.weight.grad)
    assert torch.count_nonzero(grad[VOCAB:]) == 0 and torch.count_nonzero(padded.tokens.weight[VOCAB:]) == 0


def test_flop_count_is_the_unpadded_models_and_the_padding_adds_the_heads_extra_columns(monkeypatch):
    padded, plain = _pair(vocab=200)  # 56 padding rows
    seq = SHAPE.context
    counted = training_flops_per_sample(padded, (seq,), 200, input_dtype=torch.int64)
    unpadded = training_flops_per_sample(plain, (seq,), 200, input_dtype=torch.int64)
    for key in ("forward_flops", "backward_flops", "train_flops", "train_flops_per_token"):
        assert counted[key] == unpadded[key], key
    extra = 3 * 2 * SHAPE.width * 56 * seq  # forward 2·width per column per token, backward twice that
    assert counted["implementation_flops_excluded"] == extra
    # what the counter sees without the model's declaration: the padded multiply, `extra` more
    monkeypatch.setattr(GPT, "implementation_flops", None)
    raw = training_flops_per_sample(padded, (seq,), 200, input_dtype=torch.int64)
    assert raw["train_flops"] - unpadded["train_flops"] == extra


def test_attention_is_causal_sdpa_without_a_mask_and_runs_on_the_flash_kernel(monkeypatch):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    model = GPT(GPT2_TINY, 256)
    ids = torch.randint(0, 256, (2, 16))
    calls = []
    original = F.scaled_dot_product_attention

    def watched(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", watched)
    expected = model(ids)
    assert len(calls) == GPT2_TINY.layers
    # the flash kernel takes no mask (is_causal instead) and no dropout
    assert all(c.get("is_causal") is True and c.get("attn_mask") is None and not c.get("dropout_p") for c in calls)
    monkeypatch.setattr(F, "scaled_dot_product_attention", original)
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):  # only the flash kernel: a shape it refuses raises
        torch.testing.assert_close(model(ids), expected, rtol=1e-4, atol=1e-5)


def _optim_cfg(name: str):
    from scaling.config import from_dict

    return from_dict({"optim": {"name": name, "momentum": 0.8, "adam_beta2": 0.9, "weight_decay": 0.1}})


@pytest.mark.parametrize("name, kind", [("adamw", torch.optim.AdamW), ("sgd", torch.optim.SGD)])
def test_the_optimizer_is_fused_on_cuda_and_not_on_cpu(name, kind, monkeypatch):
    from torch.utils import _foreach_utils

    from scaling.train.optimizer import build_optimizer, use_fused

    cfg = _optim_cfg(name)
    assert use_fused(torch.device("cuda", 0)) and use_fused("cuda") and not use_fused("cpu")
    # the decision takes the device named: CPU tensors stand in for a CUDA device's (torch has fused CPU kernels)
    on_cuda = build_optimizer(cfg, [torch.nn.Parameter(torch.zeros(3))], torch.device("cuda"), lr=0.01)
    on_cpu = build_optimizer(cfg, [torch.nn.Parameter(torch.zeros(3))], torch.device("cpu"), lr=0.01)
    assert type(on_cuda) is kind and on_cuda.defaults["fused"] is True and not on_cpu.defaults["fused"]
    if name == "adamw":
        assert on_cuda.defaults["betas"] == (0.8, 0.9) and on_cuda.defaults["weight_decay"] == 0.1
    else:
        assert on_cuda.defaults["momentum"] == 0.8 and on_cuda.defaults["nesterov"]
    # a torch without fused kernels for CUDA: not asked for
    monkeypatch.setattr(_foreach_utils, "_get_fused_kernels_supported_devices", lambda: ["cpu"])
    assert not use_fused("cuda")


@pytest.mark.parametrize(
    "data",
    [
        {"name": "tokens", "num_classes": 64, "seq_len": 16, "train_samples": 64, "val_samples": 8},
        {"name": "synthetic", "num_classes": 10, "image_size": 8, "train_samples": 64},
    ],
)
def test_the_gpu_configs_datasets_are_held_on_the_device_and_a_batch_copies_nothing_to_it(data, monkeypatch):
    """The data of experiments/gpu-*.yaml: made on the device once; a training batch is an index into it,
    no host-to-device copy per step (planted: a `.to(device)` per batch fails here)."""
    from scaling.config import DataConfig
    from scaling.data import load_dataset

    dataset = load_dataset(DataConfig(**data), torch.device("cpu"))
    assert dataset.train_x.device.type == "cpu"  # the device it was given
    copies = []
    original_to = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: copies.append(a) or original_to(self, *a, **k))
    batches = list(dataset.train_batches(0, 1, 1, 0, 16))
    assert len(batches) == 4 and copies == []
