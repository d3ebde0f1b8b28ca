"""The program representation every engine reads: rank-independent columnar programs, the roles
their communication speaks in, and the node and collective enums."""
