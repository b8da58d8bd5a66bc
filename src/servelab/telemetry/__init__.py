"""servelab.telemetry"""
