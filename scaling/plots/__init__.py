"""Figures drawn from analysis tables (matplotlib, no pyplot state): see figures.py."""
