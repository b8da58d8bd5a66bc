"""servelab.analysis"""
