"""The gateway's one vocabulary: frames, audio formats, client commands, server events, session settings, errors.

Every layer speaks these types, and this package imports nothing from the rest of the gateway, so no pure
layer has to import an I/O module to name what it handles.
"""
