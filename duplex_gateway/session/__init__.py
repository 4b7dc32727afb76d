"""The conversation state of one caller, as a sans-I/O state machine."""
