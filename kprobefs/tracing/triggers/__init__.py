"""What runs when an event fires: its filter (filter), its triggers (trigger: the
commands and the engine; trigger_actions: what a trigger does to its trace array) and
histograms (hist: the table, the hit and the hist file; hist_command: parsing and
registering a hist command)."""
