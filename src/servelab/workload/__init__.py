"""servelab.workload"""
