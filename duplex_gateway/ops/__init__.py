"""Operating the gateway: metrics, logs, per-session numbers, recordings and their replay."""
