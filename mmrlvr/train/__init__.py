"""mmrlvr.train"""
