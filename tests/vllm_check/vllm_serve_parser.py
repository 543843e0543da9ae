"""Run in the vLLM 0.33 loader venv (standard library and vLLM only): parse ``vllm serve``
command lines with vLLM's own argument parser, built as ``vllm/entrypoints/cli/main.py`` and
``cli/serve.py`` build it (a ``FlexibleArgumentParser`` whose ``serve`` subparser gets
``vllm/entrypoints/common/cli_args.py`` ``make_arg_parser``), then ``validate_parsed_serve_args``.

``python vllm_serve_parser.py LINES.json`` with a JSON list of argvs (each starting ``vllm
serve``) prints one JSON list: per argv ``{"model_tag", "speculative_config"}`` (vLLM's own
parse of ``--speculative-config``) or ``{"error"}``.
"""

from __future__ import annotations

import json
import os
import sys


def main(path: str) -> None:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # no accelerator: vLLM's CPU platform
    from vllm.entrypoints.common.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm")
    make_arg_parser(parser.add_subparsers(dest="subparser").add_parser("serve"))
    out = []
    with open(path, encoding="utf-8") as f:
        lines = json.load(f)
    for argv in lines:
        try:
            if argv[0] != "vllm":
                raise ValueError(f"not a vllm command: {argv[0]!r}")
            args = parser.parse_args(argv[1:])
            validate_parsed_serve_args(args)
            out.append({"subparser": args.subparser, "model_tag": args.model_tag,
                        "speculative_config": args.speculative_config})
        except BaseException as e:  # noqa: BLE001 - argparse exits with SystemExit on a bad line
            out.append({"error": f"{type(e).__name__}: {e}"})
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
