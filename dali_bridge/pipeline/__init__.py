"""Spec → plan, and the draws: the backend-neutral plan of op instances, the sample order and
per-sample random parameters (pure functions of their inputs), the window a first crop lets a decoder
read, and the loader's resume state."""
