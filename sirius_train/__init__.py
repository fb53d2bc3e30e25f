"""Training (two-stage DAPO), inference (candidates, lifecycle, selection), evaluation and the CLI."""
