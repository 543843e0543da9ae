"""Exception classes carrying the project-wide exit codes; :data:`EXIT_CODES` is the one table
(``specconv --help`` prints it; tests check README.md and docs/cli.md list every code).
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INVALID_INPUT = 3
EXIT_GATE_FAILED = 4
EXIT_HUB_AUTH = 5
EXIT_HUB_CONFLICT = 6
EXIT_TRANSIENT = 7
EXIT_POST_PUBLISH = 8
EXIT_REMOTE_NOT_FOUND = 9
#: ``--dry-run --detailed-exitcode`` (push, release) when something would change (not an error)
EXIT_WOULD_CHANGE = 10
#: exit status after Ctrl-C (128 + SIGINT, the shell convention)
EXIT_INTERRUPTED = 130

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "ok",
    EXIT_USAGE: "usage error",
    EXIT_INVALID_INPUT: "invalid or unsupported input, or an output that cannot be written",
    EXIT_GATE_FAILED: "a validation gate failed",
    EXIT_HUB_AUTH: "Hub authentication failed",
    EXIT_HUB_CONFLICT: "Hub conflict",
    EXIT_TRANSIENT: "transient remote failure after retries",
    EXIT_POST_PUBLISH: "post-publish verification failed",
    EXIT_REMOTE_NOT_FOUND: "remote repo or revision not found",
    EXIT_WOULD_CHANGE: "dry-run would change",
    EXIT_INTERRUPTED: "interrupted",
}


class SpecconvError(Exception):
    """Base class: ``exit_code`` the process exit status, ``code`` a stable slug; ``result``, when set,
    the stage's typed result the CLI prints instead of the error object."""

    exit_code: int = EXIT_INVALID_INPUT
    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None, hint: str | None = None, result=None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.hint = hint
        self.result = result

    def to_dict(self) -> dict:
        d = {"error": self.code, "message": self.message, "exit_code": self.exit_code}
        if self.hint:
            d["hint"] = self.hint
        return d


class UsageError(SpecconvError):
    """Flags or arguments that cannot work together (exit 2)."""

    exit_code = EXIT_USAGE
    code = "usage"


class InvalidInputError(SpecconvError):
    """The input checkpoint, verifier or file is malformed or inconsistent (exit 3)."""

    exit_code = EXIT_INVALID_INPUT
    code = "invalid_input"


class UnsupportedFormatError(InvalidInputError):
    """A recognised but unsupported source format, or an unknown one (``format_id``) (exit 3)."""

    code = "unsupported_format"

    def __init__(self, message: str, *, format_id: str | None = None, **kw):
        super().__init__(message, **kw)
        self.format_id = format_id


class CastOverflowError(InvalidInputError):
    """A ``--dtype`` cast would turn finite source values into ±inf (exit 3; never ``--allow-nonfinite``)."""

    code = "cast_overflow"


class GateFailedError(SpecconvError):
    """A validation gate failed (exit 4); ``result``: the report (which carries error, exit_code, message)."""

    exit_code = EXIT_GATE_FAILED
    code = "gate_failed"


class HubAuthError(SpecconvError):
    exit_code = EXIT_HUB_AUTH
    code = "hub_auth"


class HubConflictError(SpecconvError):
    exit_code = EXIT_HUB_CONFLICT
    code = "hub_conflict"


class TransientRemoteError(SpecconvError):
    exit_code = EXIT_TRANSIENT
    code = "transient"


class PostPublishError(SpecconvError):
    exit_code = EXIT_POST_PUBLISH
    code = "post_publish"


class RemoteNotFoundError(SpecconvError):
    """A Hub repo or revision does not exist (or is private and not visible) (exit 9)."""

    exit_code = EXIT_REMOTE_NOT_FOUND
    code = "remote_not_found"
