"""servelab.engines"""
