"""servelab.sim"""
