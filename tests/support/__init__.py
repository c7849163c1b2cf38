"""Test machinery: injected faults and the faulty stand-ins that prove the accuracy checks catch them.
Tests import it as ``support`` (pytest puts ``tests/`` on ``sys.path``); the library never does."""
