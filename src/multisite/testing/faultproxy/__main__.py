"""``python -m multisite.testing.faultproxy``: see ``control.py``."""

from .control import main

main()
