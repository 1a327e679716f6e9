"""Shared test configuration.

Property tests run derandomized: the same examples on every run and machine, so CI never turns
red on a case no one can replay. New random exploration is a deliberate, local act:
``pytest --hypothesis-profile=explore``.
"""
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("ci")
