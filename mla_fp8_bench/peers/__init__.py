"""Optional peers of the AITER path: FA3 and cuDNN backends, measured GPU ceilings, the profiler
cross-check. The core reaches them only through the backend registry's names and lazy imports;
their third-party packages come with ``pip install -e '.[peers]'``."""
