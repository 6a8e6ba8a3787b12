# Overwritten per test by the `fake_trtllm` fixture (TEST DOUBLE).
__version__ = "1.3.0rc27"
FAIL_LOAD = False
