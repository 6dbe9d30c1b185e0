"""The train stage on the demo config with no corpus behind it: what the benchmarks that time or
measure a GRPO step run (``train_busy.py``, ``train_memory.py``). It imports what it needs when called,
so that a script can first measure what importing costs."""

import importlib
from pathlib import Path


def train_demo(folder: Path, steps: int, *overrides: str) -> None:
    """The train stage on the demo config in ``folder`` for ``steps`` GRPO steps (``overrides`` beside),
    with an untrained linear probe saved where the stage reads its bundle: a step's whole work (sampling,
    the probe reward, the loss and its backward pass) without the corpus a probe is trained on."""
    import torch

    import propel_core
    from propel_core.embedded import EMBEDDED_MODEL_ID
    from propel_core.plans import load_config
    from propel_core.plugins import Registry
    from propel_core.probes.bundles import save_bundle
    from propel_core.probes.heads import TrainedProbe
    from propel_core.records import ProbeBundle
    from propel_core.run import Run

    registry = Registry.build()
    demo = Path(propel_core.__file__).parent / "configs" / "demo.yaml"
    config = load_config(demo, [f"run_dir={folder}", f"train.steps={steps}", *overrides], registry)
    head = registry.get("probe_architectures", "linear")(576)
    save_bundle(
        Path(folder) / "probes" / "selected",
        TrainedProbe(head, torch.zeros(576), torch.ones(576), 0),
        ProbeBundle(
            reference_model=EMBEDDED_MODEL_ID,
            layer=15,
            pooling="last_token",
            architecture="linear",
            input_dim=576,
            max_length=2048,
            training_rows=0,
            lowest_valid_logit=0.0,  # no corpus: an untrained head, taken to give valid tasks 0 or more
        ),
    )
    train_stage = importlib.import_module("propel_core.stages.train")  # the package's `train` is the stage
    train_stage.train(Run(config, registry, quiet=True))
