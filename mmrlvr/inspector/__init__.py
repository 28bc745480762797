"""mmrlvr.inspector"""
