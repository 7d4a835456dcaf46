"""Shared gateway state: dedicated-slot leases and what the policies read (see base.py)."""
