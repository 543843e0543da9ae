"""ONNX export and TensorRT engine builds of the reference drafters (docs/engines.md).

Modules: :mod:`.reference` (the one coupling point to :mod:`specconv.drafters`),
:mod:`.wrappers` (one drafting step as a batched pure function), :mod:`.onnx_export`
(``torch.onnx.export`` + the "prepare for TensorRT" pass), :mod:`.parity`,
:mod:`.onnx_dir` (``specconv export onnx``), :mod:`.ort_drafter` (ONNX Runtime as the
drafter of the acceptance loop), :mod:`.engine` (``specconv build-engine``).

Importing this package imports nothing heavy; its modules import torch / onnx.
"""
