"""Fuzz targets for every parser of multisite and their runner (``make fuzz``, issue 28): see run.py."""
