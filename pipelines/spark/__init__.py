"""Spark sessions, shipping the library, the driver's class archive, a local standalone cluster."""
