"""Reading a trace set back for people: one rank's nodes as a table (show) and two sets compared
(diff)."""
