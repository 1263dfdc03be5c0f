"""Whole-dataset jobs built on the layers below: convert, verify, split, and the demo."""
