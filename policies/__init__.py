"""Routing policies: pure functions from (request context, state snapshot) to a Decision."""
