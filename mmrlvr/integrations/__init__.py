"""mmrlvr.integrations"""
