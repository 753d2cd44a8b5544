"""Evaluation tools around the library: benchmark, baselines, prompt sets, figures, judge, diagnosis and perf.

The library (`core/*.py`) never imports this package; these tools import the library.
"""
