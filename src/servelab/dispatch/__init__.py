"""servelab.dispatch"""
