"""The model client: one chat turn at a time, its request body and the answer as toolq keeps it."""
