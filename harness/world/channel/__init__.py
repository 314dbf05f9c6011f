"""The driver's authenticated control channels to its ranks: the wire format, the server
workers connect to, and the links a world keeps to each rank."""
