"""GEMM templates (the arena's own ``arena_blocked_gemm``) are chosen by timing under the
default ``templates="auto"``; the arena's tests run with them off unless they ask
(test_arena_templates.py), so that what a test counts never depends on the machine's load."""
import os

os.environ.setdefault("FXWRAP_TEMPLATES", "off")
