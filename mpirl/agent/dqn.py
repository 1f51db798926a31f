"""The DQN loss (pure torch, no MPI): double DQN target, Huber loss weighted by importance weights.

Given a batch of n-step transitions (s, a, R, s', discount) the target is::

    y = R + discount * Q_target(s', argmax_a Q_online(s', a))

and the loss is ``mean_i w_i * huber(Q_online(s_i, a_i) - y_i)``.  The function returns the new
priorities' raw material, |td| per sample, beside the loss (as Acme's losses do).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.nn.functional as F


def dqn_loss(
    online: Callable[[torch.Tensor], torch.Tensor],
    target: Callable[[torch.Tensor], torch.Tensor],
    obs: torch.Tensor,
    action: torch.Tensor,
    reward: torch.Tensor,
    next_obs: torch.Tensor,
    discount: torch.Tensor,
    weights: torch.Tensor,
    huber_delta: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    n = obs.shape[0]
    q_both = online(torch.cat([obs, next_obs])).float()  # one forward for s and s' (float32
    q = q_both[:n].gather(1, action.view(-1, 1)).squeeze(1)  # also under bf16 autocast)
    with torch.no_grad():
        a_star = q_both[n:].argmax(dim=1, keepdim=True)
        q_next = target(next_obs).float().gather(1, a_star).squeeze(1)
        y = reward + discount * q_next
    td = q - y
    per_sample = F.huber_loss(q, y, reduction="none", delta=huber_delta)
    loss = (weights * per_sample).mean()
    return loss, td.detach().abs()


# torch.optim.adam.adam is semi-private: mpirl calls it only with the signature it was written
# for (checked once, at import) and otherwise uses torch.optim.Adam (same update and state).
_KERNEL_POSITIONAL = (
    "params",
    "grads",
    "exp_avgs",
    "exp_avg_sqs",
    "max_exp_avg_sqs",
    "state_steps",
)
_KERNEL_KEYWORDS = (
    "foreach",
    "fused",
    "amsgrad",
    "beta1",
    "beta2",
    "lr",
    "weight_decay",
    "eps",
    "maximize",
)


def _adam_kernel() -> Callable[..., Any] | None:
    """``torch.optim.adam.adam`` when this torch has it with the parameters mpirl passes (and no
    other required one), else None."""
    try:
        from torch.optim.adam import adam

        params = inspect.signature(adam).parameters
    except (ImportError, TypeError, ValueError):
        return None
    items = list(params.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if tuple(p.name for p in items[:6]) != _KERNEL_POSITIONAL or any(
        p.kind not in positional for p in items[:6]
    ):
        return None
    for name in _KERNEL_KEYWORDS:
        if name not in params or params[name].kind == inspect.Parameter.POSITIONAL_ONLY:
            return None
    known = set(_KERNEL_POSITIONAL + _KERNEL_KEYWORDS)
    if any(
        p.name not in known
        and p.default is p.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        for p in items
    ):
        return None
    return adam


_ADAM_KERNEL = _adam_kernel()


class Adam:
    """Adam through torch's own update kernel (``torch.optim.adam.adam``, fused on CPU where this
    torch has it) without the ``torch.optim.Optimizer`` wrapper around it: constructing or
    stepping that wrapper imports ``torch._dynamo``, 2.4-3.4 s of CPU on the learner's path to its
    first weights on a 2-core machine (docs/design.md, "Start-up").  Same update, same defaults
    (betas 0.9/0.999, eps 1e-8, no weight decay), and ``state_dict`` in ``torch.optim.Adam``'s
    format, so a checkpoint loads into either.

    When this torch lacks that kernel or its signature changed (it is semi-private), the update
    runs through ``torch.optim.Adam`` on the same moment and step tensors (``kernel`` is False):
    same result and state_dict, at the cost of the dynamo import at start-up."""

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        self._adam = _ADAM_KERNEL
        self.params = list(params)
        self.lr, self.eps = float(lr), float(eps)
        self.betas: tuple[float, float] = (betas[0], betas[1])
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        # on the parameters' device: the fused CUDA kernel wants its step counts there
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device) for p in self.params]
        self.fused = True
        self._opt: torch.optim.Adam | None = None
        #: the one host tensor every ``.grad`` is a view of, when a sync bound them
        #: (`mpirl.agent.grads.bind_grads`): zero_grad zeroes it and keeps the views
        self.grad_buffer: torch.Tensor | None = None
        #: the buffer and the ``.grad`` objects zero_grad last found in it (checked by identity:
        #: reading every pointer each update cost ~5 us)
        self._checked: tuple[torch.Tensor | None, list[torch.Tensor | None]] = (None, [])
        #: after zero_grad: every ``.grad`` is one of those views (none dropped or missing), so
        #: the backward that follows adds into ``grad_buffer`` and nowhere else (a sync trusts
        #: it instead of checking the binding again: `mpirl.transport.group.AllreduceSync`)
        self.intact = False
        if self._adam is not None:
            try:  # the fused CPU kernel halves the optimizer's share of an update (torch >= 2.4)
                self._update(dry=True)
            except (RuntimeError, TypeError):
                self.fused = False
                try:
                    self._update(dry=True)
                except (RuntimeError, TypeError):
                    self._adam = None
        if self._adam is None:  # torch.optim.Adam updating our tensors in place
            self.fused = False
            self._opt = torch.optim.Adam(self.params, lr=self.lr, betas=self.betas, eps=self.eps)
            for p, s, m, v in zip(
                self.params, self.steps, self.exp_avg, self.exp_avg_sq, strict=True
            ):
                self._opt.state[p] = {"step": s, "exp_avg": m, "exp_avg_sq": v}

    @property
    def kernel(self) -> bool:
        """True when the update calls torch's kernel directly (no torch.optim.Optimizer)."""
        return self._opt is None

    def zero_grad(self) -> None:
        buf = self.grad_buffer
        if buf is not None:  # backward adds into the views in place
            buf.zero_()
            seen, views = self._checked
            if seen is buf and all(p.grad is v for p, v in zip(self.params, views, strict=True)):
                self.intact = all(v is not None for v in views)
                return  # the gradients checked last time, untouched since
            lo = buf.data_ptr()
            hi = lo + buf.numel() * buf.element_size()
            for p in self.params:  # one replaced from outside is not in the buffer: drop it
                if p.grad is not None and not lo <= p.grad.data_ptr() < hi:
                    p.grad = None
            views = [p.grad for p in self.params]
            self._checked = (buf, views)
            self.intact = all(v is not None for v in views)
            return
        self.intact = False
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def _update(self, dry: bool = False) -> None:
        if dry:  # probe the kernel on throwaway copies (zero gradients)
            params = [p.detach().clone() for p in self.params]
            grads = [torch.zeros_like(p) for p in params]
            m, v = [x.clone() for x in self.exp_avg], [x.clone() for x in self.exp_avg_sq]
            steps = [s.clone() for s in self.steps]
        else:
            params = [p for p in self.params if p.grad is not None]
            grads = [p.grad for p in params if p.grad is not None]  # all of them
            keep = [i for i, p in enumerate(self.params) if p.grad is not None]
            m = [self.exp_avg[i] for i in keep]
            v = [self.exp_avg_sq[i] for i in keep]
            steps = [self.steps[i] for i in keep]
        assert self._adam is not None  # __init__ falls back to torch.optim.Adam otherwise
        self._adam(
            params,
            grads,
            m,
            v,
            [],
            steps,
            foreach=False if not self.fused else None,
            fused=self.fused or None,
            amsgrad=False,
            beta1=self.betas[0],
            beta2=self.betas[1],
            lr=self.lr,
            weight_decay=0.0,
            eps=self.eps,
            maximize=False,
        )

    def step(self) -> None:
        if self._opt is not None:
            self._opt.param_groups[0].update(lr=self.lr, betas=self.betas, eps=self.eps)
            self._opt.step()
            return
        self._update()

    def state_dict(self) -> dict:
        return {
            "state": {
                i: {"step": s, "exp_avg": m, "exp_avg_sq": v}
                for i, (s, m, v) in enumerate(
                    zip(self.steps, self.exp_avg, self.exp_avg_sq, strict=True)
                )
            },
            "param_groups": [
                {
                    "lr": self.lr,
                    "betas": self.betas,
                    "eps": self.eps,
                    "weight_decay": 0.0,
                    "amsgrad": False,
                    "maximize": False,
                    "fused": self.fused,
                    "params": list(range(len(self.params))),
                }
            ],
        }

    def load_state_dict(self, sd: dict) -> None:
        group = sd["param_groups"][0]
        if len(sd["param_groups"]) != 1 or len(group["params"]) != len(self.params):
            raise ValueError(
                f"optimizer state for {len(group['params'])} parameters in "
                f"{len(sd['param_groups'])} group(s); this network has "
                f"{len(self.params)} in 1: a checkpoint of another network?"
            )
        for key, plain in (("weight_decay", 0.0), ("amsgrad", False), ("maximize", False)):
            if group.get(key, plain) != plain:
                raise ValueError(
                    f"optimizer state has {key}={group[key]!r}; mpirl's Adam "
                    f"runs with {key}={plain!r}"
                )
        state = sd["state"]
        for i in range(len(self.params)):
            s = state.get(i, state.get(str(i)))
            if s is None:  # never stepped: zero moments
                continue
            self.steps[i].copy_(torch.as_tensor(s["step"], dtype=torch.float32))
            self.exp_avg[i].copy_(s["exp_avg"])
            self.exp_avg_sq[i].copy_(s["exp_avg_sq"])
        beta1, beta2 = group["betas"]
        self.lr, self.betas = float(group["lr"]), (beta1, beta2)
        self.eps = float(group["eps"])
