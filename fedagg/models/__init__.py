"""Backbones. Every class is built as `Cls(num_classes=, in_channels=, image_size=, **options)`
from the dataset's image shape and exposes `input_shape` (C, H, W), the shape its forward
expects; the data pipeline, not the model, resizes or repeats channels to match it."""
