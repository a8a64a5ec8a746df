"""Reading a model server's answers, whole or streamed, for ``lmi invoke`` and ``lmi bench`` alike.

``framing`` turns bytes into messages (whole JSON, JSON lines, server-sent events, cut anywhere);
``messages`` reads each API's messages into an ``Answer`` (tokens, text, counts, finish reason); ``reader``
puts them together, fed chunk by chunk. One error rule: an answer failed when its HTTP status is not 2xx,
when a message reports an error (``messages.error_message``), when a message is not JSON or not UTF-8, or
when a stream ends inside a line.
"""
