"""What the policy trains on: example pools, SQL synthesis, pass-rate estimation, smoothing, export."""
