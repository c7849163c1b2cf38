"""Pure-Python ports of AITER's persistent-scheduling (PS) host-side helpers (see :mod:`.planner`)."""
