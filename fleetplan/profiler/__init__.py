"""Latency profiles: the analytic estimator, the bundled fixture builder, and the profile-set tables."""
