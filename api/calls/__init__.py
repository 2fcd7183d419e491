"""Sending tool calls to the fleet and waiting for their answers: the dispatcher, its sending
thread, the watch over calls in flight, the runs pinned to one worker, and the fleet's tools."""
