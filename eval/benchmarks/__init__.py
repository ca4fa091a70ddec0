"""Human-judgment benchmarks: one module each, one registry."""
