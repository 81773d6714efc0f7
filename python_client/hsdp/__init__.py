"""hsdp: the Python client of hsdpd."""
from hsdp._hsdp import HsdpError  # noqa: F401
