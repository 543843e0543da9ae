"""Golden behaviour files: what specconv prints and writes for every fixture and bad input.

``capture.py`` recomputes every case and writes (or, with ``--check``, compares with)
``data/<group>/<case>.json``; ``tests/structure/test_golden_behaviour.py`` runs the same comparison
inside pytest. See ``capture.py`` for the cases and how to regenerate.
"""
