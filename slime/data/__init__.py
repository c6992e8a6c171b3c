"""Prompt datasets: JSONL reading with exact-resume cursors, and the built-in arithmetic task."""
