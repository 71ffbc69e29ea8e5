"""The centralized critic of the MAPPO and RMAAC baselines: ``V(s)``, a value head on the team's shared base
model with its own LoRA adapter ("critic").

A state is text (:func:`udpo.env.protocols.adversary.critic_state`: the question and the agents' answers
of the previous round). ``V(s) = w . h(s) + b``, where ``h(s)`` is the last layer's hidden state at the
last token of ``s`` under the critic's adapter. The head starts at zero, so every value starts at 0.
The critic owns its parameters (adapter and head) and writes them to a folder (``adapter`` and
``value_head.safetensors``) that checkpoints and exports carry.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

CRITIC_ADAPTER = "critic"
HEAD_FILE = "value_head.safetensors"


class Critic:
    """``V(s)`` on ``policy``'s (first) base model; see the module docstring."""

    def __init__(self, policy, batch_size: int = 16):
        self.policy = policy
        self.batch_size = batch_size
        self.model = policy.models[policy.base_model]
        self.tokenizer = policy.tokenizers[policy.base_model]
        if CRITIC_ADAPTER not in self.model.peft_config:
            self.model.add_adapter(CRITIC_ADAPTER, policy.lora.peft_config())
        hidden = self.model.get_base_model().config.hidden_size
        self.head = torch.nn.Linear(hidden, 1).to(policy.device)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)
        self.adapter_params = policy._adapter_params(self.model, CRITIC_ADAPTER)

    def parameters(self) -> list[torch.nn.Parameter]:
        """Every trainable parameter of the critic (its adapter, then the head)."""
        return [*self.adapter_params, *self.head.parameters()]

    def values(self, states: Sequence[str], grad: bool = False) -> Tensor:
        """``V(s)`` of each state, float32 [len(states)]; differentiable w.r.t. :meth:`parameters` with ``grad``."""
        out = []
        self.model.set_adapter(CRITIC_ADAPTER)
        for p in self.adapter_params:  # set_adapter freezes nothing of the active adapter, but be explicit
            p.requires_grad_(True)
        try:
            with torch.set_grad_enabled(grad):
                for start in range(0, len(states), self.batch_size):
                    out.append(self._forward(list(states[start : start + self.batch_size])))
        finally:
            self.policy._set_active(0)  # the agents' adapters active and trainable again
        return torch.cat(out) if out else torch.zeros(0, device=self.policy.device)

    def _forward(self, texts: list[str]) -> Tensor:
        enc = [
            self.tokenizer(t, add_special_tokens=False)["input_ids"] or [self.tokenizer.eos_token_id]
            for t in texts
        ]
        width = max(map(len, enc))
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([e + [pad] * (width - len(e)) for e in enc], device=self.policy.device)
        mask = torch.tensor([[1] * len(e) + [0] * (width - len(e)) for e in enc], device=self.policy.device)
        # logits of one position as an index (the int 1 makes torch expand the output layer per row)
        one = torch.tensor([width - 1], device=ids.device)
        hidden = self.model(
            input_ids=ids, attention_mask=mask, output_hidden_states=True, logits_to_keep=one, use_cache=False
        ).hidden_states[-1]
        last = hidden[torch.arange(len(enc), device=ids.device), torch.tensor([len(e) - 1 for e in enc])]
        return self.head(last.float()).squeeze(-1)

    def save(self, folder: str | Path) -> None:
        """Write the critic's adapter and head to ``folder``."""
        from peft.utils import get_peft_model_state_dict
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = get_peft_model_state_dict(self.model, adapter_name=CRITIC_ADAPTER)
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in state.items()}, str(folder / "adapter.safetensors")
        )
        save_file(
            {k: v.detach().cpu().contiguous() for k, v in self.head.state_dict().items()},
            str(folder / HEAD_FILE),
        )

    @torch.no_grad()
    def load(self, folder: str | Path) -> None:
        """Load what :meth:`save` wrote, in place (the optimizer's parameter objects stay valid)."""
        from peft.utils import set_peft_model_state_dict
        from safetensors.torch import load_file

        folder = Path(folder)
        for name in ("adapter.safetensors", HEAD_FILE):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"critic: no {name} in {folder}")
        result = set_peft_model_state_dict(
            self.model, load_file(str(folder / "adapter.safetensors")), adapter_name=CRITIC_ADAPTER
        )
        missing = [k for k in result.missing_keys if f".{CRITIC_ADAPTER}." in k]
        if result.unexpected_keys or missing:
            raise ValueError(
                f"{folder}: critic weights do not fit the model "
                f"(unexpected: {result.unexpected_keys[:3]}, missing: {missing[:3]})"
            )
        head = load_file(str(folder / HEAD_FILE))
        if {k: tuple(v.shape) for k, v in head.items()} != {
            k: tuple(v.shape) for k, v in self.head.state_dict().items()
        }:
            raise ValueError(f"{folder / HEAD_FILE}: the value head does not fit this model")
        self.head.load_state_dict(head)
