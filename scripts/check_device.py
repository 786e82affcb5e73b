"""`minitx check-device` from a checkout: python scripts/check_device.py ARGS (see --help)."""
import _minitx

_minitx.run("check-device")
