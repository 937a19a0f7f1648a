"""A reference PrivateUse1 device ("npu") and its fxwrap target: see device.py and target.py."""
