"""Central pretraining of a base for `model.pretrained` (`python -m fedagg.pretrain`; docs/bases.md)."""
