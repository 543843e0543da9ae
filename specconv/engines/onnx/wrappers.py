"""Export wrapper: a reference drafter's one drafting step as the module torch.export traces (the
stateless I/O contract: docs/engines.md); with ``onnx_attention=True`` one ONNX ``Attention`` node per layer.
"""

from __future__ import annotations

import torch
from torch import nn

from ...drafters.layers import attend, merge_heads
from ...drafters.step import StepBatch, noise_pick
from ...errors import UnsupportedFormatError

__all__ = ["StepWrapper", "make_wrapper", "OUTPUT_CHOICES", "onnx_attend"]

#: outputs a wrapper can emit (``--outputs``)
OUTPUT_CHOICES = ("ids", "logprobs", "topk", "logits", "confidence")


def onnx_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                scale: float) -> torch.Tensor:
    """:func:`~specconv.drafters.layers.attend` as one ONNX ``Attention`` node."""
    return merge_heads(torch.onnx.ops.attention(q, k, v, mask[:, None], scale=scale)[0])


class StepWrapper(nn.Module):
    """A reference drafter's :meth:`~specconv.drafters.Drafter.step` with named outputs (a subset of
    :data:`OUTPUT_CHOICES`: ``ids`` always; ``confidence`` only with a confidence head).

    Raises:
        UnsupportedFormatError: a P-EAGLE drafter with one depth (no mask entries; the
            static block input would be empty).
    """

    def __init__(self, drafter, *, outputs=("ids", "logprobs"), top_k: int = 4, sampling_noise: bool = False,
                 onnx_attention: bool = False):
        super().__init__()
        self.drafter = drafter
        self.shape = drafter.shape
        if self.shape.block_rows < 1:
            raise UnsupportedFormatError(
                f"{drafter.source}: {drafter.alg.display_name} with speculative_tokens 1 has no mask entries; "
                "the export needs at least 2 depths", format_id="peagle-k1")
        self.top_k = int(top_k)
        self.sampling_noise = bool(sampling_noise)
        self.attention = onnx_attend if onnx_attention else attend
        outs = ["draft_ids", *(["draft_logprobs"] if "logprobs" in outputs else []),
                *(["topk_ids", "topk_logprobs"] if "topk" in outputs else []),
                *(["logits"] if "logits" in outputs else [])]
        if ("confidence" in outputs and drafter.alg.export.confidence_output
                and getattr(drafter, "confidence_proj", None) is not None):
            outs.append("confidence")
        self.output_names = outs
        self.input_names = self.shape.input_names(self.sampling_noise)

    def _outputs(self, draft_logits: torch.Tensor, draft_ids: torch.Tensor,
                 confidence_logits: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """The named outputs of the drafts (``draft_logits [B, N, Vd]``, draft-vocab ids)."""
        vocab = self.drafter.vocab
        outs: list[torch.Tensor] = [vocab.to_target_ids(draft_ids).to(torch.int32)]
        if len(self.output_names) == 1:
            return tuple(outs)
        lp = torch.log_softmax(draft_logits.to(torch.float32), dim=-1)
        for name in self.output_names[1:]:
            if name == "draft_logprobs":
                outs.append(torch.gather(lp, -1, draft_ids[..., None])[..., 0])
            elif name == "topk_ids":
                tv, ti = torch.topk(lp, self.top_k, dim=-1)
                outs += [vocab.to_target_ids(ti).to(torch.int32), tv]
            elif name == "logits":
                outs.append(vocab.to_target_logits(draft_logits.to(torch.float32)))
            elif name == "confidence":
                assert confidence_logits is not None, "a confidence output needs the drafter's confidence head"
                outs.append(torch.sigmoid(confidence_logits))
        return tuple(outs)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Run one step; inputs in :attr:`input_names` order, outputs in
        :attr:`output_names` order."""
        batch = StepBatch.of(self.input_names, inputs)
        noise = inputs[-1] if self.sampling_noise else None
        out = self.drafter.step(batch, pick=noise_pick(noise), attention=self.attention,
                                confidence="confidence" in self.output_names)
        return self._outputs(out.draft_logits, out.draft_ids, out.confidence_logits)


def make_wrapper(drafter, **kw) -> StepWrapper:
    """:class:`StepWrapper` of a loaded reference drafter (``kw`` as its constructor)."""
    return StepWrapper(drafter, **kw).eval()
