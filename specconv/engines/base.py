"""What an engine declares: :class:`Engine` and its optional capabilities, the options it adds to
the CLI (:class:`OptionSpec`) and the one flag → environment → default resolver of its binaries
and interpreters (:class:`Resolver`). Standard library only: the registry imports every engine's
declaration to build ``specconv --help`` (docs/architecture.md, "Adding an engine").
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInputError

if TYPE_CHECKING:
    from ..format import SpeculatorsDraftConfig
    from ..format.algorithms import Algorithm
    from ..outdir import OutputKind
    from ..verifier import Verifier

__all__ = ["Capability", "CompareRule", "Engine", "Exporter", "LoadCheck", "OptionSpec", "PushVerdict", "Resolver",
           "Runtime", "Serve", "Surface"]


@dataclass(frozen=True)
class OptionSpec:
    """One command-line option, as plain data (``specconv/cli/`` turns it into a click option).

    Attributes:
        flags: the option's names, e.g. ``("--llama-server",)``; two names separated by ``/``
            in one entry make an on/off pair (``"--check/--no-check"``).
        dest: the keyword the command's callback and the capability receive.
        help: the help text.
        kind: ``flag`` | ``text`` | ``path`` (a file) | ``dir`` | ``any_path`` | ``int`` | ``float`` | ``choice``.
        choices: the values of a ``choice``.
        default: the value when the option is absent.
        envvar: an environment variable read when the option is absent.
        metavar: the value's name in the help.
        multiple: repeatable (the value is a tuple).
        flag_value: the value of a bare option that also takes one (``--build-engine`` alone = ``always``).
        minimum, maximum: the range of an ``int`` / ``float`` accepted (None: unbounded).
        show_default: print the default in the help.
    """

    flags: tuple[str, ...]
    dest: str
    help: str
    kind: str = "text"
    choices: tuple[str, ...] = ()
    default: Any = None
    envvar: str | None = None
    metavar: str | None = None
    multiple: bool = False
    flag_value: Any = None
    minimum: float | None = None
    maximum: float | None = None
    show_default: bool = False

    @property
    def name(self) -> str:
        """The first flag (what messages call the option)."""
        return self.flags[0].split("/")[0]


@dataclass(frozen=True)
class Surface:
    """Where a capability shows on the command line, by the names users know.

    Attributes:
        command: the command that runs it (``("export", "onnx")``, ``("build-engine",)``), or ().
        flag: the ``validate`` / ``release`` option that turns it on (``--vllm-load-check``,
            ``--export-gguf``), or the ``--backend`` value of a serving engine.
        options: the options it takes (beyond the shared ones of its command).
        help: the command's or the flag's help text.
    """

    command: tuple[str, ...] = ()
    flag: OptionSpec | None = None
    options: tuple[OptionSpec, ...] = ()
    help: str = ""


class Capability:
    """Base of every capability: the engine it belongs to is set when the engine is registered."""

    engine: Engine

    def bind(self, engine: Engine) -> None:
        """Set :attr:`engine` (called once by :class:`Engine`)."""
        object.__setattr__(self, "engine", engine)


@dataclass(frozen=True)
class Resolver:
    """The one rule for a binary or interpreter an engine runs: the flag's value, else the
    environment variable, else the default (a repo venv, a ``make`` build), else None.

    Attributes:
        what: what messages call it (``llama-server``, ``vLLM interpreter``).
        flag: the option naming it (``--llama-server``).
        env: the environment variable naming it.
        default: returns the default path when one exists here (checked with ``is_file``).
        code: the error slug when it is needed and missing.
        hint: how to get it (``make llama-cpp``).
    """

    what: str
    flag: str
    env: str
    default: Callable[[], Path | None]
    code: str
    hint: str

    def find(self, explicit: str | os.PathLike[str] | None = None) -> Path | None:
        """The path by the rule, or None when nothing names one and no default exists.

        Raises:
            InvalidInputError: ``code`` (exit 3): the flag or the variable names no existing file.
        """
        named = explicit or os.environ.get(self.env)
        if named:
            p = Path(named).expanduser()
            if not p.is_file():
                raise InvalidInputError(f"{self.what} {p} does not exist", code=self.code,
                                        hint=f"pass {self.flag} PATH or set ${self.env} to an existing file")
            return p.absolute()  # a bare relative name would be looked up on PATH by a subprocess
        default = self.default()
        return default if default is not None and default.is_file() else None

    def require(self, explicit: str | os.PathLike[str] | None = None, why: str = "") -> Path:
        """:meth:`find`, refusing None.

        Raises:
            InvalidInputError: ``code`` (exit 3), naming the flag, the variable and :attr:`hint`.
        """
        p = self.find(explicit)
        if p is None:
            raise InvalidInputError(f"no {self.what}{': ' + why if why else ''}", code=self.code,
                                    hint=f"{self.hint}, or pass {self.flag} PATH / set ${self.env}")
        return p


@dataclass(frozen=True)
class Engine:
    """One consumer of Speculators drafters, registered once (docs/architecture.md, "Adding an engine").

    Attributes:
        key: the registry key (also the record's and the report's name for it).
        display: how messages, reports and cards name it.
        extra: the ``pip install 'specconv[EXTRA]'`` extra its capabilities need (None: none).
        facts: facts per algorithm, keyed by the algorithm's description
            (:class:`specconv.format.algorithms.Algorithm`); the engine's own type.
        options: options every surface of the engine shares (``--llama-server``).
        output_kinds: the directories it writes (``--overwrite`` may replace them):
            ``outdir`` kind key → :class:`specconv.outdir.OutputKind`.
        export, serve, load_check, runtime: its capabilities (None: it has not that one).
        order: listing order (built-ins first; then by key).
    """

    key: str
    display: str
    extra: str | None = None
    facts: Mapping[Algorithm, Any] = field(default_factory=dict)
    options: tuple[OptionSpec, ...] = ()
    output_kinds: Mapping[str, OutputKind] = field(default_factory=dict)
    export: Any = None
    serve: Serve | None = None
    load_check: LoadCheck | None = None
    runtime: Any = None
    order: int = 100

    def __post_init__(self) -> None:
        for cap in self.capabilities().values():
            cap.bind(self)

    def capabilities(self) -> dict[str, Capability]:
        """Capability name → capability, for those the engine has."""
        caps = {"export": self.export, "serve": self.serve, "load_check": self.load_check, "runtime": self.runtime}
        return {k: v for k, v in caps.items() if v is not None}

    def facts_for(self, alg: Algorithm) -> Any:
        """The engine's facts about ``alg``, or None when it has none (it cannot take that algorithm)."""
        return self.facts.get(alg)


@dataclass(frozen=True)
class CompareRule:
    """How a runtime's run must agree with the torch reference's run.

    Attributes:
        identical_tokens: greedy only — generated tokens identical, drafts different only at
            near ties (counted), τ equal when no near-tie difference occurred.
        tau_rel_tol: ``|τ_runtime − τ_torch| / τ_torch`` at most this (any temperature).
        kl: report top-1 agreement and KL(torch ‖ runtime) of the greedy drafts.
        near_tie_margin: a draft is a near tie below this torch top-1 − top-2 logit margin.
    """

    identical_tokens: bool = False
    tau_rel_tol: float | None = None
    kl: bool = False
    near_tie_margin: float = 1e-4

    def text(self) -> str:
        """The rule in words (``report[key]["rule"]``)."""
        parts = [f"greedy: tokens identical, drafts identical outside near-ties (torch top-1/top-2 margin < "
                 f"{self.near_tie_margin}), tau equal when no near-tie difference"] if self.identical_tokens else []
        parts += [f"tau within {self.tau_rel_tol:.0%} of the torch run"] if self.tau_rel_tol is not None else []
        return "; ".join(parts + (["top-1 agreement and KL reported"] if self.kl else []))


@dataclass(frozen=True)
class Runtime(Capability):
    """An engine's drafter runtime (``validate`` compares it with the torch reference on the same
    requests; the reference itself is ``specconv.validate.runtimes.TORCH``).

    Attributes:
        display: how reports and progress name it.
        loader: ``"module:function"`` called as ``load(drafter_dir, verifier, *, path, dtype,
            device, config)`` (``path``: the graph / engine or None; ``dtype``: the run dtype
            name; ``config``: the drafter's typed ``config.json`` as the run parsed it, or None).
        key: a compared runtime's CLI flag without dashes, report object and gate name.
        side: the key of the runtime's metrics inside ``report[key]`` (beside ``torch``).
        preflight: ``"module:function"`` called as ``preflight(path, drafter_dir, dtype)``
            before any model is loaded; raises the runtime's refusals (a missing extra: exit 2).
        rule: its pass rule against the torch reference (None: the reference itself).
        help: the help of its ``validate`` flag (``--<key> PATH``).
    """

    display: str
    loader: str
    key: str | None = None
    side: str | None = None
    preflight: str | None = None
    rule: CompareRule | None = None
    help: str = ""

    def load(self, drafter_dir: Path, verifier: Verifier, *, path: str | None, dtype: str,
             device: str, config: SpeculatorsDraftConfig | None = None) -> Any:
        """Load the drafter with this runtime (see :attr:`loader`)."""
        from ..format.algorithms import import_object

        return import_object(self.loader)(drafter_dir, verifier, path=path, dtype=dtype, device=device, config=config)


@dataclass(frozen=True)
class LoadCheck(Capability):
    """``validate --<engine>-load-check``: the engine's own loader run on the drafter in the engine's
    own interpreter (a standard-library runner that imports nothing from specconv).

    Attributes:
        flag: the on/off ``validate`` option (``--vllm-load-check``).
        python: the option naming its interpreter (``--vllm-loader-python``); its ``dest`` is the
            keyword the CLI passes.
        report_key: the report's key for the check's payload, ``<name>_load``
            (:data:`specconv.results.LOAD_SUFFIX`: ``vllm_load``); ``payload["ok"]`` is the verdict.
        runner: ``"module:function"`` called as ``run(drafter_dir, verifier_spec, python=)``;
            returns the payload.
        preflight: ``"module:function"`` called as ``preflight(drafter_dir, verifier_spec, python)``
            before any gate runs; raises the check's refusals (no interpreter: exit 3).
        gates_validation: a failed load also fails ``validation.passed`` (else only the exit status).
    """

    flag: OptionSpec
    python: OptionSpec
    report_key: str
    runner: str
    preflight: str | None = None
    gates_validation: bool = False

    def __post_init__(self) -> None:
        if not self.report_key.endswith("_load"):  # how the report finds a failed load (results.LOAD_SUFFIX)
            raise ValueError(f"a load check's report key ends with _load, not {self.report_key!r}")

    def refuse(self, drafter_dir: Path, verifier_spec: str, python: str | None) -> None:
        """Run :attr:`preflight` (nothing when it has none)."""
        if self.preflight:
            from ..format.algorithms import import_object

            import_object(self.preflight)(drafter_dir, verifier_spec, python)

    def run(self, drafter_dir: Path, verifier_spec: str, python: str | None) -> dict[str, Any]:
        """Run the loader on ``drafter_dir``; the payload (``ok``, ``errors``, the engine's versions)."""
        from ..format.algorithms import import_object

        return dict(import_object(self.runner)(drafter_dir, verifier_spec, python=python))


class Serve(Capability):
    """``validate --backend <backend>``: the drafter served by the engine, judged by validate's
    served driver (``specconv.validate.served``) in one of two ways:

    * :attr:`after_torch` False: the engine's own counters are G3 (τ, per position), G2 is the
      torch harness's (skipped), G4 compares the served greedy outputs with :meth:`reference`'s
      (else specconv's torch loop) — vLLM;
    * :attr:`after_torch` True: the torch gates run first, then :meth:`measure` serves the
      same token ids and G3 / G4 also judge the engine against the torch run — llama.cpp.

    Attributes:
        backend: the ``--backend`` value.
        help: its part of ``--backend``'s help.
        report_key: the report's key for :meth:`summary`'s section (``vllm_serve``).
        server_name: what G3's served-input checks call the server (``llama-server``).
        options: ``validate``'s plain options of this backend (``--vllm-python``); their values
            reach the capabilities as ``ValidateOptions.engine_options`` (dest → value) with
            :class:`Engine`'s own, and the report's ``options`` holds them.
        serving_options: the options folded into one typed object by :meth:`serve_options`
            (``--tensor-parallel-size``, ``--server-url``, ...: ``ValidateOptions.serve[key]``).
    """

    backend: str = ""
    help: str = ""
    report_key: str = ""
    server_name: str = ""
    after_torch: bool = False
    options: tuple[OptionSpec, ...] = ()
    serving_options: tuple[OptionSpec, ...] = ()

    def serve_options(self, values: Mapping[str, Any]) -> Any:
        """The engine's typed serving options from :attr:`serving_options`' values, or None."""
        return None

    def check_options(self, backend: str, typed: Any, given: Collection[str] = ()) -> None:
        """Refuse :meth:`serve_options`' result where it cannot work with ``backend`` (exit 2)."""

    def preflight(self, drafter_dir: Path, options: Any) -> Any:
        """Refusals before any model is loaded (exit 2 / 3); returns what :meth:`measure` needs."""
        return None

    def prepare(self, drafter_dir: Path, verifier: Verifier, options: Any, found: Any) -> Any:
        """Refusals that need the resolved verifier, before the torch gates run (``after_torch``);
        returns :meth:`measure`'s ``found`` (default: :meth:`preflight`'s)."""
        return found

    def measure(self, drafter_dir: Path, verifier: Verifier, rendered: list[tuple[str, list[int]]], options: Any,
                found: Any, torch_report: dict[str, Any]) -> dict[str, Any]:
        """Serve the drafter on the run's token ids (``rendered``: ``(prompt id, ids)``).

        Returns (``after_torch`` False) the served metrics: the counters' metric keys,
        ``requests`` (``prompt_id``, ``prompt_token_ids``, ``output_ids``), ``serving`` (``runner``,
        ``mode``), optional ``device`` / ``server``; (True) the report section, with ``tau``,
        ``tau_torch``, ``delta``, ``band``, ``lossless``, ``exact_match``, ``divergences`` and
        ``prompt_n`` (tokens the server evaluated, per request). Either way, with ``options.compare`` set,
        ``requests`` carry ``prompt_id``, ``output_ids`` and ``counts`` (that request's counter difference:
        :func:`specconv.engines.served.measure_each`). ``torch_report``: the torch gates' report so far
        (True only)."""
        raise NotImplementedError

    def summary(self, measured: dict[str, Any]) -> dict[str, Any]:
        """The report's :attr:`report_key` section of a served run (``after_torch`` False)."""
        return {}

    def runners(self, algorithm: Any) -> tuple[str, ...]:
        """The engine's model runners that draft ``algorithm`` as trained (() : any)."""
        return ()

    def after_acceptance(self, g3: Any, measured: dict[str, Any], options: Any) -> None:
        """Add the engine's own G3 errors (``g3``: the gate result, mutated)."""

    def reference(self, drafter_dir: Path, verifier: Verifier, rendered: list[tuple[str, list[int]]],
                  options: Any) -> tuple[list[list[int]], str] | None:
        """G4's non-speculative reference outputs and their source name, or None (the torch loop's)."""
        return None

    def engine_facts(self, measured: dict[str, Any]) -> dict[str, Any]:
        """What ran, for the comparison's row: ``{version, runner, ...}`` of :meth:`measure`'s result."""
        return {}


@dataclass(frozen=True)
class PushVerdict:
    """What ``push`` may do with one file of an engine's export (:meth:`Exporter.push_verdict`).

    Attributes:
        covered: a passed check of the engine recorded these very bytes (else the file is
            ``ungated_file`` unless ``--allow-unvalidated``).
        verifier_weights: the file redistributes the verifier's embedding / LM head (needs
            ``--allow-verifier-weights``).
        note: said after the verifier-weights refusal (why it is assumed).
        stays_local: never pushed unless asked for by name (the ONNX fp32 twin).
        label: what the verifier-weights refusal names (default: the file).
    """

    covered: bool
    verifier_weights: bool = False
    note: str = ""
    stays_local: bool = False
    label: str = ""


class Exporter(Capability):
    """An engine's ``export``: a directory in the engine's own format, written through the generic
    lifecycle of :func:`specconv.engines.exportdir.export` (the engine fills in :meth:`prepare`,
    :meth:`write`, :meth:`check`, :meth:`result`), checked by the engine, recorded under
    ``export.<record_key>``, gated by ``push``, printed in the card and run by ``release``.

    Attributes:
        kind: the :class:`specconv.outdir.OutputKind` key of its output dir (in ``Engine.output_kinds``).
        dir_name: the default output, ``DIR/<dir_name>``.
        dir_kind: the kind ``DIR/<dir_name>`` is judged as when ``--overwrite`` replaces the
            conversion holding it (None: :attr:`kind`).
        record_key: its key under ``export`` in ``specconv.json`` (None: not recorded there).
        meta_version: the ``format_version`` of its meta file this specconv reads.
        surface: its command (``export onnx``), options and the ``release`` flag that runs it.
        common: the shared export options it takes: ``output`` (``-o``), ``verifier``, ``overwrite``.
        release_key: its step's name and key in the ``release`` result.
        result_type: the command's :class:`specconv.results.StageResult` type.
        repo_option: ``push``'s (and ``release``'s) option naming the Hub repo its files are
            published to as a repo of their own, never with the Speculators repo (None: pushed with it).
        card_template: its card section's template in ``specconv/templates/`` (the values of
            :meth:`card_section` as ``section``).
    """

    kind: str = ""
    dir_name: str = ""
    dir_kind: str | None = None
    record_key: str | None = None
    meta_version: int = 1
    surface: Surface = Surface()
    common: tuple[str, ...] = ("output", "verifier", "overwrite")
    release_key: str = ""
    result_type: Any = None
    repo_option: OptionSpec | None = None
    card_template: str = ""

    @property
    def separate_repo(self) -> bool:
        """Whether its files are published as a repo of their own (:attr:`repo_option`)."""
        return self.repo_option is not None

    # ------------------------------------------------------------------- the export
    def run(self, drafter_dir: Path, out: Path | None, **options: Any) -> Any:
        """The whole export (default: the generic lifecycle); returns :attr:`result_type`."""
        from .exportdir import export

        return export(self, drafter_dir, out, **options)

    def check_options(self, options: Mapping[str, Any]) -> None:
        """Refuse inconsistent options (exit 2) before anything is read."""

    def prepare(self, job: Any) -> None:
        """Every refusal and the plan, before anything is written (``job``: an
        :class:`specconv.engines.exportdir.ExportJob`; keep what :meth:`write` needs in ``job.state``)."""

    def write(self, job: Any, tmp: Path) -> dict[str, Any]:
        """Write the files into ``tmp``; return the meta file's engine keys."""
        raise NotImplementedError

    def check(self, job: Any, tmp: Path, meta: dict[str, Any]) -> dict[str, Any] | None:
        """The engine's own check of the written files (raise ``GateFailedError`` to refuse them);
        returns keys to add to the meta, or None."""
        return None

    def result(self, job: Any, meta: dict[str, Any]) -> dict[str, Any]:
        """The command's result and (with ``output`` relative) the ``export.<key>`` record."""
        return {"output": str(job.out_dir), **meta}

    def record_value(self, job: Any, result: dict[str, Any], previous: dict[str, Any] | None) -> dict[str, Any]:
        """What ``export.<record_key>`` becomes (``previous``: what it holds now)."""
        return result

    # ------------------------------------------------------------------------ push
    def owns(self, d: Path, rec: Any, rel: str) -> bool:
        """Whether ``rel`` (a path in drafter dir ``d``) is one of this export's files."""
        return rel.startswith(self.dir_name + "/")

    def push_verdict(self, d: Path, rec: Any, rel: str) -> PushVerdict:
        """Whether push may publish ``rel`` (one of :meth:`owns`' files) with the drafter."""
        return PushVerdict(covered=False)

    def holds_verifier_weights(self, d: Path, rec: Any, rels: list[str]) -> bool:
        """Whether this export's files among ``rels`` (:meth:`owns`' files of drafter dir ``d``)
        embed the verifier's embedding / LM head, by the rule :meth:`push_verdict` applies."""
        return False

    def repo_files(self, d: Path, rec: Any, repo_id: str) -> tuple[Path, Mapping[str, str]]:
        """A :attr:`separate_repo` export's dir in drafter dir ``d`` and the sha256 its check
        recorded per file name, for the repo ``repo_id`` (raise ``GateFailedError`` to refuse)."""
        raise NotImplementedError

    def repo_card(self, d: Path, rec: Any, repo_id: str, speculators_repo: str) -> str:
        """A :attr:`separate_repo` export's README.md, published as ``repo_id`` beside ``speculators_repo``."""
        raise NotImplementedError

    # ------------------------------------------------------------------------ card
    def card_section(self, d: Path, rec: Any, files: Any, draft_repo: str | None, *, verifier: str,
                     separate_repo: str | None = None) -> dict[str, Any] | None:
        """The values of the card's section for this export (rendered by :attr:`card_template`),
        or None for no section. ``files``: what the card's repo holds (a
        :class:`specconv.engines.card.CardFiles`); ``draft_repo``: the Hub repo, None for the local
        card; ``verifier``: the verifier the drafter names; ``separate_repo``: the repo a
        :attr:`separate_repo` export is pushed to (None: not pushed, or the local card)."""
        return None

    def card_rows(self, files: Any) -> list[tuple[str, str]]:
        """``(path, kind)`` rows of the card's Engines table among ``files`` (paths in the repo)."""
        return []

    def local_files(self, d: Path) -> list[str]:
        """The files of this export in drafter dir ``d`` that its local card lists (relative paths)."""
        return []

    def section_files(self, d: Path, rec: Any) -> list[str]:
        """The files of drafter dir ``d`` its card section presents (the local card's
        verifier-weights notice weighs them with :meth:`local_files`)."""
        return []

    # ---------------------------------------------------------------------- release
    def release_preflight(self, options: Mapping[str, Any], value: Any) -> None:
        """``release``'s refusals before anything is converted (``value``: its flag's)."""

    def before_reconvert(self, drafter: Path, work: Path) -> None:
        """Called before ``release`` converts into ``drafter`` again (keep an export for re-use)."""

    def release_step(self, drafter: Path, work: Path, options: Mapping[str, Any], value: Any) -> dict[str, Any]:
        """``release``'s step: export the validated drafter; returns the step's summary."""
        raise NotImplementedError


def served_algorithms(facts_attr: str) -> str:
    """``"DFlash / DSpark / …"``: the display names of the algorithms whose ``facts_attr`` facts
    (``sglang``, ``llamacpp``) carry no refusal, for help texts."""
    from ..format.algorithms import ALGORITHMS

    return " / ".join(a.display_name for a in ALGORITHMS.values() if not getattr(a, facts_attr).refusal)
