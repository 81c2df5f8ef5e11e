"""Harness code shared by the test modules (no tests here): fakes, Hypothesis strategies, the live runner,
the stateful machines' universe of prompts. Test modules import from here, never from each other."""
