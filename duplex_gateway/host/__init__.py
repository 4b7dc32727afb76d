"""The asyncio around one caller's session: its socket, engine link, outbox, resumption and lifetime."""
