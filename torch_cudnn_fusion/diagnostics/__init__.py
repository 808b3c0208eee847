"""What ran and why: fusion_report / explain, the engine candidates of a layer, and plan files."""
