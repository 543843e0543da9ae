"""Publishing a validated drafter directory to the Hugging Face Hub (:mod:`.payload`: what may be
pushed; :mod:`.push`: the commit; :mod:`.release`: convert → validate → push). docs/cli.md, docs/ci.md.
"""
