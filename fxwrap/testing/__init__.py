"""fxwrap.testing: the conformance kit a vendor points at its target (imported by test code only)."""
