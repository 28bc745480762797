"""mmrlvr.models"""
