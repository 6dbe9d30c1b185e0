"""Probe heads: training one (``train_probe``) or a whole sweep of them stacked (``train_probes``), and
temperature calibration (``fit_temperature``)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from propel_core.config import ProbeConfig
from propel_core.contracts import ProbeArchitecture
from propel_core.probes.metrics import balanced_accuracy

log = logging.getLogger("propel")


@dataclass
class TrainedProbe:
    """A head plus the feature standardization it was trained with."""

    head: Any  # torch.nn.Module
    mean: Any  # Tensor[dim]
    std: Any  # Tensor[dim]
    epochs: int

    def logits(self, x):
        import torch

        self.head.eval()
        with torch.no_grad():  # not inference_mode: calibration fits a temperature on these logits
            return self.head((x - self.mean) / self.std)

    def lowest_logit(self, x, temperature: float = 1.0) -> float:
        """The lowest logit the head gives a row of ``x`` (the labeled, so valid, tasks), at ``temperature``:
        what a calibrated r_bad sits below (``RewardConfig.settled``)."""
        return round(float((self.logits(x) / temperature).min()), 4)


def train_probe(
    factory: ProbeArchitecture, x, y, train, val, config: ProbeConfig, weighted: bool, seed: int
) -> TrainedProbe:
    """AdamW, batches of ``config.batch_size``, up to ``config.epochs`` epochs, early stopping after
    ``config.patience`` epochs without a better validation balanced accuracy (ties: lower loss).

    One head at a time: the reference :func:`train_probes` matches. A factory with a ``fit`` attribute
    (``logistic``) is fitted by it instead."""
    import torch

    if getattr(factory, "fit", None) is not None:
        return _fit_by_factory(factory, x, y, train, weighted, seed)
    torch.manual_seed(seed)
    mean, std = _standardization(x, train)
    features = (x - mean) / std
    labels = y.float()
    head = factory(x.shape[1])
    optimizer = torch.optim.AdamW(head.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    pos_weight = _pos_weight(labels, train, weighted)
    loss_fn = torch.nn.BCEWithLogitsLoss(pos_weight=pos_weight)
    generator = torch.Generator().manual_seed(seed)
    best, best_state, best_epoch, waited = (-1.0, math.inf), None, 0, 0
    for epoch in range(1, config.epochs + 1):
        head.train()
        for batch in train[torch.randperm(len(train), generator=generator)].split(config.batch_size):
            optimizer.zero_grad()
            loss_fn(head(features[batch]), labels[batch]).backward()
            optimizer.step()
        head.eval()
        with torch.inference_mode():
            val_logits = head(features[val])
            score = (balanced_accuracy(y[val], val_logits > 0), -loss_fn(val_logits, labels[val]).item())
        if score > best:
            best, best_epoch, waited = score, epoch, 0
            best_state = {k: v.clone() for k, v in head.state_dict().items()}
        else:
            waited += 1
            if waited >= config.patience:
                break
    head.load_state_dict(best_state)
    return TrainedProbe(head, mean, std, best_epoch)


def _fit_by_factory(factory, x, y, train, weighted: bool, seed: int) -> TrainedProbe:
    """A head its factory's ``fit(head, features, labels, train, pos_weight)`` trains (``logistic``:
    scikit-learn), on features standardized as every probe's are; ``fit`` returns what the result's
    ``epochs`` reports (``logistic``: the solver's iterations)."""
    import torch

    torch.manual_seed(seed)
    mean, std = _standardization(x, train)
    head = factory(x.shape[1])
    epochs = factory.fit(head, (x - mean) / std, y, train, float(_pos_weight(y.float(), train, weighted)))
    head.eval()
    return TrainedProbe(head, mean, std, int(epochs))


def _standardization(x, train):
    """The mean and standard deviation (at least 1e-6) of the training rows, which every probe's
    features are standardized by."""
    return x[train].mean(0), x[train].std(0).clamp(min=1e-6)


def _pos_weight(labels, train, weighted: bool):
    """The loss weight of a positive: negatives over positives among the training rows if ``weighted``."""
    import torch

    positives = labels[train].sum()
    return (len(train) - positives) / positives.clamp(min=1) if weighted else torch.tensor(1.0)


#: what the heads of one stacked training may hold: weights, gradients, AdamW state, best weights and
#: validation features (estimated per head); more heads train in turns
STACK_BYTES = 1 << 30


@dataclass
class ProbeJob:
    """One head to train: what :func:`train_probe` takes but the labels, which all jobs share."""

    factory: ProbeArchitecture
    x: Any  # Tensor[rows, dim]: the feature matrix (one layer x pooling); jobs may share it or not
    train: Any  # Tensor[n]: row indices
    val: Any
    weighted: bool
    seed: int


def train_probes(
    jobs: Sequence[ProbeJob], y, config: ProbeConfig, finished: Callable[[int], None] | None = None
) -> list[TrainedProbe]:
    """Train every job at once; each result is what :func:`train_probe` gives for that job alone, up
    to float rounding: the same recipe, init, batch order, dropout masks and early stopping.

    Heads of one layout (a ``Sequential`` that starts with ``Linear``, goes on with ``Linear``,
    elementwise activations and ``Dropout``, and ends in ``Linear(., 1)`` and ``Flatten(0)``, as every
    built-in gradient-trained head does) and one training-set size form a stack, whatever feature
    matrix each reads: their weights gain a leading head dimension, and each step gathers a stack's
    batches (every head's own rows, standardized by its own training rows) in one indexing op, runs one
    batched forward pass (``bmm``) per stack, one backward pass for all stacks and one fused AdamW
    update per stack. Each head keeps its own seed (init, batch order, dropout masks), class weight and
    early stopping: once its patience runs out it leaves the stack with its best weights. Heads of any
    other layout train alone; a factory with ``fit`` is fitted by it, first, so that a missing optional
    dependency fails before any long training. ``finished(i)`` is called as job i is done.

    Memory: jobs train in turns of at most :data:`STACK_BYTES` of heads (in their order, so keep the
    jobs of one feature matrix together), and a turn's distinct feature matrices of one width are
    concatenated (a copy)."""
    results: list[TrainedProbe | None] = [None] * len(jobs)

    def done(i: int, result: TrainedProbe) -> None:
        results[i] = result
        if finished is not None:
            finished(i)

    for i, job in enumerate(jobs):
        if getattr(job.factory, "fit", None) is not None:
            done(i, _fit_by_factory(job.factory, job.x, y, job.train, job.weighted, job.seed))
    parameters: dict[tuple, int] = {}  # (factory, width) -> parameters of one head
    turn, used = [], 0
    for i, job in enumerate(jobs):
        if results[i] is not None:
            continue
        width = job.x.shape[1]
        if (job.factory, width) not in parameters:
            parameters[job.factory, width] = sum(p.numel() for p in job.factory(width).parameters())
        cost = 4 * (6 * parameters[job.factory, width] + 2 * len(job.val) * width)  # float32
        if turn and used + cost > STACK_BYTES:
            _train_stacked([(j, jobs[j]) for j in turn], y, config, done)
            turn, used = [], 0
        turn.append(i)
        used += cost
    _train_stacked([(j, jobs[j]) for j in turn], y, config, done)
    return results  # type: ignore[return-value]


def _train_stacked(jobs: list[tuple[int, ProbeJob]], y, config: ProbeConfig, done) -> None:
    """:func:`train_probes` for the numbered ``jobs``, all at once; ``done(i, result)`` as each ends."""
    import torch

    labels = y.float()
    matrices: dict[int, tuple[int, int]] = {}  # id(x) -> (width, the row of its first row in features[width])
    inputs: dict[int, list] = {}  # width -> the distinct feature matrices of that width
    orders, standardized = {}, {}
    stacks: dict[tuple, list[_Head]] = {}
    for i, job in jobs:
        torch.manual_seed(job.seed)
        module = job.factory(job.x.shape[1])
        layout = _layout(module)
        if layout is None:
            done(i, train_probe(job.factory, job.x, y, job.train, job.val, config, job.weighted, job.seed))
            continue
        dropout_rng = torch.Generator()
        dropout_rng.set_state(torch.get_rng_state())  # after the init, as the global generator is alone
        if id(job.x) not in matrices:
            same_width = inputs.setdefault(job.x.shape[1], [])
            matrices[id(job.x)] = (job.x.shape[1], sum(len(m) for m in same_width))
            same_width.append(job.x)
        matrix = matrices[id(job.x)]
        split = job.train.numpy().tobytes()
        if (job.seed, split) not in orders:
            orders[job.seed, split] = _Order(job.train, job.seed)
        if (matrix, split) not in standardized:
            standardized[matrix, split] = _standardization(job.x, job.train)
        mean, std = standardized[matrix, split]
        head = _Head(i, module, orders[job.seed, split], matrix, mean, std, dropout_rng, job, labels)
        stacks.setdefault((layout, len(job.train)), []).append(head)
    if not stacks:
        return
    features = {width: torch.cat(same) if len(same) > 1 else same[0] for width, same in inputs.items()}
    live = [_Stack(layout, heads, config) for (layout, _), heads in stacks.items()]
    for epoch in range(1, config.epochs + 1):
        if not live:
            break
        for order in {id(h.order): h.order for stack in live for h in stack.heads}.values():
            order.shuffle()
        for stack in live:
            stack.shuffle(labels)
        for begin in range(0, max(stack.rows for stack in live), config.batch_size):
            active = [stack for stack in live if begin < stack.rows]
            sum(stack.loss(features[stack.width], begin, begin + config.batch_size) for stack in active).backward()
            for stack in active:
                stack.optimizer.step()
                stack.optimizer.zero_grad()
        for stack in live:
            for head in stack.validate(epoch):
                done(head.job, head.result())
        live = [stack for stack in live if stack.heads]
    for stack in live:
        for head in stack.heads:
            done(head.job, head.result())


def _layout(module) -> tuple | None:
    """The stackable layout of a head, or None: ``("linear", in, out, bias)``, ``("act", repr)`` and
    ``("dropout", p)`` steps of a ``Sequential`` whose last ``Linear`` has one output, then ``Flatten(0)``."""
    import torch
    from torch import nn

    elementwise = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.SiLU, nn.LeakyReLU, nn.ELU, nn.Identity, nn.Softplus)
    if type(module) is not nn.Sequential or len(module) < 2:
        return None
    *layers, flatten = list(module)
    if type(flatten) is not nn.Flatten or (flatten.start_dim, flatten.end_dim) != (0, -1):
        return None
    steps = []
    for layer in layers:
        if type(layer) is nn.Linear and layer.weight.dtype == torch.float32 and layer.weight.device.type == "cpu":
            steps.append(("linear", layer.in_features, layer.out_features, layer.bias is not None))
        elif type(layer) is nn.Dropout:
            steps.append(("dropout", float(layer.p)))
        elif type(layer) in elementwise:
            steps.append(("act", repr(layer)))
        else:
            return None
    widths = [step[2] for step in steps if step[0] == "linear"]
    return tuple(steps) if steps[0][0] == "linear" and widths[-1] == 1 else None


class _Order:
    """The batch order of one (seed, training split): each epoch one permutation from a generator
    seeded as the head's alone, shared by every head that trains on that split with that seed."""

    def __init__(self, train, seed: int):
        import torch

        self.train = train
        self.generator = torch.Generator().manual_seed(seed)

    def shuffle(self) -> None:
        import torch

        self.rows = self.train[torch.randperm(len(self.train), generator=self.generator)]


class _Head:
    """One head of a stack: its job, module (which gets the best weights at the end), feature matrix,
    standardization, class weight and early stopping."""

    def __init__(self, job: int, module, order: _Order, matrix, mean, std, dropout_rng, spec: ProbeJob, labels):
        self.job, self.module, self.order, self.matrix, self.spec = job, module, order, matrix, spec
        self.mean, self.std, self.dropout_rng = mean, std, dropout_rng
        self.val_labels = labels[spec.val]
        self.pos_weight = _pos_weight(labels, spec.train, spec.weighted)
        self.best, self.best_weights, self.best_epoch, self.waited = (-1.0, math.inf), None, 0, 0

    def result(self) -> TrainedProbe:
        import torch

        weights = iter(self.best_weights)
        with torch.no_grad():
            for linear in (m for m in self.module if isinstance(m, torch.nn.Linear)):
                linear.weight.copy_(next(weights))
                if linear.bias is not None:
                    linear.bias.copy_(next(weights)[0])
        self.module.eval()
        return TrainedProbe(self.module, self.mean, self.std, self.best_epoch)


class _Stack:
    """Heads of one layout and training-set size trained as one: weights ``[heads, out, in]``, biases
    ``[heads, 1, out]``, one AdamW over them (AdamW is elementwise: each head moves as alone)."""

    def __init__(self, layout: tuple, heads: list[_Head], config: ProbeConfig):
        import torch

        self.layout, self.heads, self.config, self.width = layout, heads, config, layout[0][1]  # starts with Linear
        self.rows = len(heads[0].order.train)
        modules = [m for m in heads[0].module if type(m) is not torch.nn.Flatten]
        self.activations = {step: m for step, m in zip(layout, modules, strict=True) if step[0] == "act"}
        per_head = [[m for m in h.module if isinstance(m, torch.nn.Linear)] for h in heads]
        self.params = []
        for layer, linear in enumerate(per_head[0]):
            self.params.append(torch.stack([linears[layer].weight.detach() for linears in per_head]))
            if linear.bias is not None:
                self.params.append(torch.stack([linears[layer].bias.detach()[None] for linears in per_head]))
        self._restack(None)

    def _restack(self, keep) -> None:
        """(Re)build the stacked tensors and the optimizer, for the heads at positions ``keep``."""
        import torch

        old = getattr(self, "optimizer", None)
        if keep is not None:
            index = torch.tensor(keep, dtype=torch.long)
            states = [
                {k: v.index_select(0, index) if v.dim() else v.clone() for k, v in old.state[p].items()}
                for p in self.params
            ]
            self.params = [p.detach().index_select(0, index) for p in self.params]
            self.heads = [self.heads[i] for i in keep]
        self.params = [p.detach().requires_grad_() for p in self.params]
        options = {"lr": self.config.lr, "weight_decay": self.config.weight_decay}
        try:
            self.optimizer = torch.optim.AdamW(self.params, fused=True, **options)
        except RuntimeError:  # a torch without the fused CPU kernel
            self.optimizer = torch.optim.AdamW(self.params, foreach=True, **options)
        if keep is not None:
            for p, state in zip(self.params, states, strict=True):
                self.optimizer.state[p] = state
        heads = self.heads
        self.offsets = torch.tensor([h.matrix[1] for h in heads])[:, None]  # where each head's matrix starts
        self.mean = torch.stack([h.mean for h in heads])[:, None]
        self.std = torch.stack([h.std for h in heads])[:, None]
        self.pos_weight = torch.stack([h.pos_weight for h in heads]).float()[:, None]
        self.val_features = torch.zeros(len(heads), max(len(h.val_labels) for h in heads), self.width)
        for i, h in enumerate(heads):
            self.val_features[i, : len(h.val_labels)] = (h.spec.x[h.spec.val] - h.mean) / h.std

    def shuffle(self, labels) -> None:
        """This epoch's rows of every head, as indices into the stacked features, and their labels."""
        import torch

        rows = torch.stack([h.order.rows for h in self.heads])
        self.epoch_rows, self.epoch_labels = rows + self.offsets, labels[rows]

    def forward(self, hidden, train: bool):
        import torch

        params = iter(self.params)
        for step in self.layout:
            if step[0] == "linear":
                weight = next(params)
                hidden = torch.baddbmm(next(params), hidden, weight.mT) if step[3] else torch.bmm(hidden, weight.mT)
            elif step[0] == "act":
                hidden = self.activations[step](hidden)
            elif train and step[1] > 0:  # dropout: each head's masks from its own generator, as alone
                p = step[1]
                if p == 1:
                    hidden = hidden * 0
                    continue
                noise = torch.empty(hidden.shape)
                for i, head in enumerate(self.heads):
                    noise[i].bernoulli_(1 - p, generator=head.dropout_rng)
                hidden = hidden * noise.div_(1 - p)
        return hidden.squeeze(-1)

    def loss(self, features, begin: int, end: int):
        """The sum over heads of each head's mean loss on its batch [begin, end) of this epoch."""
        import torch.nn.functional as F

        rows = self.epoch_rows[:, begin:end]
        batch = features.index_select(0, rows.reshape(-1)).view(*rows.shape, -1).sub_(self.mean).div_(self.std)
        logits = self.forward(batch, train=True)
        targets = self.epoch_labels[:, begin:end]
        losses = F.binary_cross_entropy_with_logits(logits, targets, pos_weight=self.pos_weight, reduction="none")
        return losses.mean(1).sum()

    def validate(self, epoch: int) -> list[_Head]:
        """Score every head on its validation rows and keep improvements; the heads whose patience ran
        out leave the stack and are returned."""
        import torch
        import torch.nn.functional as F

        with torch.no_grad():
            logits = self.forward(self.val_features, train=False)
        stopped = []
        for i, head in enumerate(self.heads):
            val_logits = logits[i, : len(head.val_labels)]
            loss = F.binary_cross_entropy_with_logits(val_logits, head.val_labels, pos_weight=head.pos_weight)
            score = (balanced_accuracy(head.val_labels, val_logits > 0), -loss.item())
            if score > head.best:
                head.best, head.best_epoch, head.waited = score, epoch, 0
                head.best_weights = [p[i].detach().clone() for p in self.params]
            else:
                head.waited += 1
                if head.waited >= self.config.patience:
                    stopped.append(i)
        if not stopped:
            return []
        gone = [self.heads[i] for i in stopped]
        keep = [i for i in range(len(self.heads)) if i not in stopped]
        if keep:
            self._restack(keep)
        else:
            self.heads = []
        return gone


TEMPERATURE_RANGE = (0.1, 10.0)


def fit_temperature(logits, y) -> float:
    """The temperature T minimizing validation NLL of sigmoid(logit / T), kept in TEMPERATURE_RANGE:
    on a small, perfectly separated validation split the optimum runs off towards 0, which would only
    make an overfit probe more confident."""
    import torch

    log_t = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.LBFGS([log_t], lr=0.1, max_iter=100)
    loss_fn = torch.nn.BCEWithLogitsLoss()

    def closure():
        optimizer.zero_grad()
        loss = loss_fn(logits / log_t.exp(), y.float())
        loss.backward()
        return loss

    optimizer.step(closure)
    low, high = TEMPERATURE_RANGE
    return min(max(float(log_t.exp()), low), high)
