"""Probes: what reads the frozen reference model's hidden states and predicts "in the band" (paper 3.2,
appendix 14), one concern per module:

- :mod:`propel_core.probes.activations`: the reference's pooled hidden states and the files that keep them;
- :mod:`propel_core.probes.heads`: training a head, or a whole sweep of them stacked, and calibration;
- :mod:`propel_core.probes.metrics`: balanced accuracy, F1, AUC, calibration error, Spearman;
- :mod:`propel_core.probes.cells`: a sweep cell's splits, and probes fitted at a chosen cell;
- :mod:`propel_core.probes.sweep`: the sweep of cells, the selection of one, and the files it leaves;
- :mod:`propel_core.probes.bundles`: a head saved with what scoring raw texts needs, and loaded back.
"""
