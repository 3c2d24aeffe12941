"""Pure pandas: a run's figures (run_metrics) and a sweep's tables (scaling_tables). No Ray, no torch, no files."""
