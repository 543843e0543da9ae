"""ONNX export and TensorRT engine builds of the reference drafters (docs/engines.md).

Modules: :mod:`.reference` (the one coupling point to :mod:`specconv.drafters`),
:mod:`.wrappers` (one drafting step as a batched pure function), :mod:`.onnx_export`
(``torch.onnx.export`` + the "prepare for TensorRT" pass), :mod:`.parity`,
:mod:`.onnx_dir` (``specconv export onnx``), :mod:`.engine` (``specconv build-engine``), and
the exported step as a drafter runtime of ``validate`` (:mod:`.graph_drafter`; ONNX Runtime:
:mod:`.ort_drafter`, TensorRT: :mod:`.engine_drafter`; registered in
:mod:`specconv.validate.runtimes`, which this package never imports).

Importing this package imports nothing heavy; its modules import torch / onnx.
"""
