"""A conversation: the Agent, its options, limits and events, and where it and its tools run
(``place``)."""
