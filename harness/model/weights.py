"""The MoE layer's weights and the expert MLP both the model and the reference apply."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from harness.config import HarnessConfig

DTYPE = torch.float64
DEFAULT_VOCAB = 64


@dataclass(frozen=True)
class MoEWeights:
    embedding: torch.Tensor  # [V, H]
    pos_freq: torch.Tensor  # [H]
    state_proj: torch.Tensor  # [H, H]
    router: torch.Tensor  # [H, num_experts]
    w1: torch.Tensor  # [num_experts, H, F]
    w2: torch.Tensor  # [num_experts, F, H]

    @classmethod
    def build(cls, config: HarnessConfig, vocab_size: int = DEFAULT_VOCAB,
              device: torch.device | str = "cpu") -> MoEWeights:
        """Every rank draws all experts from one seeded generator (on the CPU, then moved to
        `device`), so all ranks and devices agree."""
        h, e = config.model.hidden_size, config.num_experts
        f = 2 * h
        gen = torch.Generator().manual_seed(config.model.seed)

        def draw(*shape: int, scale: float) -> torch.Tensor:
            return torch.randn(*shape, generator=gen, dtype=DTYPE) * scale

        weights = cls(embedding=draw(vocab_size, h, scale=0.5),
                      pos_freq=draw(h, scale=0.1),
                      state_proj=draw(h, h, scale=h ** -0.5),
                      router=draw(h, e, scale=1.0),
                      w1=draw(e, h, f, scale=h ** -0.5),
                      w2=draw(e, f, h, scale=f ** -0.5))
        return weights.to(device)

    @property
    def device(self) -> torch.device:
        return self.embedding.device

    def to(self, device: torch.device | str) -> MoEWeights:
        """The same weights on `device` (self when they are there already)."""
        device = torch.device(device)
        if self.device == device:
            return self
        return MoEWeights(**{name: t.to(device) for name, t in self.tensors().items()})

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def expert_mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w1) @ w2
