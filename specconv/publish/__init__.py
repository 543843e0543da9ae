"""Publishing a validated drafter directory to the Hugging Face Hub.

* :mod:`.payload` — what may be pushed (the validated files, gated by ``specconv.json``)
  and the derived files (card, record projection, ``.gitattributes``, manifest);
* :mod:`.card` — the model card from ``specconv/templates/model_card.md.j2``;
* :mod:`.push` — plan against the remote tree, one atomic commit, tags, PRs, verification;
* :mod:`.release` — convert → validate → push for CI.

All Hub I/O goes through :mod:`specconv.hub`. See ``docs/cli.md`` and ``docs/ci.md``.
"""
