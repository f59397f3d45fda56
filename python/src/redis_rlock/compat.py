"""Placeholder, replaced below."""
class RLockCompat:  # noqa
    pass
