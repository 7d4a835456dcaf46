"""Dedicated pools found by DNS: their replicas' addresses, re-read while traffic runs, put on
slot sets every gateway replica agrees on (router/fleet/membership.py)."""
