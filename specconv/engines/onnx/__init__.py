"""ONNX Runtime: ``specconv export onnx`` (one drafting step as standard ONNX, parity-checked with
ONNX Runtime: :mod:`.export`) and ``validate --onnx`` (the exported step drafting in the loop:
:mod:`.ort_drafter`). docs/engines.md.
"""

from __future__ import annotations

from ...outdir import OutputKind, files_listed
from ..base import CompareRule, Engine, Runtime
from .export import META_NAME, OnnxExporter

ENGINE = Engine(
    key="onnx", display="ONNX Runtime", extra="onnx", order=40,
    output_kinds={"onnx": OutputKind("ONNX export", META_NAME, "specconv-onnx-drafter", files_listed)},
    export=OnnxExporter(),
    runtime=Runtime("ONNX Runtime", "specconv.engines.onnx.ort_drafter:load", key="onnx", side="onnx",
                    preflight="specconv.engines.onnx.ort_drafter:preflight", rule=CompareRule(identical_tokens=True),
                    help="Also run the loop with this exported graph (ONNX Runtime) as the drafter (excludes "
                         "--backend vllm, --engine)."),
)
