"""ONNX export and TensorRT engine builds of the reference drafters (docs/engines.md).

Modules: :mod:`.wrappers` (a reference drafter's one drafting step,
``specconv.drafters.Drafter.step``, with named outputs for torch.export), :mod:`.onnx_export`
(``torch.onnx.export`` + the "prepare for TensorRT" pass), :mod:`.parity`,
:mod:`.onnx_dir` (``specconv export onnx``), :mod:`.ort_drafter` (ONNX Runtime as the
drafter of the acceptance loop), :mod:`.engine` (``specconv build-engine``).

Importing this package imports nothing heavy; its modules import torch / onnx.
"""
