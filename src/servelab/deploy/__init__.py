"""servelab.deploy"""
