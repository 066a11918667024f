"""Checking a port: run a spec on twinstep's backends (their public functions), a generated snippet,
or the native objects (native.py) over one exact gradient stream, and compare the traces."""
