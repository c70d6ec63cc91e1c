"""laggard"""
