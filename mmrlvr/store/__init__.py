"""mmrlvr.store"""
