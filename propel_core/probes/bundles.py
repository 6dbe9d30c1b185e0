"""Probe bundles: a trained head saved with what reading raw texts needs (the reference model's
settings, the pooler, the standardization), loaded back as a ``ProbeScorer`` that scores texts end to
end (appendix 14)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from propel_core.config import ModelConfig
from propel_core.embedded import EMBEDDED_MODEL_ID
from propel_core.errors import PropelError
from propel_core.probes.activations import pooled_activations
from propel_core.probes.heads import TrainedProbe
from propel_core.records import ProbeBundle

log = logging.getLogger("propel")


def save_bundle(folder: Path, probe: TrainedProbe, description: ProbeBundle) -> None:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"head.{k}": v.contiguous() for k, v in probe.head.state_dict().items()}
    save_file({**tensors, "mean": probe.mean.contiguous(), "std": probe.std.contiguous()}, folder / "probe.safetensors")
    (folder / "probe.json").write_text(description.model_dump_json(indent=2) + "\n")


def load_head(folder: str | Path, bundle: ProbeBundle, registry) -> TrainedProbe:
    """The head and standardization a bundle saved (``probe.safetensors``), without its reference."""
    from safetensors.torch import load_file

    tensors = load_file(Path(folder) / "probe.safetensors")
    head = registry.get("probe_architectures", bundle.architecture)(bundle.input_dim)
    head.load_state_dict({k.removeprefix("head."): v for k, v in tensors.items() if k.startswith("head.")})
    return TrainedProbe(head, tensors["mean"], tensors["std"], epochs=0)


def bundle_features(backend, bundle: ProbeBundle, registry, texts: list[str | list[str]]):
    """The pooled reference activations a bundle's head reads (its layer, pooling, turn vector and
    length), exactly as the extract stage pools them, read with ``backend``: the bundle's reference,
    or one the ranker trains a LoRA in (a model in training mode keeps the graph)."""
    return pooled_activations(
        backend,
        texts,
        [bundle.layer],
        {bundle.pooling: registry.get("poolers", bundle.pooling)},
        registry.get("poolers", bundle.turn_vector),
        bundle.max_length,
        reference_of(bundle).batch_size,
    )[bundle.layer, bundle.pooling]


class ProbeScorer:
    """A saved probe, ready to score raw task texts: tokenize, truncated forward pass, pool, head."""

    def __init__(self, folder: str | Path, registry=None):
        from propel_core.plugins import Registry

        self.bundle = read_bundle(folder)
        self.registry = registry or Registry.build()
        self.probe = load_head(folder, self.bundle, self.registry)
        self.reference = reference_of(self.bundle)
        self.backend = self.registry.backend(self.reference)

    def logits_of_features(self, x):
        return self.probe.logits(x) / self.bundle.temperature

    def features(self, texts: list[str | list[str]]):
        """The pooled reference activations the head reads, exactly as the extract stage pools them."""
        return bundle_features(self.backend, self.bundle, self.registry, texts)

    def score(self, texts: list[str | list[str]]) -> list[dict[str, float]]:
        """``logit`` and ``probability`` of the in-band class for each text or trajectory (a list of
        turns), with the temperature applied; and ``calibrated``, the logit on the verifier's scale,
        where the bundle has a calibration (a ranker's: the line ``slope * logit + intercept`` clipped
        to [``low``, ``high``])."""
        import torch

        logits = self.logits_of_features(self.features(texts))
        scores = [{"logit": float(logit), "probability": float(torch.sigmoid(logit))} for logit in logits]
        line = self.bundle.calibration
        if line:
            for score in scores:
                value = line["slope"] * score["logit"] + line["intercept"]
                score["calibrated"] = min(max(value, line["low"]), line["high"])
        return scores


def reference_settings(model: ModelConfig) -> dict[str, Any]:
    """What a bundle records of the reference model it was trained on: every setting but sampling (the
    reference never samples), so the scorer loads the very model the probe read, and shares it with
    the run's reference role instead of loading it again."""
    return model.model_dump(mode="json", exclude={"sampling"})


def reference_of(bundle: ProbeBundle) -> ModelConfig:
    """The reference model a bundle reads with: its recorded settings (a bundle of an older version
    records only the model id, read with the defaults)."""
    if bundle.reference:
        return ModelConfig(**bundle.reference)
    return ModelConfig(model=None if bundle.reference_model == EMBEDDED_MODEL_ID else bundle.reference_model)


def read_bundle(folder: str | Path) -> ProbeBundle:
    """A bundle's description (``probe.json``)."""
    path = Path(folder) / "probe.json"
    if not path.exists():
        raise PropelError(f"no probe bundle in {folder} (probe.json is missing)")
    return ProbeBundle.model_validate_json(path.read_text())


def load_probe(folder: str | Path, registry=None) -> ProbeScorer:
    """Load a probe bundle (``probe.json`` + ``probe.safetensors``) for scoring raw texts."""
    return ProbeScorer(folder, registry)
