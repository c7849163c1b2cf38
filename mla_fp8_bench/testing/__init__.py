"""Test machinery: injected faults and the faulty stand-ins that prove the accuracy checks catch them.
Nothing on the measuring path imports this package."""
